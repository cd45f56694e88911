"""Reads shared by the CLI and the dashboard: runs, their steps and candidates, the port status of blocks, and (for the
dashboard) the same as pandas DataFrames plus loss replays and CI jobs. Nothing here writes."""

from __future__ import annotations

import json
import re
import socket
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import and_, case, func
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from workbench.blocks import REGISTRY
from workbench.operators import evidence, evidence_line, list_promoted
from workbench.store.models import (
    Benchmark,
    Candidate,
    CIJob,
    KernelBuild,
    LossReplay,
    PortRun,
    RunStep,
    VerificationCheck,
)
from workbench.store.records import process_alive
from workbench.templating import list_templates
from workbench.vocabulary import BlockStatus, RunStatus, key_values

# The statuses a block of a model card can have, in the order a port goes through them.
STATUSES = tuple(BlockStatus)


def list_runs(engine: Engine, limit: int = 50, block: str | None = None) -> list[PortRun]:
    with Session(engine) as s:
        query = select(PortRun).order_by(PortRun.started_at.desc()).limit(limit)
        if block:
            query = query.where(PortRun.block == block)
        return list(s.exec(query))


def find_run(engine: Engine, run_id: str) -> PortRun | None:
    """The run with this id, or the only one whose id starts with it."""
    with Session(engine) as s:
        run = s.get(PortRun, run_id)
        if run:
            return run
        matches = list(s.exec(select(PortRun).where(PortRun.id.startswith(run_id)).limit(2)))
        return matches[0] if len(matches) == 1 else None


def run_steps(engine: Engine, run_id: str) -> list[RunStep]:
    with Session(engine) as s:
        return list(s.exec(select(RunStep).where(RunStep.run_id == run_id).order_by(RunStep.seq)))


def run_candidates(engine: Engine, run_id: str) -> list[Candidate]:
    with Session(engine) as s:
        return list(s.exec(select(Candidate).where(Candidate.run_id == run_id).order_by(Candidate.iteration)))


def candidate_checks(engine: Engine, candidate_id: int) -> list[VerificationCheck]:
    with Session(engine) as s:
        return list(s.exec(select(VerificationCheck).where(VerificationCheck.candidate_id == candidate_id)))


def block_status(engine: Engine, operators_dir: Path, block: str) -> tuple[str, str]:
    """(status, detail) of one block: promoted operators first, then the latest run, else not started."""
    if block not in REGISTRY:
        return BlockStatus.NO_SPEC, ""
    promoted = list_promoted(operators_dir, block)
    if promoted:
        return BlockStatus.PROMOTED, f"{Path(promoted[0]['path']).name}: {evidence_line(promoted[0])}"
    runs = list_runs(engine, limit=1, block=block)
    if not runs:
        return BlockStatus.NOT_STARTED, f"{len(list_templates(block))} templates"
    run = runs[0]
    # a promoted run whose operator file is gone still passed its numerics
    renamed = {RunStatus.RUNNING: BlockStatus.IN_PROGRESS, RunStatus.INTERRUPTED: BlockStatus.BLOCKED,
               RunStatus.PROMOTED: BlockStatus.NUMERICS_PASS, RunStatus.WAITING_APPROVAL: BlockStatus.NUMERICS_PASS,
               RunStatus.REJECTED: BlockStatus.BLOCKED, RunStatus.BLOCKED: BlockStatus.BLOCKED,
               RunStatus.FAILED: BlockStatus.FAILED}
    status = renamed.get(run.status, run.status)
    return status, f"run {run.id}: {run.reason or run.status}"


# --- dashboard reads: plain data and pandas DataFrames (pandas is imported lazily to keep the CLI quick) ------------

RUN_COLUMNS = ["id", "block", "model", "status", "proposer", "backend", "budget", "steps", "candidates", "started_at",
               "finished_at", "seconds", "reason", "last_step", "process", "resumes"]
STEP_COLUMNS = ["seq", "at", "node", "message", "data"]
CANDIDATE_COLUMNS = ["id", "run_id", "iteration", "template", "params", "status", "worst_ratio", "verify_seconds",
                     "checks", "failed", "created_at", "message", "path"]
