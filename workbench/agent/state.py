"""The graph's state: plain JSON-able values only (it is checkpointed); the spec, templates and store live in the
PortContext the nodes close over."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict


class Proposal(TypedDict):
    """A point of a template's parameter space, and why it was chosen."""

    template: str
    params: dict[str, Any]
    reason: str


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
    status: str                                    # running, promoted, blocked
    reason: str
    operator_path: str
