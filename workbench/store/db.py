"""Engines and sessions on any SQLAlchemy URL: SQLite by default, PostgreSQL for a team
(``postgresql+psycopg://user:password@host:5432/workbench``, with the ``postgres`` extra).

SQLite connections get busy_timeout, WAL, synchronous=NORMAL and foreign keys, in that order, on every connection.
PostgreSQL sessions run in UTC, so a server in another time zone stores the same instants. JSON columns hold
standard JSON on every dialect: a non-finite float (a diverged loss) is stored as null, which PostgreSQL's json type
accepts and NaN is not."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from importlib.resources import files

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import event, inspect
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool
from sqlmodel import Session, SQLModel, create_engine

from workbench.store import models  # noqa: F401 - registers the tables on SQLModel.metadata

BUSY_TIMEOUT_MS = 30_000
SCHEMA_LOCK = 0x776F726B  # the PostgreSQL advisory lock held while the schema is migrated ("work")


def _finite(value):
    """``value`` with every non-finite float replaced by None, through lists and dicts."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def json_serializer(value) -> str:
    return json.dumps(_finite(value), allow_nan=False)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


@cache
def get_engine(url: str) -> Engine:
    """One engine per URL, its database migrated to the newest revision (workbench/store/migrations) under a lock,
    so processes opening a new or older database together migrate it once. In-memory SQLite shares one connection
    (StaticPool)."""
    kwargs: dict = {"json_serializer": json_serializer}
    if url.startswith("postgresql"):
        kwargs["connect_args"] = {"options": "-c timezone=UTC"}
        kwargs["pool_pre_ping"] = True
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000}
        if url in ("sqlite://", "sqlite:///:memory:"):
            kwargs["poolclass"] = StaticPool
    engine = create_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    with engine.begin() as conn:  # processes starting together on a new database: one migrates it
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})")
        elif engine.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock (waits up to busy_timeout for another's)
        migrate(conn)
    return engine


def alembic_config(conn: Connection | None = None) -> Config:
    """Alembic's configuration for the migrations shipped in workbench/store/migrations, run on ``conn``."""
    config = Config()
    config.set_main_option("script_location", str(files("workbench.store").joinpath("migrations")))
    config.attributes["connection"] = conn
    return config


def migrate(conn: Connection) -> str:
    """The database behind ``conn`` brought to the newest revision; returns the revision it had (``"new"`` for an
    empty database, which gets today's tables and is stamped, ``"none"`` for one a workbench made before there were
    migrations, which is stamped with the revision its tables match and then upgraded). Runs in the caller's
    transaction: the caller holds the schema lock."""
    config = alembic_config(conn)
    found = MigrationContext.configure(conn).get_current_revision()
    if found is None:
        tables = set(inspect(conn).get_table_names())
        if not tables & set(SQLModel.metadata.tables):
            SQLModel.metadata.create_all(conn)
            command.stamp(config, "head")
            return "new"
        command.stamp(config, release_revision(conn))
        found = "none"
    command.upgrade(config, "head")
    return found


def release_revision(conn: Connection) -> str:
    """The revision whose tables a database made before migrations has: that of the newest release whose mark it
    carries (a release opening an older database added its new tables and columns to it)."""
    existing = inspect(conn)
    tables = set(existing.get_table_names())

    def columns(table: str) -> set[str]:
        return {c["name"] for c in existing.get_columns(table)} if table in tables else set()

    if "label" in columns("benchmark"):
        return "0004" if "model" in tables else "0005"
    if "kernel_build" in tables:
        return "0003"
    if "kind" in columns("loss_replay"):
        return "0002"
    return "0001"


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A short transaction: committed on success, rolled back on error."""
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