CHECK_COLUMNS = ["suite", "shape", "dtype", "seed", "direction", "passed", "reason", "max_abs", "max_rel", "err_ratio",
                 "ref_err", "bound", "nonfinite", "backend"]
CHECK_SUMMARY_COLUMNS = ["suite", "shape", "dtype", "direction", "verdict", "checks", "failed", "max_abs", "bound",
                         "err_ratio", "max_rel", "nonfinite", "reason"]
REPLAY_COLUMNS = ["id", "model", "mode", "preset", "seed", "status", "steps", "final_loss", "reference_final_loss",
                  "band", "left_band_step", "reason", "ops", "created_at"]
CI_COLUMNS = ["id", "commit", "status", "started_at", "finished_at", "seconds", "operators", "passing", "checks",
              "failed_checks", "regressions", "junit_path", "summary"]


def _frame(rows: list[dict], columns: list[str], times: tuple[str, ...] = ()):
    """A DataFrame with these columns even when empty; naive timestamps (stored UTC) become UTC-aware."""
    import pandas as pd

    df = pd.DataFrame(rows, columns=columns)
    for col in times:
        df[col] = pd.to_datetime(df[col], utc=True)
    return df


def _aware(at: datetime | None) -> datetime | None:
    return at.replace(tzinfo=UTC) if at is not None and at.tzinfo is None else at


def format_params(params: dict | None) -> str:
    return key_values(params or {})


def _process_state(status: str, host: str, pid: int | None) -> str:
    """For a running run: whether its agent process is alive (only knowable on its own host); read-only."""
    if status != "running":
        return ""
    if host and host != socket.gethostname():
        return f"on {host}"
    return "alive" if pid is not None and process_alive(pid) else "gone"


def known_blocks(engine: Engine) -> list[str]:
    """Blocks with a spec, then any other block named by a run or a candidate."""
    with Session(engine) as s:
        recorded = set(s.exec(select(PortRun.block).distinct())) | set(s.exec(select(Candidate.block).distinct()))
    return list(REGISTRY) + sorted(recorded - set(REGISTRY))


def model_plan(engine: Engine, operators_dir: str | Path, model: str):
    """Each block a model card needs: block, role, status, evidence (the strongest level a promoted operator
    reaches, workbench.operators.EVIDENCE; "" otherwise), detail, model sizes (DataFrame, the card's order)."""
    from workbench.models import get_model

    card, operators_dir = get_model(model), Path(operators_dir)
    rows = []
    for name, info in card.blocks.items():
        status, detail = block_status(engine, operators_dir, name)
        promoted = list_promoted(operators_dir, name) if name in REGISTRY else []
        sizes = "; ".join(key_values(shape, ",") for shape in card.block_shapes(name))
        rows.append({"block": name, "role": info.get("role", ""), "status": status,
                     "evidence": evidence(promoted[0])["strongest"] if promoted else "", "detail": detail,
                     "sizes": sizes})
    return _frame(rows, ["block", "role", "status", "evidence", "detail", "sizes"])


