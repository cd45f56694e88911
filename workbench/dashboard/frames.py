"""The dashboard's tables: the store's typed reads (workbench.store.queries) and the block statuses
(workbench.status) shaped into pandas DataFrames with fixed columns, even when empty. Timestamps are UTC-aware."""

from __future__ import annotations

import json
import re
import socket
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
from sqlalchemy.engine import Engine

from workbench.errors import WorkbenchError
from workbench.replay.trace import figures, read_trace, replay_traces, timeline
from workbench.status import PLAN_COLUMNS
from workbench.status import model_plan as plan_rows
from workbench.store import queries
from workbench.store.records import process_alive
from workbench.vocabulary import Verdict, key_values

RUN_COLUMNS = ["id", "block", "model", "status", "proposer", "backend", "budget", "steps", "candidates", "started_at",
               "finished_at", "seconds", "reason", "last_step", "process", "resumes"]
STEP_COLUMNS = ["seq", "at", "node", "message", "data"]
CANDIDATE_COLUMNS = ["id", "run_id", "iteration", "template", "params", "status", "worst_ratio", "verify_seconds",
                     "checks", "failed", "created_at", "message", "path"]
CHECK_COLUMNS = ["suite", "shape", "dtype", "seed", "direction", "passed", "reason", "max_abs", "max_rel", "err_ratio",
                 "ref_err", "bound", "nonfinite", "backend"]
CHECK_SUMMARY_COLUMNS = ["suite", "shape", "dtype", "direction", "verdict", "checks", "failed", "max_abs", "bound",
                         "err_ratio", "max_rel", "nonfinite", "reason"]
BUILD_COLUMNS = ["target", "kernel", "suite", "ok", "registers", "spilled_bytes", "shared_bytes", "ctas_per_sm",
                 "num_warps", "num_stages", "uses_dot", "tensor_cores", "seconds", "error"]
TUNE_COLUMNS = ["target", "probe", "params", "settings", "ok", "registers", "spilled_bytes", "time_ms", "label",
                "moved", "why"]
REPLAY_COLUMNS = ["id", "model", "mode", "preset", "seed", "status", "steps", "final_loss", "reference_final_loss",
                  "band", "left_band_step", "reason", "ops", "ranks", "sharding", "experts", "cache", "layout",
                  "created_at"]
TRACE_STEP_COLUMNS = ["rank", "step", "ms", "compute_ms", "communication_ms", "idle_ms", "all_to_all_ms",
                      "all_to_all_wait_ms", "hidden_ms", "hidden_fraction"]
TIMELINE_COLUMNS = ["rank", "step", "start", "end", "kind", "op"]
CI_COLUMNS = ["id", "commit", "status", "started_at", "finished_at", "seconds", "operators", "passing", "checks",
              "failed_checks", "regressions", "junit_path", "summary"]
PARITY_COLUMNS = ["id", "source", "model_class", "dtype", "backend", "status", "kl", "cosine", "top1", "top5",
                  "router_match", "loss_rel", "grad_rel_worst", "first_divergence", "replaced", "left_alone",
                  "torch_flops", "torch_bytes", "ci_job_id", "seconds", "created_at", "message", "checks", "modules",
                  "left_in_torch", "notes"]
BENCH_COLUMNS = ["id", "block", "subject", "backend", "label", "shape", "dtype", "metric", "value", "unit",
                 "created_at"]


def _frame(rows: list[dict], columns: list[str], times: tuple[str, ...] = ()) -> pd.DataFrame:
    """A DataFrame with these columns even when empty; naive timestamps (stored UTC) become UTC-aware."""
    df = pd.DataFrame(rows, columns=columns)
    for col in times:
        df[col] = pd.to_datetime(df[col], utc=True)
    return df


def _aware(at: datetime | None) -> datetime | None:
    return at.replace(tzinfo=UTC) if at is not None and at.tzinfo is None else at


def _process_state(status: str, host: str, pid: int | None) -> str:
    """For a running run: whether its agent process is alive (only knowable on its own host); read-only."""
    if status != "running":
        return ""
    if host and host != socket.gethostname():
        return f"on {host}"
    return "alive" if pid is not None and process_alive(pid) else "gone"


def model_plan(engine: Engine, operators_dir: str | Path, model: str) -> pd.DataFrame:
    """workbench.status.model_plan as a DataFrame (block, role, status, evidence_level, detail, sizes)."""
    return _frame(plan_rows(engine, operators_dir, model), PLAN_COLUMNS)


