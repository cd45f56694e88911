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

from sqlalchemy import event, inspect, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool
from sqlmodel import Session, SQLModel, create_engine

from workbench.store import models  # noqa: F401 - registers the tables on SQLModel.metadata

BUSY_TIMEOUT_MS = 30_000
SCHEMA_LOCK = 0x776F726B  # the PostgreSQL advisory lock held while the tables are created ("work")


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
    """One engine per URL, tables created. In-memory SQLite shares one connection (StaticPool)."""
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
    with engine.begin() as conn:  # processes starting together on a new database: one creates the tables
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})")
        elif engine.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock (waits up to busy_timeout for another's)
        SQLModel.metadata.create_all(conn)
        add_missing_columns(conn)
    return engine


def add_missing_columns(conn: Connection) -> list[str]:
    """Columns a newer workbench added to a table that an older one created: added in place (nullable, or with
    their scalar default), so an existing database keeps working. Returns "table.column" for each one added."""
    added = []
    existing = inspect(conn)
    for table in SQLModel.metadata.sorted_tables:
        if not existing.has_table(table.name):
            continue
        present = {c["name"] for c in existing.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                continue
            kind = column.type.compile(dialect=conn.dialect)
            default = column.default.arg if column.default is not None and column.default.is_scalar else None
            clause = f" DEFAULT {_literal(default)}" if default is not None else ""
            conn.execute(text(f'ALTER TABLE "{table.name}" ADD COLUMN "{column.name}" {kind}{clause}'))
            added.append(f"{table.name}.{column.name}")
    return added


def _literal(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


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
