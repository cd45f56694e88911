"""Child process of tests/kernels/test_kernels.py: the kernels library's ops run the repository's promoted operators on
the Triton interpreter, which must be selected before triton is first imported, so each check runs here as
``TRITON_INTERPRET=1 python kernels_child.py CHECK`` and prints one JSON line of figures for the test to assert on.

    fake     every block's op and backward op on its first smoke shape, real and fake: shapes and dtypes
    equal    op forward and gradients against the operator's own run (rmsnorm, situ, both loss blocks, kda)
    opcheck  torch.library.opcheck (schema, autograd registration, fake tensors, AOT dispatch with dynamic shapes)
    compile  torch.compile(fullgraph=True) of RMSNorm, SiTUMLP and LinearCrossEntropyLoss against eager
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import workbench.kernels as wk
from workbench.blocks import get_block

OPERATORS = Path(__file__).resolve().parents[2] / "operators"
OPCHECK_BLOCKS = ("rmsnorm", "situ", "vocab_blockwise_ce", "moe_router", "kda")


def _tensors(outputs) -> list[torch.Tensor]:
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def _meta(tensors) -> list[list]:
    return [[list(t.shape), str(t.dtype)] for t in tensors]


def _inputs(block: str, dtype: torch.dtype = torch.float32) -> dict:
    spec = get_block(block)
    return spec.make_inputs(spec.shapes["smoke"][0], dtype, 0, "cpu")


def _grads_like(outputs: list[torch.Tensor], seed: int) -> list[torch.Tensor | None]:
    """A fixed random upstream gradient per floating output, None for the discrete ones."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=g).to(o.dtype) if o.is_floating_point() else None for o in outputs]


def check_fake() -> dict:
    """{block: {"real": [[shape, dtype]...], "fake": ..., "real_grads": ..., "fake_grads": ...}}."""
    found = {}
    for block, op in wk.OPS.items():
        args = list(_inputs(block).values())
        real = _tensors(op(*args))
        grads = _grads_like(real, 0)
        needs = [True] * len(op.spec.grad_inputs)
        real_grads = op.backward_op(grads, needs, *args)
        with FakeTensorMode() as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake_grads_in = [mode.from_tensor(g) if g is not None else None for g in grads]
            fake = _tensors(op(*fake_args))
            fake_grads = op.backward_op(fake_grads_in, needs, *fake_args)
        found[block] = {"real": _meta(real), "fake": _meta(fake), "real_grads": _meta(real_grads),
                        "fake_grads": _meta(fake_grads)}
    return found


def check_equal() -> dict:
    """{block: {"forward": [max |op - run| per output], "grads": {input: max |op - run|}, "bitwise": bool}}."""
    found = {}
    for block in ("rmsnorm", "situ", "vocab_blockwise_ce", "seq_chunked_ce", "kda"):
        op, spec = wk.OPS[block], get_block(block)
        results = {}
        for via in ("op", "run"):
            args = {k: v.detach().clone().requires_grad_(k in spec.grad_inputs and v.is_floating_point())
                    if isinstance(v, torch.Tensor) else v for k, v in _inputs(block).items()}
            outputs = _tensors((op if via == "op" else op.operator().run)(*args.values()))
            pairs = [(o, g) for o, g in zip(outputs, _grads_like(outputs, 1), strict=True) if g is not None]
            leaves = {k: v for k, v in args.items() if isinstance(v, torch.Tensor) and v.requires_grad}
            grads = torch.autograd.grad([o for o, _ in pairs], list(leaves.values()), [g for _, g in pairs])
            results[via] = ([o.detach() for o in outputs], dict(zip(leaves, grads, strict=True)))
        (out_op, grads_op), (out_run, grads_run) = results["op"], results["run"]
        found[block] = {
            "forward": [float((a.double() - b.double()).abs().max()) for a, b in zip(out_op, out_run, strict=True)],
            "grads": {k: float((grads_op[k].double() - grads_run[k].double()).abs().max()) for k in grads_run},
            "bitwise": all(torch.equal(a, b) for a, b in zip(out_op, out_run, strict=True))
            and all(torch.equal(grads_op[k], grads_run[k]) for k in grads_run),
            "operator": Path(op.operator_path()).name}
    return found


def check_opcheck() -> dict:
    """{block: {test: "SUCCESS" | why}} of torch.library.opcheck on the first smoke shape, gradients requested."""
    found = {}
    for block in OPCHECK_BLOCKS:
        spec = get_block(block)
        args = [v.requires_grad_(k in spec.grad_inputs) if isinstance(v, torch.Tensor) else v
                for k, v in _inputs(block).items()]
        found[block] = {test: str(result) for test, result in
                        torch.library.opcheck(wk.OPS[block].op.default, tuple(args), raise_exception=False).items()}
    return found


def _compare_compiled(layer: torch.nn.Module, inputs: list[torch.Tensor], backend: str) -> dict:
    """Eager and compiled runs of ``layer`` on the same inputs: max |difference| of the output and of every
    gradient (inputs and parameters), and whether all are bitwise equal."""
    runs = []
    for fn in (layer, torch.compile(layer, fullgraph=True, backend=backend)):
        xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
        layer.zero_grad(set_to_none=True)
        out = fn(*xs)
        out.backward(torch.ones_like(out))
        grads = [x.grad for x in xs if x.is_floating_point()] + [p.grad for p in layer.parameters()]
        runs.append([out.detach(), *grads])
    diffs = [float((a.double() - b.double()).abs().max()) for a, b in zip(*runs, strict=True)]
    return {"diffs": diffs, "bitwise": all(torch.equal(a, b) for a, b in zip(*runs, strict=True))}


def check_compile() -> dict:
    """{"<layer>": {"diffs", "bitwise"}, "graph_breaks": n} with inductor (C++ on CPU)."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 64, generator=g)
    hidden, weight = torch.randn(3, 5, 32, generator=g), torch.randn(64, 32, generator=g) / 32 ** 0.5
    target = torch.randint(0, 64, (3, 5), generator=g)
    target[0, 0] = -100
    found = {
        "RMSNorm": _compare_compiled(wk.RMSNorm(64, eps=1e-6), [x], "inductor"),
        "SiTUMLP": _compare_compiled(wk.SiTUMLP(64, 32), [x], "inductor"),
        "LinearCrossEntropyLoss": _compare_compiled(wk.LinearCrossEntropyLoss(), [hidden, weight, target],
                                                    "inductor"),
    }
    found["graph_breaks"] = sum(counters["graph_break"].values())
    return found


CHECKS = {"fake": check_fake, "equal": check_equal, "opcheck": check_opcheck, "compile": check_compile}


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    wk.set_operators_dir(OPERATORS)
    print(json.dumps(CHECKS[sys.argv[1]]()))
