"""The store: SQLModel tables on one database URL (SQLite by default), engine and session helpers, shared queries."""

from workbench.store.db import get_engine, session_scope
from workbench.store.models import (
    Benchmark,
    Candidate,
    CIJob,
    LossReplay,
    PortRun,
    RunStep,
    VerificationCheck,
)

__all__ = [
    "Benchmark", "CIJob", "Candidate", "LossReplay", "PortRun", "RunStep",
    "VerificationCheck", "get_engine", "session_scope",
]
