"""What of a model's forward still runs in torch: every op of one forward pass, seen through a TorchDispatchMode, with
its modelled FLOPs and bytes, charged to the innermost module that ran it.

    torch_share(shipped, patched, ids) -> {"flops_share", "bytes_share", "flops_torch", "bytes_torch",
                                           "flops_total", "bytes_total", "ported_calls", "left": [...]}

``flops_total`` and ``bytes_total`` are the shipped model's compute outside plain projections: every op but those of
nn.Linear and nn.Embedding modules (whose weights a port keeps as GEMMs and gathers) and but a GEMM one of whose
operands is a whole parameter of the model (a weight a module holds outside an nn.Linear, as Inkling2's relative
logits' projection rel_logits_proj.proj; a slice of one, as an expert's of stacked experts, is a grouped GEMM's and
counts). ``flops_torch`` and ``bytes_torch`` are what of the patched model's forward still runs as torch ops there
(its workbench::<block> ops run the ported kernels, opaque to the mode); the shares are their ratios (0: every such
op is a ported kernel). ``left`` lists the patched model's torch compute by module class (the example path, FLOPs,
bytes, its heaviest ops), most FLOPs first.

Modelled, not measured: an op's FLOPs are torch.utils.flop_counter's formula where it has one (mm, bmm, addmm,
convolutions, the fused attentions), two per multiply-add of CPU's fused attention, else one per element of its
largest tensor (an elementwise op's output, a reduction's input); its bytes are its tensor inputs' and outputs' sizes
(the memory traffic of an unfused op). View ops (views, expands, transposes; _unsafe_view, the alias a matmul's
reshape returns) and ops on no tensor (dtype promotion) compute and move nothing and are not counted. The figures are
the tiny instance's: its widths and lengths, not the published config's.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

PLAIN = (nn.Linear, nn.Embedding)
"""Modules whose ops are plain projections (GEMMs with a weight) and gathers: outside the figure."""
PORTED = ("workbench",)
"""The op namespaces that are ported kernels."""
GEMMS = {torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.addmm, torch.ops.aten.baddbmm}
"""The GEMMs a whole parameter as an operand makes plain projections."""
ALIASING = {torch.ops.aten._unsafe_view}
"""Ops that alias their input without being flagged as views (a reshape's result torch does not track as one)."""


def _cpu_attention_flops(query, key, value, *args, **kwargs) -> int:
    """aten._scaled_dot_product_flash_attention_for_cpu: q k^T and p v, two FLOPs a multiply-add."""
    *batch, lq, d = query.shape
    lk, dv = key.shape[-2], value.shape[-1]
    return 2 * int(torch.Size(batch).numel()) * lq * lk * (d + dv)


FORMULAS = {**{packet: formula for packet, formula in flop_registry.items() if hasattr(packet, "default")},
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops}


def op_flops(func, args, kwargs, out) -> int:
    """The op's modelled FLOPs (the module's docstring)."""
    formula = FORMULAS.get(func.overloadpacket)
    if formula is not None:
        return int(formula(*args, **kwargs, out_val=out))
    return max((t.numel() for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)), default=0)


def op_bytes(args, kwargs, out) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor))


class ForwardTally(TorchDispatchMode):
    """Charges each op run under it to the innermost module of ``model`` running (forward hooks keep the stack):
    ``torch[(class, path)]`` a Counter of flops, bytes and op names; ``ported`` a Counter of ported ops' calls."""

    def __init__(self, model: nn.Module, ported: tuple[str, ...] = PORTED):
        super().__init__()
        self.ported_namespaces = ported
        self.stack: list[tuple[str, nn.Module]] = [("", model)]
        self.torch: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
        self.ported: collections.Counter = collections.Counter()
        self.weights = {(p.untyped_storage().data_ptr(), p.numel()) for p in model.parameters()}
        self.hooks = [h for path, module in model.named_modules() if path for h in (
            module.register_forward_pre_hook(lambda m, a, path=path: self.stack.append((path, m))),
            module.register_forward_hook(self._leave, always_call=True))]

    def _leave(self, module, args, output) -> None:
        self.stack.pop()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        path, module = self.stack[-1]
        if func.namespace in self.ported_namespaces:
            self.ported[func.overloadpacket.__name__] += 1
        elif not (func.is_view or func.overloadpacket in ALIASING or isinstance(module, PLAIN)
                  or self._projection(func, args)) and \
                any(isinstance(t, torch.Tensor) for t in tree_leaves((args, kwargs, out))):
            tally = self.torch[(type(module).__name__, path)]
            tally["flops"] += op_flops(func, args, kwargs, out)
            tally["bytes"] += op_bytes(args, kwargs, out)
            tally[f"op:{func.overloadpacket.__name__}"] += 1
        return out

    def _projection(self, func, args) -> bool:
        """A GEMM one of whose operands is a whole parameter of the model (or a view of all of it)."""
        return func.overloadpacket in GEMMS and any(
            isinstance(t, torch.Tensor) and (t.untyped_storage().data_ptr(), t.numel()) in self.weights for t in args)

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()


def tally(model: nn.Module, ids: torch.Tensor, ported: tuple[str, ...] = PORTED) -> ForwardTally:
    """One forward of ``model`` on ``ids`` (no grad) under a ForwardTally."""
    mode = ForwardTally(model, ported)
    try:
        with torch.no_grad(), mode:
            model(input_ids=ids)
    finally:
        mode.remove()
    return mode


def _by_class(found: ForwardTally) -> list[dict[str, Any]]:
    """The torch compute by module class: the heaviest path as the example, the classes most FLOPs first."""
    classes: dict[str, dict[str, Any]] = {}
    for (cls, path), counter in found.torch.items():
        entry = classes.setdefault(cls, {"class": cls, "example": path, "modules": 0, "flops": 0, "bytes": 0,
                                         "ops": collections.Counter(), "heaviest": -1})
        entry["modules"] += 1
        entry["flops"] += counter["flops"]
        entry["bytes"] += counter["bytes"]
        entry["ops"].update({k[3:]: v for k, v in counter.items() if k.startswith("op:")})
        if counter["flops"] > entry["heaviest"]:
            entry["example"], entry["heaviest"] = path or "(the model)", counter["flops"]
    rows = sorted(classes.values(), key=lambda e: (-e["flops"], -e["bytes"]))
    return [{**{k: v for k, v in e.items() if k not in ("ops", "heaviest")},
             "ops": [name for name, _ in e["ops"].most_common(4)]} for e in rows]


def torch_share(shipped: nn.Module, patched: nn.Module, ids: torch.Tensor,
                ported: tuple[str, ...] = PORTED) -> dict[str, Any]:
    """The share of the shipped forward's compute outside plain projections that the patched forward still runs in
    torch (the module's docstring)."""
    total, left = tally(shipped, ids, ported), tally(patched, ids, ported)

    def sums(found: ForwardTally) -> tuple[int, int]:
        return sum(c["flops"] for c in found.torch.values()), sum(c["bytes"] for c in found.torch.values())
    (flops_total, bytes_total), (flops_torch, bytes_torch) = sums(total), sums(left)
    return {"flops_share": flops_torch / flops_total if flops_total else 0.0,
            "bytes_share": bytes_torch / bytes_total if bytes_total else 0.0,
            "flops_torch": flops_torch, "bytes_torch": bytes_torch, "flops_total": flops_total,
            "bytes_total": bytes_total, "ported_calls": dict(sorted(left.ported.items())), "left": _by_class(left)}
