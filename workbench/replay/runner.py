"""Run a replay: find or record the reference run, train with the chosen ops in a child process, hold the curve
against the reference, record everything in the store and draw the plot.

Reference runs are keyed by everything that determines them (preset, the architecture read from the model card,
mode, steps, seed, the source of the replay model and of the blocks' references, the torch version and, for LoRA,
the base checkpoint's bytes). A reference is taken from the store, else from the repository file
``replays/<model>/<preset>/<mode>-s<steps>-seed<seed>.json``, else run now: twice, and the two runs must be
bit-identical.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from pathlib import Path

import torch

from workbench.backends import Backend, get_backend
from workbench.blocks import get_block
from workbench.config import Settings
from workbench.errors import WorkbenchError
from workbench.models import get_model
from workbench.replay import arch as arch_module
from workbench.replay import data as data_module
from workbench.replay import model as model_module
from workbench.replay import mtp as mtp_module
from workbench.replay import train as train_module
from workbench.replay.arch import CALLABLE, Architecture, architecture
from workbench.replay.child import MARK
from workbench.replay.compare import Judgement, judge, judge_curve, judge_ranks
from workbench.replay.distributed import DEFAULT_COLLECTIVE_TIMEOUT_S, Layout
from workbench.replay.ops import describe, operator_file, reference_ops, resolve_ops
from workbench.replay.presets import Preset, check_mode, get_preset
from workbench.replay.tiers import parse_cache
from workbench.replay.train import RunResult
from workbench.store import get_engine, records
from workbench.verify.sandbox import child_command, child_env
from workbench.vocabulary import ReplayStatus

DEFAULT_TIMEOUT_S = 3600.0
BASE_SEED = 0
CHILD, LAUNCHER = "workbench.replay.child", "workbench.replay.launcher"


class ReplayError(WorkbenchError):
    """A training process that failed, crashed or timed out (its one-line reason)."""


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


Event = Callable[[str, dict], None]


def replay_folder(settings: Settings, model: str, preset: Preset) -> Path:
    return settings.replays_dir / model / preset.name


def reference_file(settings: Settings, model: str, preset: Preset, mode: str, steps: int, seed: int) -> Path:
    return replay_folder(settings, model, preset) / f"{mode}-s{steps}-seed{seed}.json"


def base_path(settings: Settings, model: str, preset: Preset) -> Path:
    return replay_folder(settings, model, preset) / f"base-seed{BASE_SEED}.pt"


@cache
def _code_digest() -> str:
    """The replay code and the references of every block a replay model may call, as sources: computed once per
    process."""
    h = hashlib.sha256()
    for module in (arch_module, data_module, model_module, train_module):
        h.update(inspect.getsource(module).encode())
    for block in CALLABLE:
        h.update(get_block(block).reference_source().encode())
    h.update(torch.__version__.encode())
    return h.hexdigest()


def reference_key(preset: Preset, arch: Architecture, mode: str, steps: int, seed: int, base: Path | None) -> str:
    h = hashlib.sha256(json.dumps([preset.to_dict(), arch.to_dict(), mode, steps, seed], sort_keys=True).encode())
    h.update(_code_digest().encode())
    if base is not None:
        h.update(base.read_bytes())
    return h.hexdigest()[:32]


def training_job(task: str, preset: Preset, arch: Architecture, mode: str, steps: int, seed: int,
                 ops: dict[str, str], backend: Backend, base: Path | None, layout: Layout | None = None,
                 rank_ops: dict[int, dict[str, str]] | None = None,
                 collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S, mtp: bool = False) -> dict:
    """The job a training process reads (see workbench.replay.child; with a distributed layout,
    workbench.replay.launcher and workbench.replay.distributed: its ranks, each rank's own ops)."""
    job = {"task": task, "preset": preset.name, "arch": arch.to_dict(), "mode": mode, "steps": steps, "seed": seed,
           "ops": ops, "device": backend.device, "base": str(base) if base else None}
    if mtp:
        job["mtp"] = True
    if layout is not None:
        job.update(layout=layout.to_dict(), rank_ops={str(r): o for r, o in (rank_ops or {}).items()},
                   collective_timeout_s=collective_timeout_s)
    return job


def launch(job: dict, backend: Backend, timeout_s: float, on_step: Callable[[int, float, float], None] | None = None
           ) -> RunResult:
    """Train in a child process (the backend's environment, e.g. the Triton interpreter); raises ReplayError."""
    return RunResult(**launch_process(job, backend, timeout_s, on_step)["result"])


def launch_process(job: dict, backend: Backend, timeout_s: float,
                   on_step: Callable[[int, float, float], None] | None = None) -> dict:
    """The training process's "done" event: one child, or the launcher of the job's ranks when its layout is
    distributed (the overall timeout covers every rank: the whole process group is killed). Raises ReplayError."""
    entry = LAUNCHER if job.get("layout", {}).get("ranks", 1) > 1 else CHILD
    base = Path(job["base"]).parent if job.get("base") else None
    files = [operator_file(target) for target in job["ops"].values()]
    files += [operator_file(t) for ops in job.get("rank_ops", {}).values() for t in ops.values()]
    readable = [Path(f).parent for f in files if f is not None] + ([base] if base else [])
    writable = [base] if base and job["task"] == "base" else []  # the base checkpoint is written beside the curves
    for folder in writable:
        folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="replay-") as scratch, tempfile.TemporaryFile() as stderr:
        # the operators' own temporary files and Triton's cache: the only other place the child may write
        job = {**job, "writable": [str(p) for p in writable] + [scratch]}
        env = {**child_env(backend.env), "TMPDIR": scratch, "TRITON_CACHE_DIR": str(Path(scratch) / "triton-cache")}
        command = child_command([sys.executable, "-m", entry], memory_bytes=None,
                                timeout_s=timeout_s, writable=[*writable, Path(scratch)], readable=readable,
                                cwd=Path.cwd())
        proc = subprocess.Popen(command, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=stderr, env=env, text=True, start_new_session=True)
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            _kill_group(proc)

        timer = threading.Timer(timeout_s, expire)
        timer.start()
        done, error, last_step = None, None, -1
        try:
            proc.stdin.write(json.dumps(job))
            proc.stdin.close()
            for line in proc.stdout:
                if not line.startswith(MARK):
                    continue
                event = json.loads(line[len(MARK):])
                if event["event"] == "step":
                    last_step = event["step"]
                    if on_step:
                        on_step(event["step"], event["loss"], event["seconds"])
                elif event["event"] == "done":
                    done = event
                elif event["event"] == "error":
                    error = event["message"]
            code = proc.wait()
        finally:
            timer.cancel()
            _kill_group(proc)
        if done is not None and code == 0:
            return done
        if error:
            raise ReplayError(f"training failed at step {last_step + 1}: {error}")
        if timed_out.is_set():
            raise ReplayError(f"training timed out after {timeout_s:.0f} s (at step {last_step + 1})")
        stderr.seek(0)
        tail = stderr.read().decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise ReplayError(f"the training process died (exit {code}) at step {last_step + 1}: {tail[0][:300]}")