def runs_frame(engine: Engine, limit: int = 100, block: str | None = None, status: str | None = None) -> pd.DataFrame:
    """Runs newest first with their step and candidate counts, last step, how often each was resumed and, for
    running ones, their process."""
    runs = queries.list_runs(engine, limit=limit, block=block, status=status)
    tallies = queries.run_tallies(engine, [r.id for r in runs])
    now = datetime.now(UTC)
    rows = [{"id": r.id, "block": r.block, "model": r.model, "status": r.status, "proposer": r.proposer,
             "backend": r.backend, "budget": r.budget, "started_at": r.started_at, "finished_at": r.finished_at,
             "seconds": ((_aware(r.finished_at) or now) - _aware(r.started_at)).total_seconds(),
             "reason": r.reason, "process": _process_state(r.status, r.host, r.pid), **tallies[r.id]}
            for r in runs]
    return _frame(rows, RUN_COLUMNS, times=("started_at", "finished_at"))


def steps_frame(engine: Engine, run_id: str, after_seq: int = 0) -> pd.DataFrame:
    """The steps of a run in order (seq, at, node, message, data as compact JSON)."""
    rows = [{"seq": step.seq, "at": step.at, "node": step.node, "message": step.message,
             "data": json.dumps(step.data, default=str, separators=(",", ":")) if step.data else ""}
            for step in queries.run_steps(engine, run_id, after_seq)]
    return _frame(rows, STEP_COLUMNS, times=("at",))


def candidates_frame(engine: Engine, block: str | None = None, run_id: str | None = None) -> pd.DataFrame:
    """Candidates oldest first (no source), with their check counts and params as key=value text; of a block, of
    a run, or all."""
    rows = [{**c, "params": key_values(c["params"] or {})}
            for c in queries.candidate_summaries(engine, block=block, run_id=run_id)]
    return _frame(rows, CANDIDATE_COLUMNS, times=("created_at",))


def checks_frame(engine: Engine, candidate_id: int) -> pd.DataFrame:
    """Every verification check of a candidate."""
    rows = [c.model_dump(include=set(CHECK_COLUMNS)) for c in queries.candidate_checks(engine, candidate_id)]
    return _frame(rows, CHECK_COLUMNS)


def builds_frame(engine: Engine, candidate_id: int) -> pd.DataFrame:
    """What the GPU targets' compilers said about each kernel of a candidate (workbench.store.models.KernelBuild)."""
    rows = [b.model_dump(include=set(BUILD_COLUMNS)) for b in queries.kernel_builds(engine, candidate_id)]
    return _frame(rows, BUILD_COLUMNS)


def tune_frame(engine: Engine, run_id: str) -> pd.DataFrame:
    """A port's tuning per target: each probe's point and launch settings (key=value text), what compiling showed
    and whether the search moved there, and why (workbench.store.models.TuneProbe)."""
    rows = [{**t.model_dump(include=set(TUNE_COLUMNS)), "params": key_values(t.params or {}),
             "settings": key_values(t.settings or {})} for t in queries.tune_probes(engine, run_id)]
    return _frame(rows, TUNE_COLUMNS).sort_values(["target", "probe"], kind="stable") if rows else \
        _frame(rows, TUNE_COLUMNS)


def checks_by_shape(checks: pd.DataFrame) -> pd.DataFrame:
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


def loss_replays_frame(engine: Engine, model: str | None = None) -> pd.DataFrame:
    """Loss replays with operators newest first (recorded reference runs left out), without their curves (see
    replay_curves); band: ops["band"] if recorded."""
    rows = [{"id": r.id, "model": r.model, "mode": r.mode, "preset": r.preset, "seed": r.seed, "status": r.status,
             "steps": len(r.curve or []), "final_loss": (r.curve or [None])[-1],
             "reference_final_loss": (r.reference_curve or [None])[-1], "band": _band(r.ops),
             "left_band_step": r.left_band_step, "reason": r.reason, "ops": r.ops, **replay_layout(r.layout),
             "created_at": r.created_at}
            for r in queries.loss_replays(engine, model)]
    return _frame(rows, REPLAY_COLUMNS, times=("created_at",))


def replay_layout(layout: dict | None) -> dict:
    """A replay's layout (LossReplay.layout; null: one process) as the columns ranks, sharding, experts, cache and
    one line, layout: "2 ranks · dense fsdp2 · experts ep · cache kda:host · rank 1 runs moe_combine=f.py"."""
    layout = layout or {}
    ranks = layout.get("ranks") or 1
    sharding, experts = layout.get("sharding") or "none", layout.get("experts") or "local"
    cache = ",".join(layout.get("cache") or [])
    parts = [f"{ranks} rank{'s' if ranks > 1 else ''}", f"dense {sharding}", f"experts {experts}"]
    if (layout.get("chunks") or 1) > 1:
        parts.append(f"dispatch in {layout['chunks']} chunks")
    if cache:
        parts.append(f"cache {cache}:host")
    for rank, ops in (layout.get("rank_ops") or {}).items():
        parts.append(f"rank {rank} runs " + ", ".join(f"{b}={t}" for b, t in ops.items()))
    return {"ranks": ranks, "sharding": sharding, "experts": experts, "cache": cache, "layout": " · ".join(parts)}


