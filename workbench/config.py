"""The workbench's settings, one scheme for the CLI, the agent, the verifier and the dashboard: each setting from
its explicit value (a flag), else the environment variable ``WORKBENCH_<NAME>``, else its default (pydantic-settings).

    WORKBENCH_DB          db_url         any SQLAlchemy URL (default sqlite:///workbench.db)
    WORKBENCH_OPERATORS   operators_dir  promoted operators
    WORKBENCH_HOME        work_dir       rendered candidates, scratch, the compile cache
    WORKBENCH_REPLAYS     replays_dir    replay reference curves and LoRA base checkpoints (kept in the repository)
    WORKBENCH_MODELS      models         extra model-card folders, os.pathsep separated
    WORKBENCH_TEMPLATES   templates      another templates root (default: the workbench's own)
    WORKBENCH_TARGETS     targets        GPU targets every candidate compiles for, comma-separated ("" for none)
    WORKBENCH_BACKEND     backend        auto, interpreter or cuda
    WORKBENCH_COMPILE_CACHE compile_cache  where compile results are kept (default: work_dir/compile-cache)
    WORKBENCH_REPLAY_STEPS  replay_steps   steps of the replay gate of `workbench port` (default 6; 0: no gate)
    WORKBENCH_WORKERS     workers        verifications at once (default: the cores; 1: in this process, no Ray)
    WORKBENCH_RAY_ADDRESS ray_address    a Ray cluster to verify on (default: a local Ray instance of its own)

The LLM proposer's settings are the same scheme under WORKBENCH_LLM_ (workbench.agent.llm.LLMConfig).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from workbench.errors import WorkbenchError

DEFAULT_DB_URL = "sqlite:///workbench.db"


class Settings(BaseSettings):
    """Where the workbench keeps things and what it runs on (the module docstring lists each variable)."""

    # the environment is read by the variables' names only (no lookup by a field's own name: DB_URL is not ours);
    # in code a field is set by its own name (__init__), and an unknown one is an error
    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    db_url: str = Field(DEFAULT_DB_URL, validation_alias="WORKBENCH_DB")
    operators_dir: Path = Field(Path("operators"), validation_alias="WORKBENCH_OPERATORS")
    work_dir: Path = Field(Path(".workbench"), validation_alias="WORKBENCH_HOME")
    replays_dir: Path = Field(Path("replays"), validation_alias="WORKBENCH_REPLAYS")
    models: str = Field("", validation_alias="WORKBENCH_MODELS")
    templates: Path | None = Field(None, validation_alias="WORKBENCH_TEMPLATES")
    targets: str | None = Field(None, validation_alias="WORKBENCH_TARGETS")
    backend: str = Field("auto", validation_alias="WORKBENCH_BACKEND")
    compile_cache: Path | None = Field(None, validation_alias="WORKBENCH_COMPILE_CACHE")
    replay_steps: int = Field(6, ge=0, validation_alias="WORKBENCH_REPLAY_STEPS")
    workers: int | None = Field(None, ge=1, validation_alias="WORKBENCH_WORKERS")
    ray_address: str | None = Field(None, validation_alias="WORKBENCH_RAY_ADDRESS")

    def __init__(self, **values):
        aliases = {name: f.validation_alias for name, f in type(self).model_fields.items()}
        super().__init__(**{aliases.get(k, k): v for k, v in values.items()})

    @classmethod
    def load(cls, db: str | None = None, operators_dir: str | Path | None = None) -> Settings:
        """Explicit values first, then the environment, then defaults. A value that does not parse is a
        WorkbenchError naming its variable."""
        given = {"db_url": db, "operators_dir": operators_dir}
        try:
            return cls(**{k: v for k, v in given.items() if v})
        except ValidationError as exc:
            error = exc.errors()[0]
            raise WorkbenchError(f"${error['loc'][0]}: {error['input']!r}: {error['msg']}") from None

    @property
    def model_dirs(self) -> list[Path]:
        """The extra model-card folders of $WORKBENCH_MODELS, in order."""
        return [Path(p) for p in self.models.split(os.pathsep) if p]

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
