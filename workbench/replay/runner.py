"""Run a replay: plan it (the ops, the layout, the reference it is held to), find or record the reference run
(workbench.replay.references), train with the chosen ops in a child process (workbench.replay.supervise), hold the
curve against the reference, record everything in the store and draw the plot."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from workbench.backends import Backend, get_backend
from workbench.config import Settings
from workbench.errors import WorkbenchError
from workbench.models import get_model
from workbench.replay.arch import Architecture, architecture
from workbench.replay.compare import Judgement, judge, judge_curve, judge_ranks
from workbench.replay.distributed import DEFAULT_COLLECTIVE_TIMEOUT_S, Layout
from workbench.replay.ops import describe, resolve_ops
from workbench.replay.presets import Preset, check_mode, get_preset
from workbench.replay.references import (
    base_path,
    export_reference,
    layout_reference_run,
    reference_run,
)
from workbench.replay.supervise import DEFAULT_TIMEOUT_S, Event, ReplayError, launch_process, training_job
from workbench.replay.tiers import parse_cache
from workbench.replay.train import RunResult
from workbench.store import get_engine, records
from workbench.vocabulary import ReplayStatus


@dataclass
class ReplayOutcome:
    replay_id: int
    status: str                     # pass, fail, error
    reason: str
    curve: list[float]
    reference_curve: list[float]
    left_band_step: int | None
    seconds_per_step: float
    reference_seconds_per_step: float | None
    reference_source: str           # store, file, run
    plot: str | None
    checks: dict = field(default_factory=dict)
    traces: list[str] = field(default_factory=list)  # each rank's profiler trace (--profile)


@dataclass
class ReplayPlan:
    """A validated replay request: nothing is run or recorded until ``execute``. layout: ranks, sharding, expert
    placement and the cached blocks; rank_ops: {rank: {block: target}} that one rank runs instead (a defect on one
    rank, to test what the replay catches); profile: each rank records a profiler trace (workbench.replay.trace)."""

    model: str
    mode: str
    preset: Preset
    arch: Architecture
    steps: int
    seed: int
    chosen: dict[str, str]
    backend: Backend
    layout: Layout = field(default_factory=Layout)
    rank_ops: dict[int, dict[str, str]] = field(default_factory=dict)
    mtp: bool = False
    profile: bool = False


def plan_replay(model: str, mode: str, settings: Settings, *, preset: str = "tiny", steps: int | None = None,
                ops: list[str] | None = None, seed: int = 0, backend: Backend | None = None, ranks: int = 1,
                layout: str | None = None, cache: str | None = None,
                rank_ops: dict[int, list[str]] | None = None, mtp: bool = False, chunks: int = 1,
                profile: bool = False) -> ReplayPlan:
    """Check every argument (WorkbenchError, one line, for the first bad one); ops: see workbench.replay.ops;
    cache: see workbench.replay.tiers; rank_ops: {rank: ops words applied over ``ops`` on that rank only}."""
    get_model(model)
    check_mode(mode)
    p = get_preset(preset)
    arch = architecture(model, p.layers)
    steps = steps or p.default_steps(mode)
    if steps < 1:
        raise WorkbenchError("--steps must be at least 1")
    chosen = resolve_ops(ops, settings.operators_dir, arch.blocks)
    spread = Layout.parse(ranks, layout, parse_cache(cache, arch.blocks), chunks)
    spread.check(p)
    if mtp and (mode != "scratch" or spread.distributed):
        raise WorkbenchError("--mtp trains a scratch replay in one process (not with --mode lora or --ranks)")
    if profile and not spread.distributed:
        raise WorkbenchError("--profile traces the ranks of a distributed replay: it needs --ranks 2 or more")
    per_rank = {}
    for rank, words in (rank_ops or {}).items():
        if not 0 <= rank < spread.ranks:
            raise WorkbenchError(f"--rank-ops: no rank {rank} among {spread.ranks}")
        changed = resolve_ops(["reference", *words], settings.operators_dir, arch.blocks)
        named = {w.partition("=")[0] for w in words}
        per_rank[rank] = {b: t for b, t in changed.items() if b in named}
    return ReplayPlan(model, mode, p, arch, steps, seed, chosen, backend or get_backend(), spread, per_rank, mtp,
                      profile)


def run_replay(model: str, mode: str, settings: Settings, *, preset: str = "tiny", steps: int | None = None,
               ops: list[str] | None = None, seed: int = 0, backend: Backend | None = None,
               timeout_s: float = DEFAULT_TIMEOUT_S, rerun_reference: bool = False, export: bool = False,
               plot: Path | None = None, on_event: Event | None = None, ranks: int = 1, layout: str | None = None,
               cache: str | None = None, rank_ops: dict[int, list[str]] | None = None,
               collective_timeout_s: float | None = None, mtp: bool = False, chunks: int = 1,
               profile: bool = False) -> ReplayOutcome:
    """Plan and execute a replay (see plan_replay and execute)."""
    plan = plan_replay(model, mode, settings, preset=preset, steps=steps, ops=ops, seed=seed, backend=backend,
                       ranks=ranks, layout=layout, cache=cache, rank_ops=rank_ops, mtp=mtp, chunks=chunks,
                       profile=profile)
    return execute(plan, settings, timeout_s=timeout_s, rerun_reference=rerun_reference, export=export, plot=plot,
                   on_event=on_event, collective_timeout_s=collective_timeout_s)


def execute(plan: ReplayPlan, settings: Settings, *, timeout_s: float = DEFAULT_TIMEOUT_S,
            rerun_reference: bool = False, export: bool = False, plot: Path | None = None,
            on_event: Event | None = None, collective_timeout_s: float | None = None) -> ReplayOutcome:
    """Replay ``plan`` against the reference. on_event(kind, data): "base" (the LoRA base is trained), "reference"
    (a reference run starts), "layout_reference" (the reference blocks run under the plan's layout), "start"
    (replay_id, ops, reference_source, layout), "step" (step, loss, reference, seconds).
    A distributed layout is held against the single-process reference (the curve, parameters and eval top-k) and
    each rank's local loss against the layout reference's (the first rank to leave its band is named);
    collective_timeout_s: how long a rank waits in a collective for the others before the replay names the rank
    that hung (default: the smaller of 300 s and half of timeout_s). A profiled plan's ranks write their traces to
    <work_dir>/replays/replay-<id>/rank-<rank>.trace.json, recorded as detail["traces"] (by rank)."""
    model, mode, p, arch = plan.model, plan.mode, plan.preset, plan.arch
    layout = plan.layout
    collective_timeout_s = collective_timeout_s or min(DEFAULT_COLLECTIVE_TIMEOUT_S, timeout_s / 2)
    steps, seed, backend = plan.steps, plan.seed, plan.backend
    engine = get_engine(settings.db_url)
    records.mark_replays_interrupted(engine)
    reference, source, facts = reference_run(settings, model, p, arch, mode, steps, seed, backend, timeout_s,
                                             rerun=rerun_reference, on_event=on_event, mtp=plan.mtp)
    if export:
        facts["exported"] = str(export_reference(settings, model, p, mode, steps, seed, facts["key"], reference,
                                                 facts.get("reference_mtp_curve")))
    base = base_path(settings, model, p) if mode == "lora" else None
    layout_reference = None
    if layout.distributed:
        layout_reference = layout_reference_run(settings, model, p, arch, mode, steps, seed, backend, layout,
                                                timeout_s, collective_timeout_s, base, facts["key"],
                                                rerun=rerun_reference, on_event=on_event)
    shown = {**describe(plan.chosen), "band": p.band_rtol}
    spread = {**layout.to_dict(), "rank_ops": {str(r): describe(o) for r, o in plan.rank_ops.items()}} \
        if layout.distributed or layout.cache else None
    replay_id = records.start_replay(engine, model=model, mode=mode, preset=p.name, seed=seed, steps=steps,
                                     backend=backend.name, ops=shown, reference_curve=reference.curve, layout=spread)
    if on_event:
        on_event("start", {"replay_id": replay_id, "ops": shown, "reference_source": source,
                           "layout": layout.to_dict(),
                           "rank_ops": {str(r): describe(o) for r, o in plan.rank_ops.items()}})
    curve: list[float] = []

    def on_step(step: int, loss: float, seconds: float) -> None:
        curve.append(loss)
        records.extend_replay_curve(engine, replay_id, curve)
        if on_event:
            ref = reference.curve[step] if step < len(reference.curve) else None
            on_event("step", {"step": step, "loss": loss, "reference": ref, "seconds": seconds})

    traces = (settings.work_dir / "replays" / f"replay-{replay_id}").resolve() if plan.profile else None
    if traces is not None:
        traces.mkdir(parents=True, exist_ok=True)
    job = training_job("train", p, arch, mode, steps, seed, plan.chosen, backend, base,
                       layout if layout.distributed or layout.cache else None, plan.rank_ops, collective_timeout_s,
                       plan.mtp, traces)
    detail = {"reference_source": source, **facts, "reference_seconds_per_step": reference.seconds_per_step}
    if traces is not None:
        detail["traces"] = [str(traces / f"rank-{r}.trace.json") for r in range(layout.ranks)]
    try:
        done = launch_process(job, backend, timeout_s, on_step)
        result = RunResult(**done["result"])
    except ReplayError as exc:
        records.finish_replay(engine, replay_id, ReplayStatus.ERROR, str(exc), curve=curve, detail=detail)
        return ReplayOutcome(replay_id, ReplayStatus.ERROR, str(exc), curve, reference.curve, None, 0.0,
                             reference.seconds_per_step, source, None)
    except BaseException:
        records.finish_replay(engine, replay_id, ReplayStatus.INTERRUPTED, "interrupted by the user", curve=curve,
                              detail=detail)
        raise
    verdict: Judgement = judge(result, reference, p)
    if layout_reference is not None:
        verdict = _judge_layout(verdict, result, reference, done["rank_curves"], done["rank_memory"],
                                layout_reference, p, detail)
    if plan.mtp:
        verdict = _judge_mtp(verdict, done["mtp_curve"], facts["reference_mtp_curve"], p, detail)
    detail.update(checks=verdict.checks, seconds_per_step=result.seconds_per_step, eval_loss=result.eval_loss,
                  reference_eval_loss=reference.eval_loss, max_relative_deviation=verdict.max_deviation)
    plot_path = _plot(result.curve, reference.curve, p, verdict, plot or settings.work_dir / "replays" /
                      f"replay-{replay_id}.png", f"{model} · {mode} · {p.name} · seed {seed} · replay #{replay_id}")
    detail["plot"] = str(plot_path)
    records.finish_replay(engine, replay_id, verdict.status, verdict.reason, curve=result.curve,
                          left_band_step=verdict.left_band_step, detail=detail)
    return ReplayOutcome(replay_id, verdict.status, verdict.reason, result.curve, reference.curve,
                         verdict.left_band_step, result.seconds_per_step, reference.seconds_per_step, source,
                         str(plot_path), verdict.checks, detail.get("traces", []))


def _judge_layout(verdict: Judgement, result: RunResult, reference: RunResult, rank_curves: list[list[float]],
                  rank_memory: list[dict], layout_reference: tuple[RunResult, list[list[float]], str],
                  preset: Preset, detail: dict) -> Judgement:
    """The single-process verdict with the ranks' check added: each rank's local loss inside the band of the layout
    reference's; the layout reference's own distance from the single-process reference recorded beside it, and
    what each rank held (RankMemory) recorded as measured."""
    layout_result, reference_rank_curves, layout_source = layout_reference
    ranks = judge_ranks(rank_curves, reference_rank_curves, preset)
    equivalence = judge(layout_result, reference, preset)
    detail.update(rank_curves=rank_curves, rank_memory=rank_memory, layout_reference_source=layout_source,
                  layout_equivalence={"status": equivalence.status, "reason": equivalence.reason,
                                      "checks": equivalence.checks})
    checks = {**verdict.checks, "ranks": ranks}
    if ranks["passed"]:
        return Judgement(verdict.status, verdict.reason, verdict.left_band_step, verdict.max_deviation, checks)
    named = (f"rank {ranks['rank']} left its band at step {ranks['step']}: local loss "
             f"{ranks['loss']:.6f} vs {ranks['reference']:.6f} under the same layout with reference blocks")
    reason = named if verdict.passed else f"{verdict.reason}; first to leave: {named}"
    left = verdict.left_band_step if verdict.left_band_step is not None else ranks["step"]
    return Judgement(ReplayStatus.FAIL, reason, left, verdict.max_deviation, checks)


def _judge_mtp(verdict: Judgement, mtp_curve: list[float], reference_mtp_curve: list[float], preset: Preset,
              detail: dict) -> Judgement:
    """The verdict with the MTP loss held against the reference's MTP loss (the same band); both curves recorded."""
    mtp = judge_curve(mtp_curve, reference_mtp_curve, preset)
    detail["mtp_curve"] = mtp_curve
    checks = {**verdict.checks, "mtp": mtp}
    if mtp["passed"]:
        return Judgement(verdict.status, verdict.reason, verdict.left_band_step, verdict.max_deviation, checks)
    named = (f"the MTP loss left its band at step {mtp['left_band_step']}" if mtp["left_band_step"] is not None else
             f"the MTP curve has {len(mtp_curve)} steps, its reference {len(reference_mtp_curve)}")
    reason = named if verdict.passed else f"{verdict.reason}; {named}"
    return Judgement(ReplayStatus.FAIL, reason, verdict.left_band_step, verdict.max_deviation, checks)


def _plot(curve: list[float], reference: list[float], preset: Preset, verdict: Judgement, path: Path,
          title: str) -> Path:
    from workbench.replay.plot import draw

    path.parent.mkdir(parents=True, exist_ok=True)
    draw(curve, reference, preset, verdict.left_band_step, path, title)
    return path
