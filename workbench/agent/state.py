"""The graph's state: plain JSON-able values only (it is checkpointed); the spec, templates and store live in the
PortContext the nodes close over."""

from __future__ import annotations

import operator
from typing import Annotated, Any, NotRequired, TypedDict


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


class Attempt(TypedDict, total=False):
    """One iteration as the record shows it."""

    iteration: int
    template: str
    params: dict[str, Any]
    why: str
    candidate_id: int
    path: str
    verdict: str
    message: str
    worst_ratio: float
    evidence: dict[str, Any]                       # the verification's targets, spills and findings
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
    current: Attempt                               # the iteration in flight
    last_checks: list[dict[str, Any]]              # the checks of the last verification, for diagnose
    diagnosis: dict[str, Any]                      # {"class", "reason", "evidence"} of the last failure
    history: Annotated[list[Attempt], operator.add]
    passing: Annotated[list[Attempt], operator.add]
    gate: dict[str, Any]                           # {"candidate_id" (None: every candidate failed), "replay_id"}
    status: str                                    # running, promoted, blocked, rejected
    reason: str
    operator_path: str