def replay_curves(engine: Engine, replay_id: int) -> pd.DataFrame:
    """step, reference, operator losses of one replay (a curve shorter than the other leaves gaps)."""
    row = queries.get_replay(engine, replay_id)
    curve, reference = (list(row.curve or []), list(row.reference_curve or [])) if row else ([], [])
    n = max(len(curve), len(reference))
    rows = [{"step": i, "reference": reference[i] if i < len(reference) else None,
             "operator": curve[i] if i < len(curve) else None} for i in range(n)]
    return _frame(rows, ["step", "reference", "operator"])


def replay_trace(engine: Engine, replay_id: int) -> dict:
    """A profiled replay's traces (workbench.replay.trace): "steps", the ms of each rank's steps (TRACE_STEP_COLUMNS);
    "timeline", each rank's main thread step by step (TIMELINE_COLUMNS: ms from the step's start); or "error" when
    they cannot be read. Empty for a replay without traces."""
    row = queries.get_replay(engine, replay_id)
    if row is None or not (row.detail or {}).get("traces"):
        return {}
    try:
        steps = [s for rank, path in enumerate(replay_traces(row.detail, replay_id)) for s in read_trace(path, rank)]
    except WorkbenchError as exc:
        return {"error": str(exc)}
    shown = [figures(s).to_dict() for s in steps]
    drawn = [{"rank": s.rank, "step": s.step, "start": seg.start, "end": seg.end, "kind": seg.kind, "op": seg.op}
             for s in steps for seg in timeline(s)]
    return {"steps": _frame(shown, TRACE_STEP_COLUMNS), "timeline": _frame(drawn, TIMELINE_COLUMNS)}


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
    return {"operators": len(operators), "passing": sum(o["verdict"] == Verdict.PASS for o in operators),
            "checks": sum(o["checks"] for o in operators), "failed_checks": sum(o["failed"] for o in operators),
            "regressions": len(found) if isinstance(found, list | dict) else 0}


def ci_jobs_frame(engine: Engine, limit: int = 200) -> pd.DataFrame:
    """CI jobs newest first, with figures from their summaries (operators, passing, checks, failed_checks,
    regressions); summary is the job's JSON as a dict."""
    rows = [{"id": j.id, "commit": j.commit, "status": j.status, "started_at": j.started_at,
             "finished_at": j.finished_at,
             "seconds": (_aware(j.finished_at) - _aware(j.started_at)).total_seconds() if j.finished_at else None,
             "junit_path": j.junit_path, "summary": dict(j.summary or {}), **_ci_figures(j.summary or {})}
            for j in queries.ci_jobs(engine, limit)]
    return _frame(rows, CI_COLUMNS, times=("started_at", "finished_at"))


def parity_frame(engine: Engine, limit: int = 200) -> pd.DataFrame:
    """Parity runs newest first: the metrics, the first diverging module, how many modules were replaced and left
    alone, the share of the forward left in torch (FLOPs, bytes: workbench.integrations.torch_share); checks,
    modules (by class), the torch compute by module class and notes as lists."""
    rows = []
    for r in queries.parity_runs(engine, limit):
        m, modules = r.metrics or {}, (r.patch or {}).get("modules", [])
        first, share = m.get("first_divergence"), m.get("torch_share") or {}
        rows.append({"id": r.id, "source": r.source, "model_class": r.model_class, "dtype": r.dtype,
                     "backend": r.backend, "status": r.status, **{k: m.get(k) for k in PARITY_COLUMNS[6:13]},
                     "first_divergence": first["module"] if first else None,
                     "replaced": sum(row["count"] for row in modules if row["blocks"]),
                     "left_alone": sum(row["count"] for row in modules if not row["blocks"]),
                     "torch_flops": share.get("flops_share"), "torch_bytes": share.get("bytes_share"),
                     "ci_job_id": r.ci_job_id, "seconds": r.seconds, "created_at": r.created_at,
                     "message": r.message, "checks": list(r.checks or []), "modules": modules,
                     "left_in_torch": list(share.get("left", [])), "notes": list(r.notes or [])})
    return _frame(rows, PARITY_COLUMNS, times=("created_at",))


def latest_ci_job(engine: Engine) -> dict | None:
    jobs = ci_jobs_frame(engine, limit=1)
    return jobs.iloc[0].to_dict() if len(jobs) else None


def ci_regressions(jobs: pd.DataFrame) -> list[dict]:
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


def benchmarks_frame(engine: Engine, block: str | None = None, limit: int = 5000) -> pd.DataFrame:
    """Benchmark figures newest first (optionally one block's): label "modelled" or "measured", subject what was
    timed (operator, eager, compile, a peer), backend the target (modelled) or the device (measured)."""
    rows = [{c: getattr(b, c) for c in BENCH_COLUMNS} for b in queries.benchmarks(engine, block, limit)]
    return _frame(rows, BENCH_COLUMNS, times=("created_at",))
