"""Writes: every agent step and verification is recorded as it happens, each in its own short transaction, so a
dashboard sees a run live and a killed run leaves a consistent record."""

from __future__ import annotations

import os
import secrets
import socket
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import select

from workbench.store.db import session_scope
from workbench.store.models import Candidate, PortRun, RunStep, VerificationCheck, utcnow
from workbench.verify.result import VerificationResult


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
                  status: str = "rendered", message: str = "") -> int:
    with session_scope(engine) as s:
        row = Candidate(run_id=run_id, block=block, iteration=iteration, template=template, params=params or {},
                        source=source, source_hash=source_hash, path=path, status=status, message=message)
        s.add(row)
        s.flush()
        return row.id


def set_candidate_status(engine: Engine, candidate_id: int, status: str, message: str) -> None:
    with session_scope(engine) as s:
        row = s.get(Candidate, candidate_id)
        row.status, row.message = status, message


def record_verification(engine: Engine, candidate_id: int, result: VerificationResult) -> None:
    """The verdict on the candidate row and one VerificationCheck row per check, in one transaction."""
    with session_scope(engine) as s:
        row = s.get(Candidate, candidate_id)
        row.status, row.message = result.verdict, result.message
        ratio = result.worst_ratio()
        row.worst_ratio = ratio if ratio != float("inf") else None
        row.verify_seconds = result.seconds
        s.add_all(VerificationCheck(candidate_id=candidate_id, backend=result.backend, **vars(c))
                  for c in result.checks)


def finish_run(engine: Engine, run_id: str, status: str, reason: str, *, operator_path: str | None = None,
               best_candidate_id: int | None = None) -> None:
    with session_scope(engine) as s:
        run = s.get(PortRun, run_id)
        run.status, run.reason, run.finished_at = status, reason, utcnow()
        run.operator_path = operator_path
        run.best_candidate_id = best_candidate_id


def mark_interrupted(engine: Engine) -> list[str]:
    """Runs still marked running whose process on this host is gone: marked interrupted. Returns their ids."""
    host = socket.gethostname()
    marked = []
    with session_scope(engine) as s:
        for run in s.exec(select(PortRun).where(PortRun.status == "running", PortRun.host == host)):
            if run.pid is None or not _alive(run.pid):
                run.status, run.finished_at = "interrupted", utcnow()
                run.reason = "the agent process ended before the run finished"
                marked.append(run.id)
    return marked


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