def _kill_group(proc: subprocess.Popen) -> None:
    """The child and everything it started (its own session: the ranks of a distributed replay) stopped."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def ensure_base(settings: Settings, model: str, preset: Preset, arch: Architecture, backend: Backend,
                timeout_s: float, on_event: Event | None = None) -> Path:
    """The LoRA base checkpoint: trained once with reference blocks (preset.base_steps scratch steps) and kept beside
    the reference curves, so a replay needs no download."""
    path = base_path(settings, model, preset)
    meta = path.with_suffix(".json")
    key = reference_key(preset, arch, "base", preset.base_steps, BASE_SEED, None)
    if path.is_file() and meta.is_file() and json.loads(meta.read_text()).get("key") == key:
        return path
    if on_event:
        on_event("base", {"path": str(path), "steps": preset.base_steps})
    job = training_job("base", preset, arch, "scratch", preset.base_steps, BASE_SEED, reference_ops(arch.blocks),
                       backend, path)
    result = launch(job, backend, timeout_s)
    meta.write_text(json.dumps({"key": key, "steps": preset.base_steps, "final_loss": result.curve[-1],
                                "curve": result.curve}, indent=1) + "\n")
    return path


def reference_run(settings: Settings, model: str, preset: Preset, arch: Architecture, mode: str, steps: int,
                  seed: int, backend: Backend, timeout_s: float, *, rerun: bool = False,
                  on_event: Event | None = None, mtp: bool = False) -> tuple[RunResult, str, dict]:
    """(result, where it came from: store | file | run, facts: key, with MTP the reference MTP curve, and, for a
    run, the repeat check). With ``mtp`` the reference trains the MTP model (workbench.replay.mtp): a key and a
    repository file (``<mode>-mtp-s<steps>-seed<seed>.json``) of its own."""
    base = ensure_base(settings, model, preset, arch, backend, timeout_s, on_event) if mode == "lora" else None
    key = reference_key(preset, arch, mode, steps, seed, base)
    if mtp:
        key = hashlib.sha256("".join([key, *mtp_module.source_digest_parts()]).encode()).hexdigest()[:32]
    label = f"{mode}-mtp" if mtp else mode
    engine = get_engine(settings.db_url)
    if not rerun:
        stored = records.find_reference_replay(engine, model, key)
        if stored is not None:
            return _run_result(stored), "store", _reference_facts(key, stored)
        path = reference_file(settings, model, preset, label, steps, seed)
        if path.is_file():
            shipped = json.loads(path.read_text())
            if shipped.get("key") == key:
                records.save_reference_replay(engine, model=model, mode=mode, preset=preset.name, seed=seed,
                                              backend=backend.name, key=key, result=shipped["result"])
                return _run_result(shipped["result"]), "file", _reference_facts(key, shipped["result"])
    if on_event:
        on_event("reference", {"steps": steps})
    job = training_job("train", preset, arch, mode, steps, seed, reference_ops(arch.blocks), backend, base, mtp=mtp)
    first, second = (_reference_payload(launch_process(job, backend, timeout_s)) for _ in range(2))
    identical = _same(_run_result(first), _run_result(second)) and first.get("mtp_curve") == second.get("mtp_curve")
    if not identical:
        raise ReplayError("the reference run is not reproducible: two runs from the same seed differ "
                          f"(first difference at step {_first_difference(_run_result(first), _run_result(second))})")
    records.save_reference_replay(engine, model=model, mode=mode, preset=preset.name, seed=seed,
                                  backend=backend.name, key=key, result=first)
    return _run_result(first), "run", {**_reference_facts(key, first), "repeat_identical": identical}


def _reference_payload(done: dict) -> dict:
    """A training process's result as a reference keeps it: the RunResult's fields, and the MTP curve if any."""
    return {**done["result"], **({"mtp_curve": done["mtp_curve"]} if "mtp_curve" in done else {})}


def _reference_facts(key: str, result: dict) -> dict:
    return {"key": key, **({"reference_mtp_curve": result["mtp_curve"]} if "mtp_curve" in result else {})}


def layout_reference_run(settings: Settings, model: str, preset: Preset, arch: Architecture, mode: str, steps: int,
                         seed: int, backend: Backend, layout: Layout, timeout_s: float, collective_timeout_s: float,
                         base: Path | None, reference_key_: str, *, rerun: bool = False,
                         on_event: Event | None = None) -> tuple[RunResult, list[list[float]], str]:
    """The reference blocks trained under ``layout`` (once, then kept in the store under a key of its own): what
    each rank's local loss should be, so a replay that leaves its band names the rank. Returns (result, rank
    curves, where it came from: store | run)."""
    key = hashlib.sha256(json.dumps([reference_key_, layout.ranks, layout.sharding, layout.experts]).encode()) \
        .hexdigest()[:32]
    engine = get_engine(settings.db_url)
    stored = None if rerun else records.find_reference_replay(engine, model, key)
    if stored is not None:
        return _run_result(stored), stored["rank_curves"], "store"
    if on_event:
        on_event("layout_reference", {"steps": steps, "ranks": layout.ranks})
    job = training_job("train", preset, arch, mode, steps, seed, reference_ops(arch.blocks), backend, base,
                       Layout(layout.ranks, layout.sharding, layout.experts), None, collective_timeout_s)
    done = launch_process(job, backend, timeout_s)
    records.save_reference_replay(engine, model=model, mode=mode, preset=preset.name, seed=seed,
                                  backend=backend.name, key=key,
                                  result={**done["result"], "rank_curves": done["rank_curves"]})
    return RunResult(**done["result"]), done["rank_curves"], "run"


def _run_result(stored: dict) -> RunResult:
    return RunResult(**{f.name: stored[f.name] for f in fields(RunResult) if f.name in stored})


def _same(a: RunResult, b: RunResult) -> bool:
    return (a.curve, a.fingerprints, a.topk_values, a.topk_ids) == (b.curve, b.fingerprints, b.topk_values, b.topk_ids)


def _first_difference(a: RunResult, b: RunResult) -> int:
    for i, (x, y) in enumerate(zip(a.curve, b.curve, strict=False)):
        if x != y:
            return i
    return min(len(a.curve), len(b.curve))


def export_reference(settings: Settings, model: str, preset: Preset, mode: str, steps: int, seed: int, key: str,
                     result: RunResult, mtp_curve: list[float] | None = None) -> Path:
    """Write the reference run to the repository file CI compares against (with MTP: its own file, the MTP curve in
    its result)."""
    path = reference_file(settings, model, preset, f"{mode}-mtp" if mtp_curve is not None else mode, steps, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = {"mtp_curve": mtp_curve} if mtp_curve is not None else {}
    payload = {"key": key, "model": model, "preset": preset.name, "mode": mode, "steps": steps, "seed": seed,
               "torch": torch.__version__, "result": {**asdict(result), **extra}}
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


@dataclass
class ReplayPlan:
    """A validated replay request: nothing is run or recorded until ``execute``. layout: ranks, sharding, expert
    placement and the cached blocks; rank_ops: {rank: {block: target}} that one rank runs instead (a defect on one
    rank, to test what the replay catches)."""

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


def plan_replay(model: str, mode: str, settings: Settings, *, preset: str = "tiny", steps: int | None = None,
                ops: list[str] | None = None, seed: int = 0, backend: Backend | None = None, ranks: int = 1,
                layout: str | None = None, cache: str | None = None,
                rank_ops: dict[int, list[str]] | None = None, mtp: bool = False, chunks: int = 1) -> ReplayPlan:
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
    per_rank = {}
    for rank, words in (rank_ops or {}).items():
        if not 0 <= rank < spread.ranks:
            raise WorkbenchError(f"--rank-ops: no rank {rank} among {spread.ranks}")
        changed = resolve_ops(["reference", *words], settings.operators_dir, arch.blocks)
        named = {w.partition("=")[0] for w in words}
        per_rank[rank] = {b: t for b, t in changed.items() if b in named}
    return ReplayPlan(model, mode, p, arch, steps, seed, chosen, backend or get_backend(), spread, per_rank, mtp)


def run_replay(model: str, mode: str, settings: Settings, *, preset: str = "tiny", steps: int | None = None,
               ops: list[str] | None = None, seed: int = 0, backend: Backend | None = None,
               timeout_s: float = DEFAULT_TIMEOUT_S, rerun_reference: bool = False, export: bool = False,
               plot: Path | None = None, on_event: Event | None = None, ranks: int = 1, layout: str | None = None,
               cache: str | None = None, rank_ops: dict[int, list[str]] | None = None,
               collective_timeout_s: float | None = None, mtp: bool = False, chunks: int = 1) -> ReplayOutcome:
    """Plan and execute a replay (see plan_replay and execute)."""
    plan = plan_replay(model, mode, settings, preset=preset, steps=steps, ops=ops, seed=seed, backend=backend,
                       ranks=ranks, layout=layout, cache=cache, rank_ops=rank_ops, mtp=mtp, chunks=chunks)
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
    that hung (default: the smaller of 300 s and half of timeout_s)."""
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

    job = training_job("train", p, arch, mode, steps, seed, plan.chosen, backend, base,
                       layout if layout.distributed or layout.cache else None, plan.rank_ops, collective_timeout_s,
                       plan.mtp)
    detail = {"reference_source": source, **facts, "reference_seconds_per_step": reference.seconds_per_step}
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
        verdict = _judge_layout(verdict, result, reference, done["rank_curves"], layout_reference, p, detail)
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
                         str(plot_path), verdict.checks)


def _judge_layout(verdict: Judgement, result: RunResult, reference: RunResult, rank_curves: list[list[float]],
                  layout_reference: tuple[RunResult, list[list[float]], str], preset: Preset, detail: dict
                  ) -> Judgement:
    """The single-process verdict with the ranks' check added: each rank's local loss inside the band of the layout
    reference's; the layout reference's own distance from the single-process reference recorded beside it."""
    layout_result, reference_rank_curves, layout_source = layout_reference
    ranks = judge_ranks(rank_curves, reference_rank_curves, preset)
    equivalence = judge(layout_result, reference, preset)
    detail.update(rank_curves=rank_curves, layout_reference_source=layout_source,
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

