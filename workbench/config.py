"""Where the workbench keeps things: the database URL, the operators folder, the scratch folder for candidates."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DB_URL = "sqlite:///workbench.db"


@dataclass(frozen=True)
class Settings:
    """db_url: any SQLAlchemy URL; operators_dir: promoted operators; work_dir: rendered candidates and scratch."""

    db_url: str
    operators_dir: Path
    work_dir: Path

    @classmethod
    def load(cls, db: str | None = None, operators_dir: str | Path | None = None) -> Settings:
        """Explicit values first, then $WORKBENCH_DB / $WORKBENCH_OPERATORS / $WORKBENCH_HOME, then defaults."""
        return cls(
            db_url=db or os.environ.get("WORKBENCH_DB", DEFAULT_DB_URL),
            operators_dir=Path(operators_dir or os.environ.get("WORKBENCH_OPERATORS", "operators")),
            work_dir=Path(os.environ.get("WORKBENCH_HOME", ".workbench")),
        )
