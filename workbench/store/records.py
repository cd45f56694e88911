"""Writes: every agent step and verification is recorded as it happens, each in its own short transaction, so a
dashboard sees a run live and a killed run leaves a consistent record."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import delete, func
from sqlalchemy.engine import Engine
from sqlmodel import select

from workbench.store.db import session_scope
from workbench.store.models import (
    Candidate,
    KernelBuild,
    LossReplay,
    ParityRun,
    PortRun,
    RunStep,
    TuneProbe,
    VerificationCheck,
    utcnow,
)
from workbench.vocabulary import RENDERED, ReplayStatus, RunStatus


class Verification(Protocol):
    """What record_verification stores of a verification (workbench.verify.result.VerificationResult has it):
    checks are dataclasses with VerificationCheck's fields, builds dicts with KernelBuild's (plus "cached")."""

    verdict: str
    message: str
    backend: str
    seconds: float
    checks: Sequence[Any]
    builds: Sequence[dict[str, Any]]

    def worst_ratio(self) -> float: ...

    def target_report(self) -> dict[str, Any]: ...


def new_run_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def start_run(engine: Engine, *, block: str, proposer: str, backend: str, budget: int, config: dict[str, Any],
              model: str | None = None) -> str:
    run_id = new_run_id()
    with session_scope(engine) as s:
        s.add(PortRun(id=run_id, block=block, model=model, proposer=proposer, backend=backend, budget=budget,
                      config=config, host=socket.gethostname(), pid=os.getpid()))
    return run_id


def add_step(engine: Engine, run_id: str, node: str, message: str, data: dict[str, Any] | None = None) -> None:
    with session_scope(engine) as s:
        seq = s.exec(select(func.count()).select_from(RunStep).where(RunStep.run_id == run_id)).one()
        s.add(RunStep(run_id=run_id, seq=seq + 1, node=node, message=message, data=data or {}))


def add_candidate(engine: Engine, *, block: str, source: str, source_hash: str, path: str, run_id: str | None = None,
                  iteration: int = 0, template: str | None = None, params: dict | None = None,
                  launch: dict | None = None, status: str = RENDERED, message: str = "") -> int:
    with session_scope(engine) as s:
        row = Candidate(run_id=run_id, block=block, iteration=iteration, template=template, params=params or {},
                        launch=launch or {}, source=source, source_hash=source_hash, path=path, status=status,
                        message=message)
        s.add(row)
        s.flush()
        return row.id


def add_tune_trials(engine: Engine, run_id: str, block: str, template: str, trials: Sequence[dict[str, Any]]) -> None:
    """A port's tuning trials (workbench.agent.tune.Trial.to_dict), one row each."""
    with session_scope(engine) as s:
        for t in trials:
            s.add(TuneProbe(run_id=run_id, block=block, probe=t["probe"], target=t["target"], template=template,
                            params=t["params"], settings=t["settings"], ok=t["ok"], registers=t["registers"],
                            spilled_bytes=t["spilled_bytes"], time_ms=t["time_ms"],
                            label="measured" if t["measured"] else "modelled", moved=t["moved"], why=t["why"]))


def iteration_candidate(engine: Engine, run_id: str, iteration: int) -> int | None:
    """The id of the candidate a run recorded for this iteration, if any (a node run again after a crash finds
    the row it wrote before instead of writing a second one)."""
    with session_scope(engine) as s:
        return s.exec(select(Candidate.id).where(Candidate.run_id == run_id, Candidate.iteration == iteration)
                      .order_by(Candidate.id)).first()


def set_candidate_status(engine: Engine, candidate_id: int, status: str, message: str) -> None:
    with session_scope(engine) as s:
        row = s.get(Candidate, candidate_id)
        row.status, row.message = status, message


def record_verification(engine: Engine, candidate_id: int, result: Verification) -> None:
    """The verdict and target report on the candidate row, one VerificationCheck row per check and one KernelBuild row
    per kernel x target build, in one transaction; what an earlier verification of the same candidate recorded is
    replaced."""
    with session_scope(engine) as s:
        s.exec(delete(VerificationCheck).where(VerificationCheck.candidate_id == candidate_id))
        s.exec(delete(KernelBuild).where(KernelBuild.candidate_id == candidate_id))
        row = s.get(Candidate, candidate_id)
        row.status, row.message = result.verdict, result.message
        ratio = result.worst_ratio()
        row.worst_ratio = ratio if ratio != float("inf") else None
        row.verify_seconds = result.seconds
        row.target_report = result.target_report()
        s.add_all(VerificationCheck(candidate_id=candidate_id, backend=result.backend, **vars(c))
                  for c in result.checks)
        s.add_all(KernelBuild(candidate_id=candidate_id, **{k: v for k, v in b.items() if k != "cached"})
                  for b in result.builds)


def finish_run(engine: Engine, run_id: str, status: str, reason: str, *, operator_path: str | None = None,
               best_candidate_id: int | None = None) -> None:
    with session_scope(engine) as s:
        run = s.get(PortRun, run_id)
        run.status, run.reason, run.finished_at = status, reason, utcnow()
        run.operator_path = operator_path
        run.best_candidate_id = best_candidate_id


def set_run_status(engine: Engine, run_id: str, status: str, reason: str) -> None:
    """A run that stops without finishing (waiting_approval): its status and why, no finish time."""
    with session_scope(engine) as s:
        run = s.get(PortRun, run_id)
        run.status, run.reason, run.finished_at = status, reason, None


