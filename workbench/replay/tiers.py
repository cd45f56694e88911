"""Selective caching of activations in a second memory tier: the tensors that chosen blocks save for backward move
to host memory when saved (torch.autograd.graph.saved_tensors_hooks) and come back when the backward unpacks them.

    --cache moe_grouped_gemm,kda:host   the tensors these blocks' outputs save for backward live in the host tier

A copy there and back is exact, so a curve with caching is bit-identical to the curve without it. On a GPU the
device tier is HBM and the host tier pinned host memory; on a CPU both are host memory, kept apart and accounted as
two pools (``Tiers``), so the bytes each holds and the traffic between them are measured either way. Parameters
(and views of them) that a block saves stay where they are: they are not activations.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from workbench.errors import WorkbenchError

HOST = "host"
TIERS = (HOST,)


def parse_cache(spec: str | None, blocks: tuple[str, ...]) -> tuple[str, ...]:
    """``"<block>,<block>:host"`` -> the blocks (each one the model calls); WorkbenchError for anything else."""
    if not spec:
        return ()
    names, _, tier = spec.rpartition(":")
    if tier not in TIERS or not names:
        raise WorkbenchError(f"bad --cache '{spec}' (<block>,...:{'|'.join(TIERS)})")
    chosen = tuple(dict.fromkeys(n.strip() for n in names.split(",") if n.strip()))
    unknown = [b for b in chosen if b not in blocks]
    if unknown:
        raise WorkbenchError(f"--cache: block '{unknown[0]}' is not part of the replay model ({', '.join(blocks)})")
    return chosen


@dataclass
class Tiers:
    """Live bytes of saved tensors per tier (device, host), their peaks, the bytes moved between them, and the
    device tier's bytes by the block that saved them (``glue``: between blocks) at its peak."""

    live: dict[str, int] = field(default_factory=lambda: {"device": 0, HOST: 0})
    peak: dict[str, int] = field(default_factory=lambda: {"device": 0, HOST: 0})
    to_host: int = 0
    to_device: int = 0
    device_by_block: dict[str, int] = field(default_factory=dict)
    device_peak_by_block: dict[str, int] = field(default_factory=dict)

    def hold(self, tier: str, owner: object, nbytes: int, block: str = "glue") -> None:
        """Count ``nbytes`` saved by ``block`` in ``tier`` for as long as ``owner`` lives."""
        self.live[tier] += nbytes
        if tier == "device":
            self.device_by_block[block] = self.device_by_block.get(block, 0) + nbytes
        if self.live[tier] > self.peak[tier]:
            self.peak[tier] = self.live[tier]
            if tier == "device":
                self.device_peak_by_block = dict(self.device_by_block)
        weakref.finalize(owner, self._release, tier, nbytes, block)

    def _release(self, tier: str, nbytes: int, block: str) -> None:
        self.live[tier] -= nbytes
        if tier == "device":
            self.device_by_block[block] -= nbytes

    def figures(self) -> dict[str, int]:
        return {"peak_device_bytes": self.peak["device"], "peak_host_bytes": self.peak[HOST],
                "to_host_bytes": self.to_host, "to_device_bytes": self.to_device}


class _Saved:
    """What the autograd graph holds instead of a saved tensor: the tensor (device tier) or its host copy."""

    __slots__ = ("tensor", "device", "__weakref__")

    def __init__(self, tensor: torch.Tensor, device: torch.device | None):
        self.tensor, self.device = tensor, device


def _is_parameter(t: torch.Tensor) -> bool:
    base = t._base if t._base is not None else t
    return isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad)


def _to_host(t: torch.Tensor) -> torch.Tensor:
    if t.device.type == "cpu":
        return t.detach().clone()  # a pool of its own on a CPU: a separate copy
    host = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu", pin_memory=True)
    return host.copy_(t.detach())


class _Hooks:
    """pack/unpack of ``block``'s saved tensors: to the host tier when ``offload``, else accounted on the device."""

    def __init__(self, tiers: Tiers, offload: bool, block: str = "glue"):
        self.tiers, self.offload, self.block = tiers, offload, block

    def pack(self, t: torch.Tensor) -> object:
        if _is_parameter(t):
            return t
        if not self.offload:
            saved = _Saved(t.detach(), None)  # detached: an op that saves its own output would else hold itself
            self.tiers.hold("device", saved, t.nbytes, self.block)
            return saved
        saved = _Saved(_to_host(t), t.device)
        self.tiers.to_host += t.nbytes
        self.tiers.hold(HOST, saved, t.nbytes, self.block)
        return saved

    def unpack(self, saved: object) -> torch.Tensor:
        if not isinstance(saved, _Saved):
            return saved
        if saved.device is None:
            return saved.tensor
        back = saved.tensor.to(saved.device, copy=True)
        self.tiers.to_device += back.nbytes
        self.tiers.hold("device", back, back.nbytes, self.block)  # while the backward holds it
        return back


def _wrapped(op: Callable, hooks: _Hooks) -> Callable:
    def run(*args, **kwargs):
        with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
            return op(*args, **kwargs)
    return run


def accounted(tiers: Tiers) -> contextlib.AbstractContextManager:
    """A context counting every tensor saved for backward inside it in the device tier of ``tiers`` (the glue
    between blocks; a block's own hooks, from cached_ops, take precedence inside its call)."""
    hooks = _Hooks(tiers, offload=False)
    return torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack)


def local_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes this process holds of ``tensors``: a sharded (DTensor) one counts its local shard; None counts 0."""
    return sum((t.to_local() if hasattr(t, "to_local") else t).nbytes for t in tensors if t is not None)


def cached_ops(ops: dict[str, Callable], cache: list[str] | tuple[str, ...], tiers: Tiers | None = None,
               account: bool = False) -> dict[str, Callable]:
    """``ops`` with the blocks in ``cache`` saving to the host tier; with ``account`` every other block's saved
    tensors are counted in the device tier of ``tiers`` too (what bench/replay_memory.py measures)."""
    if not cache and not account:
        return ops
    tiers = tiers or Tiers()
    return {block: _wrapped(op, _Hooks(tiers, offload=True, block=block)) if block in cache
            else _wrapped(op, _Hooks(tiers, offload=False, block=block)) if account else op
            for block, op in ops.items()}
