"""``workbench bench``: an operator at the model card's sizes, modelled everywhere and measured where a GPU is.

Modelled (no GPU needed): per shape and target, the cost model's roofline floor and the operator's time with the
penalties its compiled kernels earn there (workbench.perf.cost; every figure labelled "modelled").
Measured (CUDA): forward and forward+backward through workbench.perf.timing's protocol, for the operator, the
eager reference, ``torch.compile`` of the reference and each installed peer (``BlockSpec.peers``); achieved bytes/s and
FLOP/s from the cost model's work, the fraction of the device's roofline, and peak memory."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from workbench.backends import TARGETS, cuda_target_name
from workbench.blocks import get_block
from workbench.blocks.base import BlockSpec, shape_label
from workbench.operators import import_operator
from workbench.perf import cost
from workbench.perf.timing import Clock, CudaClock, time_calls


@dataclass
class BenchRow:
    """One figure set: ``subject`` (operator, eager, compile, or a peer's name) on ``target`` at ``shape``.
    label "modelled" (time_ms from the cost model) or "measured" (median of the timed trials, with spread)."""

    block: str
    subject: str
    target: str
    shape: str
    passes: str  # "fwd" or "fwd+bwd"
    label: str
    time_ms: float | None
    floor_ms: float
    fraction: float | None  # floor / time: the share of the target's roofline reached
    spread_ms: float | None = None
    bytes_s: float | None = None
    flops_s: float | None = None
    peak_bytes: int | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def modelled_rows(block: str, shapes: list[dict], targets: list[str], builds: list[dict], *,
                  subject: str = "operator", launches: dict | None = None) -> list[BenchRow]:
    """The cost model's figures for an operator (or the ``subject`` named: a peer) whose model-suite ``builds``
    (KernelBuild dicts) are given; ``launches``: its kernel launches per call by shape label
    (VerificationResult.launches_per_call), said in each row's note."""
    rows = []
    for shape in shapes:
        for target in targets:
            for backward in (False, True):
                est = cost.estimate(block, shape, target, builds, backward=backward)
                passes = "fwd+bwd" if backward else "fwd"
                count = (launches or {}).get(shape_label(shape), {}).get(passes)
                said = [f"{count} launch{'es' if count != 1 else ''} a call"] if count is not None else []
                note = said + list(est.penalties)
                rows.append(BenchRow(block, subject, target, shape_label(shape), passes, cost.MODELLED,
                                     est.time_s * 1e3 if est.time_s else None, est.floor_s * 1e3, est.fraction,
                                     note="; ".join(note)))
    return rows


# --- measured, on a GPU --------------------------------------------------------------------------------------

def installed_peers(block: str) -> list[tuple[str, Callable]]:
    """The block's peers (``BlockSpec.peers``) whose package is installed: (name, run)."""
    return [(peer.name, peer.run) for peer in get_block(block).peers if importlib.util.find_spec(peer.package)]


def device_target(device: torch.device) -> str:
    """The target name of the GPU torch sees (sm_90a for an H200)."""
    return cuda_target_name(*torch.cuda.get_device_capability(device))


def _checker(spec: BlockSpec, inputs: dict) -> Callable[[object, dict], None]:
    """check(outputs, fresh): each floating output of a timed call against the float64 truth, by the block's rule
    in the inputs' dtype (at most ``factor`` times the reference's own error in it, plus its floors); raises
    AssertionError naming the first output off."""
    from workbench.verify.harness import reference_run

    truth, _ = reference_run(spec, inputs, None, upcast=torch.float64)
    lowp, _ = reference_run(spec, inputs, None)
    dtype = next(v.dtype for v in inputs.values() if isinstance(v, torch.Tensor) and v.is_floating_point())
    tol = spec.tolerance(dtype)

    def check(out, fresh):
        outs = out if isinstance(out, tuple | list) else (out,)
        for name, got, want, ref in zip(spec.outputs, outs, truth, lowp, strict=False):
            if isinstance(got, torch.Tensor) and got.is_floating_point():
                bound = tol.bound((ref.double() - want).abs().max().item(), want.abs().max().item())
                err = (got.double() - want).abs().max().item()
                if not err <= bound:
                    raise AssertionError(f"{name} off by {err:.3g} (bound {bound:.3g})")

    return check


def measured_rows(spec: BlockSpec, module, shapes: list[dict], *, trials: int = 20, device: str = "cuda",
                  dtype: torch.dtype = torch.bfloat16, clock: Clock | None = None,
                  subjects: list[str] | None = None) -> list[BenchRow]:
    """Operator, eager reference, torch.compile of it and the installed peers (or the named ``subjects``) at each
    shape on ``device``. On anything but a GPU (the protocol's own tests) pass a clock, and the floor is nan."""
    device = torch.device(device)
    clock = clock or CudaClock(device)
    target = device_target(device) if device.type == "cuda" else device.type
    peaks = TARGETS[target].peaks if target in TARGETS else None
    every = [("operator", module.run), ("eager", spec.reference)]
    if not spec.not_compiled:
        every.append(("compile", torch.compile(spec.reference)))
    every += installed_peers(spec.name)
    chosen = [(name, fn) for name, fn in every if subjects is None or name in subjects]
    rows = []
    for shape in shapes:
        inputs = spec.make_inputs(shape, dtype, 0, device.type)
        check = _checker(spec, inputs)
        for backward in (False, True):
            w = cost.work(spec.name, shape, backward=backward)
            floor_ms = cost.floor_s(w, peaks) * 1e3 if peaks else float("nan")
            for name, fn in chosen:
                try:
                    timing = time_calls(fn, inputs, spec.arg_names, clock, check=check, grad_names=spec.grad_inputs,
                                        backward=backward, trials=trials)
                except Exception as exc:  # noqa: BLE001 - a subject that fails at this shape is a row saying so
                    rows.append(BenchRow(spec.name, name, target, shape_label(shape), "fwd+bwd" if backward else
                                         "fwd", "measured", None, floor_ms, None,
                                         note=f"{type(exc).__name__}: {exc}"[:200]))
                    continue
                seconds = timing.median_ms / 1e3
                rows.append(BenchRow(spec.name, name, target, shape_label(shape), "fwd+bwd" if backward else "fwd",
                                     "measured", timing.median_ms, floor_ms,
                                     floor_ms / timing.median_ms if peaks else None,
                                     spread_ms=timing.spread_ms, bytes_s=w.bytes / seconds,
                                     flops_s=(w.tensor_flops + w.vector_flops) / seconds,
                                     peak_bytes=timing.peak_bytes))
    return rows


def load_operator(path: Path):
    """Import an operator file as a module (trusted: a promoted operator or the user's own file)."""
    return import_operator(path, f"bench_{path.stem}")


def record(engine, rows: list[BenchRow]) -> None:
    """Each row's figures into the store's benchmark table (time, floor, fraction; label and subject kept)."""
    from workbench.store.db import session_scope
    from workbench.store.models import Benchmark

    with session_scope(engine) as session:
        for r in rows:
            for metric, value, unit in (("time", r.time_ms, "ms"), ("floor", r.floor_ms, "ms"),
                                        ("roofline_fraction", r.fraction, "")):
                if value is not None and value == value:  # a figure, not a peer that was not captured (nan)
                    session.add(Benchmark(block=r.block, backend=r.target, shape=r.shape,
                                          dtype="bfloat16", metric=f"{metric}:{r.passes}", value=float(value),
                                          unit=unit, label=r.label, subject=r.subject))


def text_table(rows: list[BenchRow]) -> str:
    """The rows as plain text (for bench/gpu_check.sh, which has no rich): one line per figure."""
    lines = [f"{'block':<22} {'subject':<18} {'target':<8} {'shape':<34} {'passes':<8} {'figure':<9} "
             f"{'ms':>10} {'spread':>8} {'floor ms':>9} {'roofline':>8} {'TB/s':>7} {'TFLOP/s':>8}  note"]
    for r in rows:
        ms = f"{r.time_ms:.3f}" if r.time_ms is not None else "-"
        spread = f"{r.spread_ms:.3f}" if r.spread_ms is not None else "-"
        share = f"{100 * r.fraction:.0f}%" if r.fraction is not None else "-"
        tbs = f"{r.bytes_s / 1e12:.2f}" if r.bytes_s else "-"
        tflops = f"{r.flops_s / 1e12:.1f}" if r.flops_s else "-"
        lines.append(f"{r.block:<22} {r.subject:<18} {r.target:<8} {r.shape[:34]:<34} {r.passes:<8} {r.label:<9} "
                     f"{ms:>10} {spread:>8} {r.floor_ms:>9.3f} {share:>8} {tbs:>7} {tflops:>8}  {r.note[:60]}")
    return "\n".join(lines)
