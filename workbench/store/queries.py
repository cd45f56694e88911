"""Typed reads shared by the CLI, the status module and the dashboard: SQLModel rows, or dicts where a read adds
counts to them. Nothing here writes, and nothing here knows the block catalog, the templates or the operators folder
(workbench.status combines them with the store; workbench.dashboard.frames turns these reads into DataFrames)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, case, func
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from workbench.store.models import (
    Benchmark,
    Candidate,
    CIJob,
    KernelBuild,
    LossReplay,
    ParityRun,
    PortRun,
    RunStep,
    TuneProbe,
    VerificationCheck,
)


def list_runs(engine: Engine, limit: int = 50, block: str | None = None, status: str | None = None) -> list[PortRun]:
    """Runs newest first, of one block and/or in one status if given."""
    with Session(engine) as s:
        query = select(PortRun).order_by(PortRun.started_at.desc()).limit(limit)
        if block:
            query = query.where(PortRun.block == block)
        if status:
            query = query.where(PortRun.status == status)
        return list(s.exec(query))


def find_run(engine: Engine, run_id: str) -> PortRun | None:
    """The run with this id, or the only one whose id starts with it."""
    with Session(engine) as s:
        run = s.get(PortRun, run_id)
        if run:
            return run
        matches = list(s.exec(select(PortRun).where(PortRun.id.startswith(run_id)).limit(2)))
        return matches[0] if len(matches) == 1 else None


def run_steps(engine: Engine, run_id: str, after_seq: int = 0) -> list[RunStep]:
    """The steps of a run in order, those after ``after_seq``."""
    with Session(engine) as s:
        return list(s.exec(select(RunStep).where(RunStep.run_id == run_id, RunStep.seq > after_seq)
                           .order_by(RunStep.seq)))


def run_tallies(engine: Engine, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Per run id: steps, candidates and resumes (counts) and last_step ("node: message", "" if none)."""
    with Session(engine) as s:
        steps = dict(s.exec(select(RunStep.run_id, func.count()).where(RunStep.run_id.in_(run_ids))
                            .group_by(RunStep.run_id)).all())
        candidates = dict(s.exec(select(Candidate.run_id, func.count()).where(Candidate.run_id.in_(run_ids))
                                 .group_by(Candidate.run_id)).all())
        resumes = dict(s.exec(select(RunStep.run_id, func.count())
                              .where(RunStep.run_id.in_(run_ids), RunStep.node == "resume")
                              .group_by(RunStep.run_id)).all())
        latest = (select(RunStep.run_id, func.max(RunStep.seq).label("seq")).where(RunStep.run_id.in_(run_ids))
                  .group_by(RunStep.run_id).subquery())
        last = {run_id: f"{node}: {message}" for run_id, node, message in s.exec(
            select(RunStep.run_id, RunStep.node, RunStep.message)
            .join(latest, and_(RunStep.run_id == latest.c.run_id, RunStep.seq == latest.c.seq)))}
    return {run_id: {"steps": steps.get(run_id, 0), "candidates": candidates.get(run_id, 0),
                     "resumes": resumes.get(run_id, 0), "last_step": last.get(run_id, "")} for run_id in run_ids}


def run_candidates(engine: Engine, run_id: str) -> list[Candidate]:
    with Session(engine) as s:
        return list(s.exec(select(Candidate).where(Candidate.run_id == run_id).order_by(Candidate.iteration)))


CANDIDATE_FIELDS = ("id", "run_id", "iteration", "template", "params", "status", "worst_ratio", "verify_seconds",
                    "created_at", "message", "path")


def candidate_summaries(engine: Engine, block: str | None = None, run_id: str | None = None) -> list[dict[str, Any]]:
    """Candidates oldest first, of a block, of a run, or all: CANDIDATE_FIELDS (no source) plus checks and failed
    (how many verification checks each has, and how many of them failed)."""
    with Session(engine) as s:
        query = select(*(getattr(Candidate, f) for f in CANDIDATE_FIELDS)).order_by(Candidate.created_at,
                                                                                    Candidate.id)
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
        c["checks"], c["failed"] = counts.get(c["id"], (0, 0))
    return found


def candidate_source(engine: Engine, candidate_id: int) -> str | None:
    with Session(engine) as s:
        return s.exec(select(Candidate.source).where(Candidate.id == candidate_id)).first()


def candidate_checks(engine: Engine, candidate_id: int) -> list[VerificationCheck]:
    """Every verification check of a candidate, in the order they were recorded."""
    with Session(engine) as s:
        return list(s.exec(select(VerificationCheck).where(VerificationCheck.candidate_id == candidate_id)
                           .order_by(VerificationCheck.id)))


def kernel_builds(engine: Engine, candidate_id: int) -> list[KernelBuild]:
    """What the GPU targets' compilers said about each kernel of a candidate, in the order recorded."""
    with Session(engine) as s:
        return list(s.exec(select(KernelBuild).where(KernelBuild.candidate_id == candidate_id)
                           .order_by(KernelBuild.id)))


def tune_probes(engine: Engine, run_id: str) -> list[TuneProbe]:
    """A port's tuning trials (one row per target and probe), in the order the search made them."""
    with Session(engine) as s:
        return list(s.exec(select(TuneProbe).where(TuneProbe.run_id == run_id).order_by(TuneProbe.id)))


def recorded_blocks(engine: Engine) -> set[str]:
    """Every block named by a run or a candidate."""
    with Session(engine) as s:
        return set(s.exec(select(PortRun.block).distinct())) | set(s.exec(select(Candidate.block).distinct()))


def loss_replays(engine: Engine, model: str | None = None) -> list[LossReplay]:
    """Loss replays with operators newest first (recorded reference runs left out), of one model if given."""
    with Session(engine) as s:
        query = select(LossReplay).where(LossReplay.kind != "reference") \
            .order_by(LossReplay.created_at.desc(), LossReplay.id.desc())
        if model:
            query = query.where(LossReplay.model == model)
        return list(s.exec(query))


def get_replay(engine: Engine, replay_id: int) -> LossReplay | None:
    with Session(engine) as s:
        return s.get(LossReplay, replay_id)


def ci_jobs(engine: Engine, limit: int = 200) -> list[CIJob]:
    """CI jobs newest first."""
    with Session(engine) as s:
        return list(s.exec(select(CIJob).order_by(CIJob.started_at.desc(), CIJob.id.desc()).limit(limit)))


def benchmarks(engine: Engine, block: str | None = None, limit: int = 5000) -> list[Benchmark]:
    """Benchmark figures newest first, of one block if given."""
    with Session(engine) as s:
        query = select(Benchmark).order_by(Benchmark.created_at.desc(), Benchmark.id.desc()).limit(limit)
        if block:
            query = query.where(Benchmark.block == block)
        return list(s.exec(query))


def parity_runs(engine: Engine, limit: int = 200) -> list[ParityRun]:
    """Parity runs newest first."""
    with Session(engine) as s:
        return list(s.exec(select(ParityRun).order_by(ParityRun.created_at.desc(), ParityRun.id.desc()).limit(limit)))
