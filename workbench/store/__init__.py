"""The store: SQLModel tables on one database URL (SQLite by default), the engine (its schema migrated to the newest
revision on open, workbench/store/migrations), session helpers, typed writes (records) and reads (queries). A leaf:
it imports nothing of the workbench but the vocabulary (workbench.status and workbench.dashboard build on it)."""

from workbench.store.db import get_engine, session_scope
from workbench.store.models import (
    Benchmark,
    Candidate,
    CIJob,
    LossReplay,
    PortRun,
    RunStep,
    TuneProbe,
    VerificationCheck,
)

__all__ = [
    "Benchmark", "CIJob", "Candidate", "LossReplay", "PortRun", "RunStep", "TuneProbe",
    "VerificationCheck", "get_engine", "session_scope",
]
