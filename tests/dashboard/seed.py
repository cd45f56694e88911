"""A small, realistic store for the dashboard tests: a promoted rmsnorm run (a failing then a passing candidate, with
checks and an operator), a blocked situ run, a running rmsnorm run, a loss replay and two CI jobs.

Runs, steps, candidates and checks go through workbench.store.records; the loss replay and the CI jobs are added
as rows, with the fixed timestamps the tests read back."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlmodel import select

from workbench.operators import promote_file
from workbench.store import CIJob, LossReplay, get_engine, session_scope
from workbench.store.models import Benchmark, Candidate, PortRun, RunStep
from workbench.store.records import (
    add_candidate,
    add_step,
    add_tune_trials,
    finish_run,
    record_verification,
    set_candidate_status,
    start_run,
)
from workbench.verify.result import Check, VerificationResult

MODEL = "kimi-k3.1-pro"
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)

SOURCE = '''"""rmsnorm, template row_block: BLOCK_N={block_n}, ACC_DTYPE={acc}."""
import torch
import triton
import triton.language as tl

BLOCK = "rmsnorm"


@triton.jit
def rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.{acc})
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * N + cols, x * rstd * w, mask=mask)


def run(x, weight, eps=1e-6):
    ...
'''


@dataclass
class Seeded:
    db_url: str
    operators_dir: Path
    promoted_run: str
    blocked_run: str
    running_run: str
    candidates: list[int]
    replay_id: int
    ci_jobs: list[int]


def _check(shape: str, dtype: str, direction: str, max_abs: float, bound: float, seed: int = 0,
           suite: str = "smoke") -> Check:
    passed = max_abs <= bound
    return Check(suite=suite, shape=shape, dtype=dtype, seed=seed, direction=direction, passed=passed,
                 reason="" if passed else f"max abs err {max_abs:.2e} > bound {bound:.2e}", max_abs=max_abs,
                 max_rel=max_abs * 3, err_ratio=max_abs / bound * 0.4, ref_err=bound / 3, bound=bound)


def _checks(fp16_scale: float) -> list[Check]:
    checks = []
    for suite, shape in (("smoke", "rows=4,N=64"), ("edge", "rows=1,N=123"), ("edge", "rows=7,N=4097")):
        checks += [_check(shape, "float32", "forward:y", 1.2e-7, 4.8e-6, suite=suite),
                   _check(shape, "float32", "grad:x", 3.1e-7, 9.5e-6, suite=suite),
                   _check(shape, "float16", "forward:y", 2.4e-4 * fp16_scale, 2.0e-3, suite=suite),
                   _check(shape, "float16", "grad:x", 6.0e-4 * fp16_scale, 3.9e-3, seed=1, suite=suite)]
    return checks


def _candidate(engine, run_id: str | None, block: str, iteration: int, template: str, params: dict, source: str,
               folder: Path) -> int:
    path = folder / f"{block}_{template}_{iteration}.py"
    path.write_text(source)
    return add_candidate(engine, block=block, source=source, source_hash=f"{block}-{iteration}-{len(source)}",
                         path=str(path), run_id=run_id, iteration=iteration, template=template, params=params)


def _verify(engine, cid: int, block: str, verdict: str, message: str, checks: list[Check],
            builds: list[dict] = ()) -> None:
    record_verification(engine, cid, VerificationResult(block=block, candidate="", source_hash="", seconds=4.2,
                                                        backend="interpreter", verdict=verdict, message=message,
                                                        checks=checks, targets=sorted({b["target"] for b in builds}),
                                                        builds=list(builds)))


def _build(target: str, kernel: str, spilled: int) -> dict:
    """What a target's compiler said about one kernel (the fields of workbench.verify.aot.KernelBuild)."""
    return {"kernel": kernel, "target": target, "suite": "model", "specialization": {}, "ok": True, "error": "",
            "registers": 255 if spilled else 121, "spilled_bytes": spilled, "shared_bytes": 16, "num_warps": 4,
            "num_stages": 3, "ctas_per_sm": 2 if spilled else 4, "uses_dot": False, "tensor_cores": None,
            "seconds": 0.5, "cached": False}


