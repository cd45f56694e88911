"""Engines and sessions. SQLite connections get busy_timeout, WAL, synchronous=NORMAL and foreign keys, in that
order, on every connection; other dialects are left as they are."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

from sqlalchemy import event, inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import StaticPool
from sqlmodel import Session, SQLModel, create_engine

from workbench.store import models  # noqa: F401 - registers the tables on SQLModel.metadata

BUSY_TIMEOUT_MS = 30_000


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
    kwargs: dict = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000}
        if url in ("sqlite://", "sqlite:///:memory:"):
            kwargs["poolclass"] = StaticPool
    engine = create_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    SQLModel.metadata.create_all(engine)
    add_missing_columns(engine)
    return engine


def add_missing_columns(engine: Engine) -> list[str]:
    """Columns a newer workbench added to a table that an older one created: added in place (nullable, or with
    their scalar default), so an existing database keeps working. Returns "table.column" for each one added."""
    added = []
    existing = inspect(engine)
    for table in SQLModel.metadata.sorted_tables:
        if not existing.has_table(table.name):
            continue
        present = {c["name"] for c in existing.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                continue
            kind = column.type.compile(dialect=engine.dialect)
            default = column.default.arg if column.default is not None and column.default.is_scalar else None
            clause = f" DEFAULT {_literal(default)}" if default is not None else ""
            with engine.begin() as conn:
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
