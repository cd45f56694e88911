"""The graph's state: plain JSON-able values only (it is checkpointed); the spec, templates and store live in the
PortContext each node reads from LangGraph's runtime context; the options a run was started with (PortOptions) are
stored with the run."""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field
from typing import Annotated, Any, NotRequired, TypedDict

from workbench.agent.tune import DEFAULT_PROBES, DEFAULT_SECONDS

DEFAULT_REPLAY_MODEL = "kimi-k3.1-pro"


@dataclass(frozen=True)
class PortOptions:
    """How one port runs, stored as JSON with the run (Run.config) and read back when it is resumed or approved.

    suites, dtypes, seeds: what each candidate is verified on; explore: passing candidates to collect before the
    best is promoted; start: "template:NAME=VALUE,..." to begin at; targets: GPU targets every kernel must compile
    for; forward_only: an inference port (outputs verified, no backward, no replay gate); measure: time passing
    candidates at the model suite (None: on a GPU backend); timeout_s: one verification's limit; approve: stop
    before promotion for a person's decision; replay_steps, replay_model: the replay gate (0: none); tune_probes:
    the compile-only probes the tuning may spend on the chosen candidate (0: promote it as it passed), tune_seconds:
    the wall time after which it starts no probe; llm: the
    LLM proposer's public settings (no key)."""

    suites: list[str]
    dtypes: list[str]
    timeout_s: float
    seeds: int = 2
    explore: int = 1
    start: str | None = None
    targets: list[str] = field(default_factory=list)
    forward_only: bool = False
    measure: bool | None = None
    approve: bool = False
    replay_steps: int = 0
    replay_model: str = DEFAULT_REPLAY_MODEL
    tune_probes: int = DEFAULT_PROBES
    tune_seconds: float = DEFAULT_SECONDS
    llm: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PortOptions:
        """A run's recorded options; a key an older run did not record takes its default."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known and v is not None})


class Proposal(TypedDict):
    """A point of a template's parameter space, and why it was chosen. A model-written candidate has template
    "llm" and carries its module in ``source``, or the endpoint's failure in ``error``; ``trace`` (the prompt and
    the tries) goes to the run's record, not into the state."""

    template: str
    params: dict[str, Any]
    reason: str
    source: NotRequired[str]
    error: NotRequired[str]
    trace: NotRequired[dict[str, Any]]
    tuned: NotRequired[dict[str, dict[str, Any]]]  # launch settings per target (the tuning's choice)


class Attempt(TypedDict, total=False):
    """One iteration as the record shows it."""

    iteration: int
    template: str
    params: dict[str, Any]
    tuned: dict[str, dict[str, Any]]               # launch settings per target, where the tuning chose them
    why: str
    candidate_id: int
    path: str
    verdict: str
    message: str
    worst_ratio: float
    target_report: dict[str, Any]                  # the verification's targets, spills and findings
    modelled: dict[str, Any]                       # per target, the cost model's time at the model suite
    measured: dict[str, Any]                       # the model suite timed on the backend's GPU (perf.measure)
    diagnosis: dict[str, Any]


class PortState(TypedDict, total=False):
    run_id: str
    block: str
    budget: int
    explore: int
    attempt: int                                   # candidates rendered so far
    proposal: Proposal | None                      # the point to render next
    batch: list[Proposal]                          # the points to verify side by side next (explore branches)
    current: Attempt                               # the iteration in flight
    last_checks: list[dict[str, Any]]              # the checks of the last verification, for diagnose
    diagnosis: dict[str, Any]                      # {"class", "reason", "symptoms"} of the last failure
    history: Annotated[list[Attempt], operator.add]
    passing: Annotated[list[Attempt], operator.add]
    tuning: dict[str, Any]                         # the tuning's outcome (tune.Outcome, as the record keeps it)
    gate: dict[str, Any]                           # {"candidate_id" (None: every candidate failed), "replay_id"}
    status: str                                    # running, promoted, blocked, rejected
    reason: str
    operator_path: str