def runs_frame(engine: Engine, limit: int = 100, block: str | None = None, status: str | None = None):
    """Runs newest first with their step and candidate counts, last step, how often each was resumed and, for
    running ones, their process."""
    with Session(engine) as s:
        query = select(PortRun).order_by(PortRun.started_at.desc()).limit(limit)
        if block:
            query = query.where(PortRun.block == block)
        if status:
            query = query.where(PortRun.status == status)
        runs = list(s.exec(query))
        ids = [r.id for r in runs]
        steps = dict(s.exec(select(RunStep.run_id, func.count()).where(RunStep.run_id.in_(ids))
                            .group_by(RunStep.run_id)).all())
        candidates = dict(s.exec(select(Candidate.run_id, func.count()).where(Candidate.run_id.in_(ids))
                                 .group_by(Candidate.run_id)).all())
        resumes = dict(s.exec(select(RunStep.run_id, func.count())
                              .where(RunStep.run_id.in_(ids), RunStep.node == "resume")
                              .group_by(RunStep.run_id)).all())
        latest = (select(RunStep.run_id, func.max(RunStep.seq).label("seq")).where(RunStep.run_id.in_(ids))
                  .group_by(RunStep.run_id).subquery())
        last = {run_id: f"{node}: {message}" for run_id, node, message in s.exec(
            select(RunStep.run_id, RunStep.node, RunStep.message)
            .join(latest, and_(RunStep.run_id == latest.c.run_id, RunStep.seq == latest.c.seq)))}
        now = datetime.now(UTC)
        rows = [{"id": r.id, "block": r.block, "model": r.model, "status": r.status, "proposer": r.proposer,
                 "backend": r.backend, "budget": r.budget, "steps": steps.get(r.id, 0),
                 "candidates": candidates.get(r.id, 0), "started_at": r.started_at, "finished_at": r.finished_at,
                 "seconds": ((_aware(r.finished_at) or now) - _aware(r.started_at)).total_seconds(),
                 "reason": r.reason, "last_step": last.get(r.id, ""),
                 "process": _process_state(r.status, r.host, r.pid), "resumes": resumes.get(r.id, 0)}
                for r in runs]
    return _frame(rows, RUN_COLUMNS, times=("started_at", "finished_at"))


def run_info(engine: Engine, run_id: str) -> dict | None:
    """One run as a plain dict (None if there is no such run)."""
    with Session(engine) as s:
        run = s.get(PortRun, run_id)
        return run.model_dump() if run else None


def steps_frame(engine: Engine, run_id: str, after_seq: int = 0):
    """The steps of a run in order (seq, at, node, message, data as compact JSON)."""
    with Session(engine) as s:
        steps = s.exec(select(RunStep).where(RunStep.run_id == run_id, RunStep.seq > after_seq)
                       .order_by(RunStep.seq))
        rows = [{"seq": step.seq, "at": step.at, "node": step.node, "message": step.message,
                 "data": json.dumps(step.data, default=str, separators=(",", ":")) if step.data else ""}
                for step in steps]
    return _frame(rows, STEP_COLUMNS, times=("at",))


def candidates_frame(engine: Engine, block: str | None = None, run_id: str | None = None):
    """Candidates oldest first (no source), with their check counts; of a block, of a run, or all."""
    cols = [Candidate.id, Candidate.run_id, Candidate.iteration, Candidate.template, Candidate.params,
            Candidate.status, Candidate.worst_ratio, Candidate.verify_seconds, Candidate.created_at,
            Candidate.message, Candidate.path]
    with Session(engine) as s:
        query = select(*cols).order_by(Candidate.created_at, Candidate.id)
        if block:
            query = query.where(Candidate.block == block)
        if run_id:
            query = query.where(Candidate.run_id == run_id)
        found = [dict(row._mapping) for row in s.exec(query)]
        ids = [c["id"] for c in found]
        counts = {cid: (n, failed or 0) for cid, n, failed in s.exec(
            select(VerificationCheck.candidate_id, func.count(),
                   func.sum(case((VerificationCheck.passed, 0), else_=1)))
            .where(VerificationCheck.candidate_id.in_(ids)).group_by(VerificationCheck.candidate_id))}
    for c in found:
        c["params"] = format_params(c["params"])
        c["checks"], c["failed"] = counts.get(c["id"], (0, 0))
    return _frame(found, CANDIDATE_COLUMNS, times=("created_at",))


def candidate_source(engine: Engine, candidate_id: int) -> str | None:
    with Session(engine) as s:
        return s.exec(select(Candidate.source).where(Candidate.id == candidate_id)).first()


def checks_frame(engine: Engine, candidate_id: int):
    """Every verification check of a candidate."""
    with Session(engine) as s:
        rows = [c.model_dump(include=set(CHECK_COLUMNS)) for c in s.exec(
            select(VerificationCheck).where(VerificationCheck.candidate_id == candidate_id)
            .order_by(VerificationCheck.id))]
    return _frame(rows, CHECK_COLUMNS)


