"""The cost model: what a block must move and compute at a shape, what each target can do, the roofline floor, and
the penalties of what the compiler reported for an operator. It needs no GPU and measures nothing: every time it
gives is modelled, and is labelled so wherever it is shown (``MODELLED``).

Work per block (``WORK``: each block's ``BlockSpec.work``, written from its math in ``workbench/blocks/<block>.py``):
    bytes: compulsory HBM traffic, each input read once and each output written once (the backward reads the
        inputs and upstream gradients, writes the input gradients); bf16 tensors unless the block keeps float32
        (gates, states, scores) or int64 (indices);
    tensor_flops: matrix products, 2 per multiply-add (the tensor cores' work);
    vector_flops: elementwise work large enough to matter against the target's vector peak.
The forward+backward figures are the sum of both passes.

Penalties, from the model-suite builds of an operator on a target (``workbench.verify.aot.KernelBuild``):
    a build that fails or cannot be resident: the operator does not run there (no time);
    a dot kernel without tensor-core instructions: its matrix work at the vector (FMA) peak;
    spilled bytes per thread: time x (1 + spilled / register bytes per thread), at most x5;
    occupancy: fewer resident warps per SM than the roof needs to hide memory latency (a quarter of the SM's
        warps for a memory-bound block, an eighth for a compute-bound one, which hides latency in its tiles) slow
        the kernel by need / resident, at most x4; a dot kernel's warps count once per pipelined load in flight
        (num_stages - 1);
    the two multiply, per kernel, and the dominant kernel's product applies.
Not modelled: idle SMs of a grid smaller than the machine, wave quantization, and L2 reuse (the floor assumes
every input is read from HBM once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from workbench.backends import TARGETS, Peaks
from workbench.blocks import REGISTRY
from workbench.blocks.base import Work

MODELLED = "modelled"  # the label every figure of this module carries where it is shown
SPILL_PENALTY_CAP = 5.0
OCCUPANCY_NEED = {"memory": 1 / 4, "compute": 1 / 8}  # share of the SM's resident warps the roof needs
OCCUPANCY_PENALTY_CAP = 4.0


WORK: dict[str, Callable[[Mapping[str, int]], tuple[Work, Work]]] = {
    name: spec.work for name, spec in REGISTRY.items() if spec.work is not None}
"""Each block's (forward, backward) work at a shape: ``BlockSpec.work``, in the block's module."""


def work(block: str, shape: Mapping[str, int], *, backward: bool = True) -> Work:
    """The block's work at ``shape``: the forward, plus the backward unless ``backward`` is False."""
    if block not in WORK:
        raise KeyError(f"no cost model for block '{block}' (has: {', '.join(sorted(WORK))})")
    fwd, bwd = WORK[block](shape)
    return fwd + bwd if backward else fwd


def floor_s(w: Work, peaks: Peaks, *, tensor_cores: bool = True) -> float:
    """The roofline floor in seconds: the slowest of moving the bytes at HBM bandwidth, the matrix work at the
    bf16 tensor peak (the fp32 vector peak without tensor cores) and the vector work at the fp32 peak."""
    matrix_peak = peaks.bf16_flops if tensor_cores else peaks.fp32_flops
    return max(w.bytes / peaks.hbm_bytes_s, w.tensor_flops / matrix_peak, w.vector_flops / peaks.fp32_flops)


@dataclass(frozen=True)
class Estimate:
    """One operator at one shape on one target. time_s None: it does not run there (``penalties`` says why).
    fraction: floor / time, the share of the target's roofline the model expects it to reach."""

    target: str
    floor_s: float
    time_s: float | None
    bound: str  # "memory" or "compute": which roof the floor sits on
    penalties: tuple[str, ...]
    label: str = MODELLED

    @property
    def fraction(self) -> float | None:
        return self.floor_s / self.time_s if self.time_s else None


def _kernel_penalty(build: dict, target: str, bound: str) -> tuple[float, list[str]]:
    """(slow-down factor, reasons) of one compiled kernel: its spills and its occupancy (module docstring)."""
    factor, reasons = 1.0, []
    if build.get("spilled_bytes"):
        spill = min(SPILL_PENALTY_CAP, 1 + build["spilled_bytes"] / (4 * max(build.get("registers") or 1, 1)))
        factor *= spill
        reasons.append(f"spills {build['spilled_bytes']} B/thread")
    ctas, warps = build.get("ctas_per_sm"), build.get("num_warps")
    if ctas and warps and target in TARGETS:
        most = TARGETS[target].max_warps_per_sm
        need = OCCUPANCY_NEED[bound] * most
        # a dot kernel's loop is software-pipelined: each stage past the first keeps one more tile load in flight
        depth = max(1, (build.get("num_stages") or 1) - 1) if build.get("uses_dot") else 1
        if ctas * warps * depth < need:
            factor *= min(OCCUPANCY_PENALTY_CAP, need / (ctas * warps * depth))
            piped = f" x {depth} pipelined loads" if depth > 1 else ""
            reasons.append(f"{ctas * warps} of {most} warps resident per SM{piped} (needs {need:g})")
    return factor, reasons


