"""Triton peers side by side: a block's peers written in Triton (fla, Liger-Kernel, Cut Cross-Entropy) captured,
compiled for the targets and modelled exactly as an operator is, so ``workbench bench`` puts a modelled row of each
installed peer beside ours on every target.

A peer is a ``BlockSpec.peers`` entry: a function with the reference's signature that imports its package in its body.
Its candidate file is that function's own source under ``BLOCK = "<block>"`` (``candidate_source``): the sandbox
imports nothing of the workbench, so the peer's host code runs there as a candidate's does, on meta tensors at the
model suite's sizes, launches recorded and not run (a ``triton.autotune``'d kernel: every config it would try, the
cost model taking the one it models fastest; workbench.perf.cost.autotuner_choice), the capture held to a run on real
zeros (capture_divergence), every launch compiled for each target. A peer whose host code cannot run at the sizes
(a head size it has no kernel for, a device check) is a row saying why.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

from workbench.blocks import get_block
from workbench.blocks.base import Peer
from workbench.perf.bench import BenchRow, modelled_rows

TRITON_PACKAGES = ("fla", "liger_kernel", "cut_cross_entropy")
"""The peers' packages whose kernels are Triton (`@triton.jit`): captured and compiled like ours. PyTorch's SDPA and
FlexAttention (Inductor-generated) and flash-attn (CUDA) are timed on a GPU only."""


def triton_peers(block: str) -> list[Peer]:
    """The block's installed Triton peers."""
    return [p for p in get_block(block).peers
            if p.package in TRITON_PACKAGES and importlib.util.find_spec(p.package) is not None]


def candidate_source(block: str, peer: Peer) -> str:
    """The peer as a candidate file: torch, its function's source (which imports the peer's package itself), ``run``
    bound to it."""
    return (f'"""{peer.name} ({peer.package}) as a candidate for {block}: captured and compiled like an operator."""'
            f'\n\nimport torch\n\nBLOCK = "{block}"\n\n\n{inspect.getsource(peer.run)}\n\nrun = {peer.run.__name__}\n')


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def peer_rows(block: str, shapes: list[dict], targets: list[str], folder: Path, *,
              forward_only: bool = False) -> list[BenchRow]:
    """Modelled rows of each installed Triton peer of ``block`` at ``shapes`` on ``targets`` (subject: the peer's
    name); a peer that could not be captured or compiled: one row per target naming why (time None)."""
    from workbench.verify.harness import target_report

    rows = []
    for peer in triton_peers(block):
        path = folder / f"{block}__{slug(peer.name)}.py"
        path.write_text(candidate_source(block, peer))
        report = target_report(path, block=block, targets=targets, forward_only=forward_only, shapes=shapes)
        incomplete = [f for f in report.findings if "incomplete" in f]
        if report.verdict != "pass" or incomplete or not report.builds:
            why = report.message if report.verdict != "pass" else incomplete[0] if incomplete else "no launch captured"
            rows += [BenchRow(block, peer.name, t, "all shapes", "fwd", "modelled", None, float("nan"), None,
                              note=f"not captured: {why}"[:200]) for t in targets]
            continue
        rows += [r for r in modelled_rows(block, shapes, targets, report.builds, subject=peer.name,
                                          launches=report.launches_per_call)
                 if not (forward_only and r.passes != "fwd")]
    return rows


def ratios(rows: list[BenchRow]) -> dict[tuple[str, str, str, str], float]:
    """{(block, peer, target, passes): our modelled time over the peer's}, the shapes summed, where both have one."""
    totals: dict[tuple[str, str, str, str], list[float]] = {}
    for r in rows:
        if r.label == "modelled":
            key = (r.block, r.subject, r.target, r.passes)
            totals.setdefault(key, []).append(r.time_ms if r.time_ms is not None else float("nan"))
    out = {}
    for (block, subject, target, passes), times in totals.items():
        ours = totals.get((block, "operator", target, passes))
        if subject != "operator" and ours:
            peer, mine = sum(times), sum(ours)
            if peer == peer and mine == mine and peer > 0:  # not nan
                out[(block, subject, target, passes)] = mine / peer
    return out


def against_measured(measured: list[BenchRow], modelled: list[BenchRow]) -> list[dict]:
    """Per (block, subject, passes) measured on the GPU and modelled for its target at the same shapes, summed: the
    times, the measured and modelled ours / subject ratios, and the cost model's error (modelled / measured - 1)."""
    def totals(rows):
        out: dict[tuple[str, str, str], float] = {}
        for r in rows:
            if r.time_ms is not None:
                key = (r.block, r.subject, r.passes)
                out[key] = out.get(key, 0.0) + r.time_ms
        return out

    got, model = totals(measured), totals(modelled)
    lines = []
    for (block, subject, passes), ms in sorted(got.items()):
        if (block, subject, passes) not in model:
            continue
        modelled_ms = model[(block, subject, passes)]
        ours = got.get((block, "operator", passes)), model.get((block, "operator", passes))
        lines.append({"block": block, "subject": subject, "passes": passes, "measured_ms": ms,
                      "modelled_ms": modelled_ms, "model_error": modelled_ms / ms - 1,
                      "ours_over_measured": ours[0] / ms if ours[0] and subject != "operator" else None,
                      "ours_over_modelled": ours[1] / modelled_ms if ours[1] and subject != "operator" else None})
    return lines