BUILD_COLUMNS = ["target", "kernel", "suite", "ok", "registers", "spilled_bytes", "shared_bytes", "ctas_per_sm",
                 "num_warps", "num_stages", "uses_dot", "tensor_cores", "seconds", "error"]


def builds_frame(engine: Engine, candidate_id: int):
    """What the GPU targets' compilers said about each kernel of a candidate (workbench.store.models.KernelBuild)."""
    with Session(engine) as s:
        rows = [b.model_dump(include=set(BUILD_COLUMNS)) for b in s.exec(
            select(KernelBuild).where(KernelBuild.candidate_id == candidate_id).order_by(KernelBuild.id))]
    return _frame(rows, BUILD_COLUMNS)


def checks_by_shape(checks):
    """Checks grouped per suite x shape x dtype x direction, seeds folded: the worst error against its bound."""

    def badness(c: dict) -> float:
        if c["max_abs"] is None or c["max_abs"] != c["max_abs"]:
            return float("inf") if not c["passed"] else 0.0
        return c["max_abs"] / c["bound"] if c["bound"] else float("inf")

    groups: dict[tuple, list[dict]] = {}
    for c in checks.astype(object).where(checks.notna(), None).to_dict("records"):
        groups.setdefault((c["suite"], c["shape"], c["dtype"], c["direction"]), []).append(c)
    rows = []
    for (suite, shape, dtype, direction), cs in groups.items():
        worst = max(cs, key=badness)
        failing = [c for c in cs if not c["passed"]]
        ratios = [c["err_ratio"] for c in cs if c["err_ratio"] is not None]
        rels = [c["max_rel"] for c in cs if c["max_rel"] is not None]
        rows.append({"suite": suite, "shape": shape, "dtype": dtype, "direction": direction,
                     "verdict": "fail" if failing else "pass", "checks": len(cs), "failed": len(failing),
                     "max_abs": worst["max_abs"], "bound": worst["bound"], "err_ratio": max(ratios, default=None),
                     "max_rel": max(rels, default=None), "nonfinite": sum(c["nonfinite"] or 0 for c in cs),
                     "reason": failing[0]["reason"] if failing else ""})
    return _frame(rows, CHECK_SUMMARY_COLUMNS)


def _band(ops: dict | None) -> float | None:
    value = (ops or {}).get("band")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def loss_replays_frame(engine: Engine, model: str | None = None):
    """Loss replays with operators newest first (recorded reference runs left out), without their curves (see
    replay_curves); band: ops["band"] if recorded."""
    with Session(engine) as s:
        query = select(LossReplay).where(LossReplay.kind != "reference") \
            .order_by(LossReplay.created_at.desc(), LossReplay.id.desc())
        if model:
            query = query.where(LossReplay.model == model)
        rows = [{"id": r.id, "model": r.model, "mode": r.mode, "preset": r.preset, "seed": r.seed, "status": r.status,
                 "steps": len(r.curve or []), "final_loss": (r.curve or [None])[-1],
                 "reference_final_loss": (r.reference_curve or [None])[-1], "band": _band(r.ops),
                 "left_band_step": r.left_band_step, "reason": r.reason,
                 "ops": r.ops, "created_at": r.created_at} for r in s.exec(query)]
    return _frame(rows, REPLAY_COLUMNS, times=("created_at",))


def replay_curves(engine: Engine, replay_id: int):
    """step, reference, operator losses of one replay (a curve shorter than the other leaves gaps)."""
    with Session(engine) as s:
        row = s.get(LossReplay, replay_id)
        curve, reference = (list(row.curve or []), list(row.reference_curve or [])) if row else ([], [])
    n = max(len(curve), len(reference))
    rows = [{"step": i, "reference": reference[i] if i < len(reference) else None,
             "operator": curve[i] if i < len(curve) else None} for i in range(n)]
    return _frame(rows, ["step", "reference", "operator"])