def autotuner_choice(builds: list[dict], target: str, bound: str) -> list[dict]:
    """``builds`` with each autotuned call (builds whose specialization names an ``autotune`` config: a peer's
    triton.autotune at one shape, every config captured) reduced to the config modelled fastest: the one that
    compiles with the least penalty, as the autotuner would pick by timing it on the GPU."""
    tuned: dict[tuple, list[dict]] = {}
    plain = []
    for b in builds:
        tune = (b.get("specialization") or {}).get("autotune")
        if tune is not None:  # one tuner call (a kernel at one shape): its configs
            tuned.setdefault((b["kernel"], tune.get("call")), []).append(b)
        else:
            plain.append(b)
    for kernel_builds in tuned.values():
        compiled = [b for b in kernel_builds if b["ok"] and b.get("ctas_per_sm") != 0] or kernel_builds
        plain.append(min(compiled, key=lambda b: (_kernel_penalty(b, target, bound)[0], b.get("spilled_bytes") or 0)))
    return plain


def estimate(block: str, shape: Mapping[str, int], target: str, builds: list[dict] | None = None, *,
             backward: bool = True) -> Estimate:
    """The modelled time of an operator for ``block`` at ``shape`` on ``target``, with the penalties its
    model-suite ``builds`` on that target earn (KernelBuild dicts; None: the ideal kernel, at the floor)."""
    peaks = TARGETS[target].peaks
    w = work(block, shape, backward=backward)
    floor = floor_s(w, peaks)
    bound = "memory" if w.bytes / peaks.hbm_bytes_s >= floor else "compute"
    mine = [b for b in builds or [] if b["target"] == target and b["suite"] == "model"]
    if not backward:  # the backward's kernels by name: ours say bwd, Liger's and fla's backward
        mine = [b for b in mine if "bwd" not in b["kernel"] and "backward" not in b["kernel"]]
    mine = autotuner_choice(mine, target, bound)
    reasons = [f"{b['kernel']}: does not compile" for b in mine if not b["ok"]]
    reasons += [f"{b['kernel']}: cannot be resident" for b in mine if b["ok"] and b.get("ctas_per_sm") == 0]
    if reasons:
        return Estimate(target, floor, None, bound, tuple(reasons))
    penalties, time_s = [], floor
    no_tc = [b["kernel"] for b in mine if b.get("uses_dot") and not b.get("tensor_cores")]
    if no_tc and w.tensor_flops:
        time_s = max(time_s, floor_s(w, peaks, tensor_cores=False))
        penalties.append(f"no tensor cores: {', '.join(sorted(set(no_tc)))}")
    worst = max(((_kernel_penalty(b, target, bound), b) for b in mine), key=lambda x: x[0][0], default=None)
    if worst and worst[0][0] > 1:
        (factor, reasons), b = worst
        time_s *= factor
        penalties.append(f"{b['kernel']}: {', '.join(reasons)} (x{factor:.2f})")
    return Estimate(target, floor, time_s, bound, tuple(penalties))


def modelled_summary(block: str, shapes: list[Mapping[str, int]], builds: list[dict], targets: list[str], *,
                     backward: bool = True) -> dict[str, dict]:
    """Per target (known ones): the operator's modelled time and floor over ``shapes`` summed, in ms, the
    fraction of the roofline and the penalties; time_ms None where it does not run. Plain data, for manifests."""
    summary = {}
    for target in (t for t in targets if t in TARGETS):
        estimates = [estimate(block, shape, target, builds, backward=backward) for shape in shapes]
        if not estimates:
            continue
        floor = sum(e.floor_s for e in estimates) * 1e3
        runs = all(e.time_s is not None for e in estimates)
        time_ms = sum(e.time_s for e in estimates) * 1e3 if runs else None
        summary[target] = {"label": MODELLED, "time_ms": round(time_ms, 6) if runs else None,
                           "floor_ms": round(floor, 6), "fraction": round(floor / time_ms, 4) if runs else None,
                           "penalties": list(dict.fromkeys(p for e in estimates for p in e.penalties))}
    return summary