def _backdate(engine, run_id: str, start: datetime, finished: bool) -> None:
    """Spread a run, its steps and its candidates over time after start (a chart over time has something to show)."""
    with session_scope(engine) as s:
        run = s.get(PortRun, run_id)
        steps = list(s.exec(select(RunStep).where(RunStep.run_id == run_id)))
        for step in steps:
            step.at = start + timedelta(seconds=20 * step.seq)
        candidates = s.exec(select(Candidate).where(Candidate.run_id == run_id).order_by(Candidate.id))
        for i, cand in enumerate(candidates):
            cand.created_at = start + timedelta(seconds=60 * (i + 1))
        run.started_at = start
        if finished:
            run.finished_at = start + timedelta(seconds=20 * (len(steps) + 1))


CI_REGRESSION = ("rmsnorm grad:x float16: passed before, now fails: grad:x [rows=7,N=4097] float16 seed 0: max abs "
                 "err 5.40e-03 > bound 3.90e-03")


def _ci_summary(operator: str, failing: tuple[str, ...]) -> dict:
    """A job summary as workbench.ci writes it."""
    keys = ["sandbox", "integrity"] + [f"{d} {t}" for t in ("float32", "float16") for d in ("forward:y", "grad:x")]
    checks = {key: key not in failing for key in keys}
    entry = {"operator": operator, "source_hash": "rmsnorm-2", "verdict": "fail" if failing else "pass",
             "worst_ratio": 1.38 if failing else 0.0769, "checks": checks}
    return {"operators": {"rmsnorm": entry}, "regressions": [CI_REGRESSION] if failing else [], "seed": 20261129,
            "changed_only": False}


def _benchmarks() -> list[Benchmark]:
    """rmsnorm at two widths: modelled on sm_90a twice (a spill penalty, then none), measured on an H200 once
    for the operator and the eager reference."""
    rows = []
    for minutes, spill in ((30, 1.37), (45, 1.0)):
        for shape, floor in (("rows=8192,N=7168", 0.061), ("rows=8192,N=128", 0.002)):
            rows += [Benchmark(block="rmsnorm", backend="sm_90a", shape=shape, dtype="bfloat16", metric=metric,
                               value=value, unit=unit, label="modelled", subject="operator",
                               created_at=T0 + timedelta(minutes=minutes))
                     for metric, value, unit in (("time:fwd+bwd", floor * spill, "ms"), ("floor:fwd+bwd", floor, "ms"))]
    for subject, ratio in (("operator", 1.25), ("eager", 4.0)):
        rows += [Benchmark(block="rmsnorm", backend="sm_90a", shape="rows=8192,N=7168", dtype="bfloat16",
                           metric=metric, value=value, unit="ms", label="measured", subject=subject,
                           created_at=T0 + timedelta(minutes=50))
                 for metric, value in (("time:fwd+bwd", 0.061 * ratio), ("floor:fwd+bwd", 0.061))]
    return rows


def _trial(probe: int, target: str, warps: int, registers: int, spilled: int, time_ms: float, moved: bool,
           why: str) -> dict:
    """A tuning trial as workbench.agent.tune.Trial.to_dict writes it."""
    return {"probe": probe, "target": target, "params": {"BLOCK_N": 8192, "ACC_DTYPE": "float32"},
            "settings": {"num_warps": warps}, "ok": True, "spilled_bytes": spilled, "registers": registers,
            "time_ms": time_ms, "measured": False, "error": "", "moved": moved, "why": why}