def ci_operators(summary: dict | None) -> list[dict]:
    """The operators a CI job verified (workbench.ci: summary["operators"][block] = {operator, verdict,
    worst_ratio, checks: {check: passed}}), one row each with the names of its failing checks."""
    found = (summary or {}).get("operators")
    rows = []
    for block, entry in (found.items() if isinstance(found, dict) else []):
        if not isinstance(entry, dict):
            continue
        checks = entry.get("checks") if isinstance(entry.get("checks"), dict) else {}
        ratio = entry.get("worst_ratio")
        rows.append({"block": block, "operator": entry.get("operator", ""), "verdict": entry.get("verdict", ""),
                     "worst_ratio": ratio if isinstance(ratio, int | float) and ratio >= 0 else None,
                     "checks": len(checks), "failed": sum(not ok for ok in checks.values()),
                     "failing": ", ".join(k for k, ok in checks.items() if not ok)})
    return rows


def _ci_figures(summary: dict) -> dict:
    operators = ci_operators(summary)
    found = summary.get("regressions")
    return {"operators": len(operators), "passing": sum(o["verdict"] == "pass" for o in operators),
            "checks": sum(o["checks"] for o in operators), "failed_checks": sum(o["failed"] for o in operators),
            "regressions": len(found) if isinstance(found, list | dict) else 0}


def ci_jobs_frame(engine: Engine, limit: int = 200):
    """CI jobs newest first, with figures from their summaries (operators, passing, checks, failed_checks,
    regressions); summary is the job's JSON as a dict."""
    with Session(engine) as s:
        jobs = s.exec(select(CIJob).order_by(CIJob.started_at.desc(), CIJob.id.desc()).limit(limit))
        rows = [{"id": j.id, "commit": j.commit, "status": j.status, "started_at": j.started_at,
                 "finished_at": j.finished_at,
                 "seconds": (_aware(j.finished_at) - _aware(j.started_at)).total_seconds() if j.finished_at else None,
                 "junit_path": j.junit_path, "summary": dict(j.summary or {}), **_ci_figures(j.summary or {})}
                for j in jobs]
    return _frame(rows, CI_COLUMNS, times=("started_at", "finished_at"))


def latest_ci_job(engine: Engine) -> dict | None:
    jobs = ci_jobs_frame(engine, limit=1)
    return jobs.iloc[0].to_dict() if len(jobs) else None


def ci_regressions(jobs) -> list[dict]:
    """The regressions the CI jobs' summaries list (summary["regressions"]: lines "<block> <check>: ..." as
    workbench.ci writes them, or objects), one row each with the job id, commit and status."""
    rows = []
    for job in jobs.to_dict("records"):
        found = (job["summary"] or {}).get("regressions") or []
        if isinstance(found, dict):
            found = [{"name": k, **(v if isinstance(v, dict) else {"detail": v})} for k, v in found.items()]
        for item in found:
            if isinstance(item, dict):
                detail = item
            else:
                block = re.match(r"[\w.\-]+", str(item))
                detail = {"block": block.group(0) if block else "", "regression": str(item)}
            rows.append({"job": job["id"], "commit": job["commit"], "status": job["status"],
                         **{k: v if isinstance(v, str | int | float | bool) or v is None else json.dumps(v)
                            for k, v in detail.items()}})
    return rows


BENCH_COLUMNS = ["id", "block", "subject", "backend", "label", "shape", "dtype", "metric", "value", "unit",
                 "created_at"]


def benchmarks_frame(engine: Engine, block: str | None = None, limit: int = 5000):
    """Benchmark figures newest first (optionally one block's): label "modelled" or "measured", subject what was
    timed (operator, eager, compile, a peer), backend the target (modelled) or the device (measured)."""
    with Session(engine) as s:
        query = select(Benchmark).order_by(Benchmark.created_at.desc(), Benchmark.id.desc()).limit(limit)
        if block:
            query = query.where(Benchmark.block == block)
        rows = [{c: getattr(b, c) for c in BENCH_COLUMNS} for b in s.exec(query)]
    return _frame(rows, BENCH_COLUMNS, times=("created_at",))