def resume_run(engine: Engine, run_id: str) -> None:
    """A run taken up again (resumed, approved or rejected): running in this process, unfinished."""
    with session_scope(engine) as s:
        run = s.get(PortRun, run_id)
        run.status, run.reason, run.finished_at = RunStatus.RUNNING, "", None
        run.host, run.pid = socket.gethostname(), os.getpid()


def mark_interrupted(engine: Engine) -> list[str]:
    """Runs still marked running whose process on this host is gone: marked interrupted. Returns their ids."""
    host = socket.gethostname()
    marked = []
    with session_scope(engine) as s:
        for run in s.exec(select(PortRun).where(PortRun.status == RunStatus.RUNNING, PortRun.host == host)):
            if run.pid is None or not process_alive(run.pid):
                run.status, run.finished_at = RunStatus.INTERRUPTED, utcnow()
                run.reason = "the agent process ended before the run finished"
                marked.append(run.id)
    return marked


def interrupt_own_runs(engine: Engine, reason: str) -> list[str]:
    """Runs of this process still marked running: marked interrupted with ``reason``. Returns their ids."""
    host, pid = socket.gethostname(), os.getpid()
    marked = []
    with session_scope(engine) as s:
        for run in s.exec(select(PortRun).where(PortRun.status == RunStatus.RUNNING, PortRun.host == host,
                                                PortRun.pid == pid)):
            run.status, run.finished_at, run.reason = RunStatus.INTERRUPTED, utcnow(), reason
            marked.append(run.id)
    return marked


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (one owned by another user counts as alive; a zombie, killed and
    not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc here
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- loss-curve replays ----------------------------------------------------------------------------------------

def start_replay(engine: Engine, *, model: str, mode: str, preset: str, seed: int, steps: int, backend: str,
                 ops: dict[str, Any], reference_curve: list[float], layout: dict[str, Any] | None = None) -> int:
    with session_scope(engine) as s:
        row = LossReplay(model=model, mode=mode, preset=preset, seed=seed, steps=steps, backend=backend, ops=ops,
                         reference_curve=reference_curve, detail={"host": socket.gethostname(), "pid": os.getpid()},
                         layout=layout)
        s.add(row)
        s.flush()
        return row.id


def extend_replay_curve(engine: Engine, replay_id: int, curve: list[float]) -> None:
    """The operator curve so far (written after every step, so the dashboard follows a replay live)."""
    with session_scope(engine) as s:
        s.get(LossReplay, replay_id).curve = list(curve)


def finish_replay(engine: Engine, replay_id: int, status: str, reason: str, *, curve: list[float] | None = None,
                  left_band_step: int | None = None, detail: dict[str, Any] | None = None) -> None:
    with session_scope(engine) as s:
        row = s.get(LossReplay, replay_id)
        row.status, row.reason, row.finished_at = status, reason, utcnow()
        row.left_band_step = left_band_step
        if curve is not None:
            row.curve = list(curve)
        row.detail = detail or {}


def save_reference_replay(engine: Engine, *, model: str, mode: str, preset: str, seed: int, backend: str, key: str,
                          result: dict[str, Any]) -> int:
    """A reference run, found again by its key (replaces an earlier row with the same key)."""
    with session_scope(engine) as s:
        for old in s.exec(select(LossReplay).where(LossReplay.kind == "reference", LossReplay.model == model)):
            if (old.detail or {}).get("key") == key:
                s.delete(old)
        row = LossReplay(model=model, mode=mode, preset=preset, seed=seed, kind="reference",
                         status=ReplayStatus.REFERENCE,
                         steps=len(result["curve"]), backend=backend, ops={"all": "reference"}, curve=result["curve"],
                         reference_curve=result["curve"], detail={"key": key, "result": result},
                         finished_at=utcnow())
        s.add(row)
        s.flush()
        return row.id


def find_reference_replay(engine: Engine, model: str, key: str) -> dict[str, Any] | None:
    """The result of the reference run recorded under ``key``, or None."""
    with session_scope(engine) as s:
        rows = s.exec(select(LossReplay).where(LossReplay.kind == "reference", LossReplay.model == model)
                      .order_by(LossReplay.id.desc()))
        for row in rows:
            if (row.detail or {}).get("key") == key:
                return row.detail.get("result")
    return None


def mark_replays_interrupted(engine: Engine) -> list[int]:
    """Replays still marked running whose process on this host is gone: marked interrupted. Returns their ids."""
    host = socket.gethostname()
    marked = []
    with session_scope(engine) as s:
        for row in s.exec(select(LossReplay).where(LossReplay.status == ReplayStatus.RUNNING)):
            detail = row.detail or {}
            pid = detail.get("pid")
            if detail.get("host") == host and not (isinstance(pid, int) and pid > 0 and process_alive(pid)):
                row.status, row.finished_at = ReplayStatus.INTERRUPTED, utcnow()
                row.reason = "the replay process ended before the replay finished"
                marked.append(row.id)
    return marked


def record_parity(engine: Engine, result: dict[str, Any], ci_job_id: int | None = None) -> int:
    """Store one parity run (workbench.integrations.parity.ParityResult.as_dict()); returns its id."""
    fields = {k: result[k] for k in ("source", "model_type", "model_class", "dtype", "backend", "layers", "tokens",
                                     "status", "metrics", "checks", "patch", "notes", "message", "seconds")}
    with session_scope(engine) as s:
        row = ParityRun(**fields, ci_job_id=ci_job_id)
        s.add(row)
        s.flush()
        return row.id
