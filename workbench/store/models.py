"""SQLModel tables of the store (DESIGN.md, "Store"). Timestamps are UTC; free-form figures are JSON columns."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column, Text
from sqlmodel import Field, SQLModel

from workbench.vocabulary import RENDERED, JobStatus, ReplayStatus, RunStatus


def utcnow() -> datetime:
    return datetime.now(UTC)


class PortRun(SQLModel, table=True):
    """One agent run porting one block. status: running, promoted, blocked, interrupted, failed, waiting_approval
    (paused before promotion until `workbench approve` or `reject`), rejected. A resumed run is running again;
    its RunSteps of node "resume" say when and from where."""

    __tablename__ = "port_run"
    id: str = Field(primary_key=True)
    block: str = Field(index=True)
    model: str | None = None
    proposer: str
    backend: str
    budget: int
    status: str = Field(default=RunStatus.RUNNING, index=True)
    reason: str = ""
    config: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    operator_path: str | None = None
    best_candidate_id: int | None = None
    host: str = ""
    pid: int | None = None
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class RunStep(SQLModel, table=True):
    """One agent node execution, written as it happens: what the node did and why."""

    __tablename__ = "run_step"
    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="port_run.id", index=True)
    seq: int
    node: str
    message: str
    data: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    at: datetime = Field(default_factory=utcnow)


class Candidate(SQLModel, table=True):
    """A candidate module: rendered by the agent (run_id set) or verified from a file (run_id None).
    status: rendered, then the verification verdict (pass, fail, compile_error, runtime_error, timeout, ...)."""

    __tablename__ = "candidate"
    id: int | None = Field(default=None, primary_key=True)
    run_id: str | None = Field(default=None, foreign_key="port_run.id", index=True)
    block: str = Field(index=True)
    iteration: int = 0
    template: str | None = None
    params: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    launch: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))  # per target, the tuning's choice
    source: str = Field(sa_column=Column(Text))
    source_hash: str = Field(index=True)
    path: str
    status: str = RENDERED
    message: str = ""
    worst_ratio: float | None = None
    verify_seconds: float | None = None
    target_report: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))  # VerificationResult's
    created_at: datetime = Field(default_factory=utcnow)


class TuneProbe(SQLModel, table=True):
    """One target's point of one compile-only probe of a port's tuning (workbench.agent.tune): the template point,
    the launch settings tried on the target, what compiling at the model and smoke suites showed (registers, spills,
    the modelled or measured time at the model suite) and whether the search moved there, and why."""

    __tablename__ = "tune_probe"
    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="port_run.id", index=True)
    block: str = Field(index=True)
    probe: int
    target: str
    template: str
    params: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    settings: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    ok: bool = True
    registers: int = 0
    spilled_bytes: int = 0
    time_ms: float | None = None
    label: str = "modelled"
    moved: bool = False
    why: str = Field(default="", sa_column=Column(Text))
    created_at: datetime = Field(default_factory=utcnow)


class VerificationCheck(SQLModel, table=True):
    """One compared quantity of one verification (see workbench.verify.result.Check)."""

    __tablename__ = "verification_check"
    id: int | None = Field(default=None, primary_key=True)
    candidate_id: int = Field(foreign_key="candidate.id", index=True)
    backend: str
    suite: str
    shape: str
    dtype: str
    seed: int
    direction: str
    passed: bool
    reason: str = ""
    max_abs: float | None = None
    max_rel: float | None = None
    err_ratio: float | None = None
    ref_err: float | None = None
    bound: float | None = None
    nonfinite: int = 0
    verdict: str | None = None  # what a failed check stands for (workbench.verify.result.Check.verdict)


class KernelBuild(SQLModel, table=True):
    """What a GPU target's compiler said about one kernel specialization of a candidate (ahead of time, no GPU):
    see workbench.verify.aot.KernelBuild. suite: the suite whose launch this is ("model": the model card's sizes);
    specialization: argument types, constexpr values and launch options; spilled_bytes: stack (NVIDIA) or scratch
    (AMD) bytes per thread; shared_bytes: dynamic shared memory; ctas_per_sm: occupancy."""

    __tablename__ = "kernel_build"
    id: int | None = Field(default=None, primary_key=True)
    candidate_id: int = Field(foreign_key="candidate.id", index=True)
    kernel: str
    target: str = Field(index=True)
    suite: str
    specialization: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    ok: bool
    error: str = ""
    registers: int | None = None
    spilled_bytes: int | None = None
    shared_bytes: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    ctas_per_sm: int | None = None
    uses_dot: bool | None = None
    tensor_cores: bool | None = None
    seconds: float = 0.0


class Benchmark(SQLModel, table=True):
    """A speed or memory figure of a block's operator, a reference or a peer at one shape."""

    __tablename__ = "benchmark"
    id: int | None = Field(default=None, primary_key=True)
    block: str = Field(index=True)
    backend: str
    shape: str
    dtype: str
    metric: str
    value: float
    unit: str
    label: str = "measured"  # "measured" (timed on the named device) or "modelled" (the cost model's)
    subject: str = "operator"  # what the figure is of: the operator, eager, compile, or a peer (liger, fla, ...)
    created_at: datetime = Field(default_factory=utcnow)


class LossReplay(SQLModel, table=True):
    """A loss-curve replay: per-step losses of the operator run and of the reference run it is held against.

    kind "operators": a replay with operators; ops = {block: "reference" | operator file, "band": relative band};
    status running, pass, fail, error, interrupted; left_band_step: the first step outside the band.
    kind "reference": a recorded reference run (status "reference"); detail holds its key and full result.
    detail: the checks and timings (operators) or {"key", "result"} (reference).
    layout: how the replay was spread (workbench.replay.distributed.Layout: ranks, sharding, experts, cache, and
    rank_ops {rank: {block: file}}); empty or null for a single process with nothing cached."""

    __tablename__ = "loss_replay"
    id: int | None = Field(default=None, primary_key=True)
    model: str
    mode: str
    preset: str
    seed: int
    kind: str = "operators"
    steps: int = 0
    backend: str = ""
    ops: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    curve: list[float] = Field(default_factory=list, sa_column=Column(JSON))
    reference_curve: list[float] = Field(default_factory=list, sa_column=Column(JSON))
    status: str = ReplayStatus.RUNNING
    reason: str = ""
    left_band_step: int | None = None
    detail: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    layout: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    created_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class CIJob(SQLModel, table=True):
    """A CI verification job over the promoted operators."""

    __tablename__ = "ci_job"
    id: int | None = Field(default=None, primary_key=True)
    commit: str = ""
    status: str = JobStatus.RUNNING
    summary: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    junit_path: str | None = None
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class ParityRun(SQLModel, table=True):
    """A parity run (workbench.integrations.parity): the published transformers implementation of a model as shipped
    against the same code with the promoted operators swapped in. status pass, fail or error; metrics: logits KL,
    cosine, top-1/top-5, router match, loss, gradients, first diverging module; checks: each metric against its
    dtype's bound; patch: the modules replaced (by which blocks) and left alone (why); ci_job_id: the CI job that ran
    it, if one did."""

    __tablename__ = "parity_run"
    id: int | None = Field(default=None, primary_key=True)
    source: str
    model_type: str
    model_class: str
    dtype: str
    backend: str
    layers: list[str] = Field(default_factory=list, sa_column=Column(JSON))
    tokens: int = 0
    status: str = ""
    metrics: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    checks: list[dict[str, Any]] = Field(default_factory=list, sa_column=Column(JSON))
    patch: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    notes: list[str] = Field(default_factory=list, sa_column=Column(JSON))
    message: str = Field(default="", sa_column=Column(Text))
    seconds: float = 0.0
    ci_job_id: int | None = None
    created_at: datetime = Field(default_factory=utcnow)
