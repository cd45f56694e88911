"""Operator files with a known defect, to measure what a replay catches (tests/replay, bench/replay_sensitivity.py):
each wraps the block's reference, so it is exact but for the defect. GRAD_SCALED scales the gradient of one input
(``index``: its position in run's signature) by ``factor``; ROUNDED_UP rounds the first output up to ``bits``
mantissa bits (a biased rounding); FLOAT64 is exact and only rounds differently (computes in float64); DELAYED is
exact and only slow (sleeps ``ms`` milliseconds a call: one slow rank, for what its trace shows)."""

from __future__ import annotations

from pathlib import Path

HEADER = '''import torch
from workbench.blocks import get_block

BLOCK = "{block}"
_spec = get_block(BLOCK)
_reference = _spec.training_reference or _spec.reference
'''

GRAD_SCALED = HEADER + '''

class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient scaled by {factor} on the way back."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * {factor}


def run(*args):
    args = list(args)
    args[{index}] = _ScaleGrad.apply(args[{index}])
    return _reference(*args)
'''

ROUNDED_UP = HEADER + '''

class _RoundUp(torch.autograd.Function):
    """The first output rounded up (toward +inf) to {bits} mantissa bits: a biased rounding; gradient untouched."""

    @staticmethod
    def forward(ctx, x):
        mantissa, exponent = torch.frexp(x)
        return torch.ldexp(torch.ceil(mantissa * 2.0 ** {bits}) / 2.0 ** {bits}, exponent)

    @staticmethod
    def backward(ctx, grad):
        return grad


def run(*args):
    out = _reference(*args)
    if isinstance(out, tuple):
        return (_RoundUp.apply(out[0]),) + tuple(out[1:])
    return _RoundUp.apply(out)
'''

FLOAT64 = HEADER + '''

def run(*args):
    """Exact, rounded differently: computed in float64, each output rounded once to its dtype."""
    wide = [a.double() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
    out = _reference(*wide)
    outs = out if isinstance(out, tuple) else (out,)
    dtypes = [a.dtype for a in args if torch.is_tensor(a) and a.is_floating_point()]
    back = tuple(o.to(dtypes[0]) if o.is_floating_point() and o.dtype == torch.float64 else o for o in outs)
    return back if isinstance(out, tuple) else back[0]
'''

DELAYED = HEADER + '''
import time


def run(*args):
    """The reference, {ms} ms late."""
    time.sleep({ms} / 1000)
    return _reference(*args)
'''


def write_op(folder: Path, name: str, template: str, **fields) -> Path:
    """``template`` filled with block=..., and its fields, written to folder/name.py."""
    path = folder / f"{name}.py"
    path.write_text(template.format(**fields))
    return path
