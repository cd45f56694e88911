"""Where the workbench keeps things: the database URL, the operators folder, the scratch folder for candidates."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DB_URL = "sqlite:///workbench.db"


@dataclass(frozen=True)
class Settings:
    """db_url: any SQLAlchemy URL; operators_dir: promoted operators; work_dir: rendered candidates and scratch;
    replays_dir: replay reference curves and LoRA base checkpoints (kept in the repository)."""

    db_url: str
    operators_dir: Path
    work_dir: Path
    replays_dir: Path = Path("replays")

    @classmethod
    def load(cls, db: str | None = None, operators_dir: str | Path | None = None) -> Settings:
        """Explicit values first, then $WORKBENCH_DB / $WORKBENCH_OPERATORS / $WORKBENCH_HOME / $WORKBENCH_REPLAYS,
        then defaults."""
        return cls(
            db_url=db or os.environ.get("WORKBENCH_DB", DEFAULT_DB_URL),
            operators_dir=Path(operators_dir or os.environ.get("WORKBENCH_OPERATORS", "operators")),
            work_dir=Path(os.environ.get("WORKBENCH_HOME", ".workbench")),
            replays_dir=Path(os.environ.get("WORKBENCH_REPLAYS", "replays")),
        )

    @property
    def checkpoints_path(self) -> Path:
        """The agent's LangGraph checkpoints (SQLite, its own file): beside a SQLite store ("workbench.db" ->
        "workbench.checkpoints.sqlite"), else in the scratch folder."""
        from sqlalchemy.engine import make_url

        url = make_url(self.db_url)
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            db = Path(url.database)
            return db.with_name(f"{db.stem}.checkpoints.sqlite")
        return self.work_dir / "checkpoints.sqlite"
