"""Reads shared by the CLI and the dashboard: runs, their steps and candidates, and the port status of blocks."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from workbench.blocks import REGISTRY
from workbench.operators import list_promoted
from workbench.store.models import Candidate, PortRun, RunStep, VerificationCheck
from workbench.templating import list_templates

# The statuses a block of a model card can have, in the order a port goes through them.
STATUSES = ("no spec", "not started", "in progress", "blocked", "failed", "numerics pass", "promoted")


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
        return "no spec", ""
    promoted = list_promoted(operators_dir, block)
    if promoted:
        return "promoted", Path(promoted[0]["path"]).name
    runs = list_runs(engine, limit=1, block=block)
    if not runs:
        return "not started", f"{len(list_templates(block))} templates"
    run = runs[0]
    # a promoted run whose operator file is gone still passed its numerics
    renamed = {"running": "in progress", "interrupted": "blocked", "promoted": "numerics pass"}
    status = renamed.get(run.status, run.status)
    return status, f"run {run.id}: {run.reason or run.status}"