def seed(tmp: Path, db_url: str | None = None) -> Seeded:
    """Seed a fresh database (a SQLite file under tmp unless db_url names an empty one) and an operators folder under
    tmp; returns what was written."""
    tmp.mkdir(parents=True, exist_ok=True)
    db_url = db_url or f"sqlite:///{tmp / 'workbench.db'}"
    operators_dir, work = tmp / "operators", tmp / "candidates"
    work.mkdir(exist_ok=True)
    engine = get_engine(db_url)
    common = {"proposer": "search", "backend": "interpreter", "model": MODEL,
              "config": {"suites": ["smoke", "edge"], "dtypes": ["float32", "float16"], "seeds": 2}}

    # rmsnorm: precision failure, repaired, promoted
    run = start_run(engine, block="rmsnorm", budget=4, **common)
    add_step(engine, run, "plan", "templates: row_block (rank 1), col_tiled (rank 2); verify smoke+edge x "
             "float32/float16 x 2 seeds on interpreter; budget 4 candidates")
    bad = _candidate(engine, run, "rmsnorm", 1, "row_block", {"BLOCK_N": 8192, "ACC_DTYPE": "float16"},
                     SOURCE.format(block_n=8192, acc="float16"), work)
    add_step(engine, run, "render", "#1 row_block: BLOCK_N=8192, ACC_DTYPE=float16 - user start point",
             {"candidate_id": bad})
    add_step(engine, run, "contract", "ok: parses, BLOCK = \"rmsnorm\" and run(x, weight, eps)")
    _verify(engine, bad, "rmsnorm", "fail", "6 of 12 checks failed (float16)", _checks(fp16_scale=9.0))
    add_step(engine, run, "verify", "fail: 6 of 12 checks failed (float16) (4.2 s)")
    add_step(engine, run, "diagnose", "precision: float16 errors up to 1.4x the bound while float32 passes; the sum "
             "of squares accumulates in float16", {"class": "precision"})
    add_step(engine, run, "revise", "next: row_block BLOCK_N=8192, ACC_DTYPE=float32 - accumulate in float32")
    good = _candidate(engine, run, "rmsnorm", 2, "row_block", {"BLOCK_N": 8192, "ACC_DTYPE": "float32"},
                      SOURCE.format(block_n=8192, acc="float32"), work)
    add_step(engine, run, "render", "#2 row_block: BLOCK_N=8192, ACC_DTYPE=float32 - accumulate in float32",
             {"candidate_id": good})
    add_step(engine, run, "contract", "ok: parses, BLOCK = \"rmsnorm\" and run(x, weight, eps)")
    _verify(engine, good, "rmsnorm", "pass", "12 checks pass", _checks(fp16_scale=0.5),
            [_build("sm_90a", "rmsnorm_fwd_kernel", 0), _build("sm_90a", "rmsnorm_bwd_kernel", 376),
             _build("gfx942", "rmsnorm_fwd_kernel", 0), _build("gfx942", "rmsnorm_bwd_kernel", 0)])
    add_step(engine, run, "verify", "pass: 12 checks pass (4.2 s)")
    add_step(engine, run, "tune", "tuned #2: 2 compile-only probes, 3 s: sm_90a num_warps=8")
    add_tune_trials(engine, run, "rmsnorm", "row_block", [
        _trial(1, "sm_90a", 4, 255, 376, 0.21, True, "the passing point: 255 registers, spills 376 B"),
        _trial(1, "gfx942", 4, 120, 0, 0.12, True, "the passing point: 120 registers, spill-free"),
        _trial(2, "sm_90a", 8, 168, 0, 0.15, True, "num_warps 4 -> 8: 168 registers, spill-free, better"),
        _trial(2, "gfx942", 8, 64, 0, 0.12, False, "num_warps 4 -> 8: 64 registers, spill-free, no faster")])
    dest = promote_file(work / "rmsnorm_row_block_2.py", operators_dir, "rmsnorm",
                        {"block": "rmsnorm", "template": "row_block", "run_id": run, "candidate_id": good,
                         "promoted_at": (T0 + timedelta(minutes=5)).isoformat()})
    add_step(engine, run, "promote", f"promoted row_block (BLOCK_N=8192, ACC_DTYPE=float32) -> {dest}")
    finish_run(engine, run, "promoted", "promoted row_block (BLOCK_N=8192, ACC_DTYPE=float32), worst error 0.08 of "
               "the bound", operator_path=str(dest), best_candidate_id=good)
    add_step(engine, run, "record", "promoted")
    _backdate(engine, run, T0, finished=True)

    # situ: a compile error, a runtime error, budget spent
    blocked = start_run(engine, block="situ", budget=2, **common)
    add_step(engine, blocked, "plan", "templates: rows (rank 1), flat (rank 2); budget 2 candidates")
    broken = _candidate(engine, blocked, "situ", 1, "rows", {"BLOCK_N": 128}, "BLOCK = 'situ'\ndef run(:\n", work)
    set_candidate_status(engine, broken, "compile_error", "SyntaxError: invalid syntax (line 2)")
    add_step(engine, blocked, "contract", "compile_error: SyntaxError: invalid syntax (line 2)")
    add_step(engine, blocked, "diagnose", "compile_error: the template's code is suspect; try another template")
    crash = _candidate(engine, blocked, "situ", 2, "flat", {"BLOCK_SIZE": 1024},
                       "BLOCK = 'situ'\ndef run(gate_up, beta, linear_beta):\n    raise RuntimeError('boom')\n", work)
    _verify(engine, crash, "situ", "runtime_error", "RuntimeError: boom",
            [Check(suite="smoke", shape="rows=4,N=64", dtype="float32", seed=0, direction="run", passed=False,
                   reason="RuntimeError: boom")])
    add_step(engine, blocked, "verify", "runtime_error: RuntimeError: boom (0.8 s)")
    add_step(engine, blocked, "revise", "budget of 2 candidates spent")
    finish_run(engine, blocked, "blocked", "budget of 2 candidates spent; no passing candidate in 2",
               best_candidate_id=crash)
    _backdate(engine, blocked, T0 + timedelta(minutes=20), finished=True)

    # rmsnorm again, still running (its pid is this process)
    running = start_run(engine, block="rmsnorm", budget=6, **common)
    add_step(engine, running, "plan", "templates: row_block (rank 1), col_tiled (rank 2); budget 6 candidates")
    tiled = _candidate(engine, running, "rmsnorm", 1, "col_tiled", {"TILE_N": 256},
                       SOURCE.format(block_n=256, acc="float32").replace("row_block", "col_tiled"), work)
    add_step(engine, running, "render", "#1 col_tiled: TILE_N=256 - explore a second template",
             {"candidate_id": tiled})
    _backdate(engine, running, T0 + timedelta(minutes=40), finished=False)

    steps = 60
    reference = [2.0 + 8.0 * math.exp(-i / 12) + 0.05 * math.sin(i) for i in range(steps)]
    operator = [r * (1 + 0.01 * math.cos(3 * i)) for i, r in enumerate(reference)]
    with session_scope(engine) as s:
        replay = LossReplay(model=MODEL, mode="scratch", preset="tiny", seed=0, status="pass",
                            reason="inside the 5% band at every step; final loss within 0.4%",
                            ops={"rmsnorm": str(dest), "band": 0.05}, curve=operator, reference_curve=reference,
                            layout={"ranks": 2, "sharding": "fsdp2", "experts": "ep", "cache": ["kda"],
                                    "rank_ops": {}},
                            created_at=T0 + timedelta(minutes=50))
        good_job = CIJob(commit="4f1c2ab", status="passed", junit_path="junit.xml",
                         summary=_ci_summary(dest.name, failing=()),
                         started_at=T0 + timedelta(minutes=55), finished_at=T0 + timedelta(minutes=57))
        bad_job = CIJob(commit="9e8d7c6", status="failed", junit_path="junit.xml",
                        summary=_ci_summary(dest.name, failing=("grad:x float16",)),
                        started_at=T0 + timedelta(minutes=60), finished_at=T0 + timedelta(minutes=63))
        s.add_all([replay, good_job, bad_job])
        s.add_all(_benchmarks())
        s.flush()
        ids = replay.id, [good_job.id, bad_job.id]
    return Seeded(db_url=db_url, operators_dir=operators_dir, promoted_run=run, blocked_run=blocked,
                  running_run=running, candidates=[bad, good, broken, crash, tiled], replay_id=ids[0],
                  ci_jobs=ids[1])
