"""The store's schema migrations (workbench/store/migrations): databases that older releases made, loaded from SQL
dumps of stores those releases' own code created and filled (tests/store/releases/<commit>.<dialect>.sql), are opened
by today's get_engine: every row survives, the schema becomes today's models', and the database is at the newest
revision. On SQLite, then on PostgreSQL.

The dumps: e470ffc, the last release without migrations; 929c0c3, the release before benchmark.label and
benchmark.subject (it still had the model and block tables nothing wrote); 2f599b0, the first release (schema only,
SQLite). Each was made by running that commit's workbench (git archive <commit> workbench, on PYTHONPATH) to create
and fill a store, then sqlite3's iterdump or pg_dump --inserts --no-owner --no-privileges (psql meta-commands
dropped)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, make_url, text
from sqlmodel import SQLModel

from workbench.dashboard.frames import loss_replays_frame
from workbench.store import get_engine, queries, records
from workbench.store.db import alembic_config, migrate, release_revision

RELEASES = Path(__file__).parent / "releases"


def dialect(url: str) -> str:
    return "postgresql" if url.startswith("postgresql") else "sqlite"


def load_release(url: str, commit: str) -> None:
    """Run a release's SQL dump against the (empty) database at ``url``."""
    script = (RELEASES / f"{commit}.{dialect(url)}.sql").read_text()
    if dialect(url) == "sqlite":
        with sqlite3.connect(make_url(url).database) as con:
            con.executescript(script)
        return
    import psycopg

    parsed = make_url(url)
    with psycopg.connect(host=parsed.query["host"], user=parsed.username, dbname=parsed.database,
                         autocommit=True) as conn:
        conn.execute(script)


def raw(url: str):
    """A plain engine on ``url``: no migration, no pragmas."""
    return create_engine(url)


def snapshot(url: str) -> dict[str, list[dict]]:
    """Every row of every table (alembic_version aside), as stored, ordered by primary key."""
    engine = raw(url)
    try:
        with engine.connect() as conn:
            tables = [t for t in inspect(conn).get_table_names() if t != "alembic_version"]
            return {t: [dict(r) for r in conn.execute(text(f'SELECT * FROM "{t}" ORDER BY 1')).mappings()]
                    for t in tables}
    finally:
        engine.dispose()


def schema(url: str) -> dict[str, set[str]]:
    engine = raw(url)
    try:
        with engine.connect() as conn:
            found = inspect(conn)
            return {t: {c["name"] for c in found.get_columns(t)} for t in found.get_table_names()}
    finally:
        engine.dispose()


MODELS = {name: {c.name for c in table.columns} for name, table in SQLModel.metadata.tables.items()}


def head() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def assert_at_todays_schema(url: str) -> None:
    """The tables and columns of today's models, nothing autogenerate would change, at the newest revision."""
    assert schema(url) == {**MODELS, "alembic_version": {"version_num"}}
    engine = raw(url)
    try:
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), SQLModel.metadata) == []
            assert MigrationContext.configure(conn).get_current_revision() == head() == "0011"
    finally:
        engine.dispose()


RENAMED = {"candidate": {"evidence": "target_report"}}
"""Columns a later revision renamed: their values are held to the new name."""


def assert_rows_survived(before: dict[str, list[dict]], after: dict[str, list[dict]]) -> None:
    """Every row of every table that still exists, with the values of every column that still exists (under its new
    name where RENAMED says); the tables a later revision created are there, empty."""
    kept = {t: [{RENAMED.get(t, {}).get(k, k): v for k, v in r.items()} for r in rows]
            for t, rows in before.items() if t in MODELS}
    assert {t: len(rows) for t, rows in after.items() if t in before} == {t: len(rows) for t, rows in kept.items()}
    assert {t: len(rows) for t, rows in after.items() if t not in before} == dict.fromkeys(set(MODELS) - set(before), 0)
    for table, rows in kept.items():
        common = MODELS[table] & set(rows[0]) if rows else set()
        assert [{k: r[k] for k in common} for r in rows] == [{k: r[k] for k in common} for r in after[table]], table


def test_a_store_of_the_last_release_without_migrations_is_adopted_with_every_row(store_url):
    load_release(store_url, "e470ffc")
    before = snapshot(store_url)
    assert "alembic_version" not in schema(store_url)
    assert [r["candidate_id"] for r in before["benchmark"]] == [None, None]  # the column nothing ever set

    engine = get_engine(store_url)
    after = snapshot(store_url)
    assert_rows_survived(before, after)
    assert_at_todays_schema(store_url)
    assert {t: len(rows) for t, rows in after.items()} == {
        "benchmark": 2, "candidate": 3, "ci_job": 1, "kernel_build": 2, "loss_replay": 2, "port_run": 2,
        "run_step": 3, "verification_check": 3, "parity_run": 0, "tune_probe": 0}

    # the typed reads see the old rows, and new rows get the next ids (PostgreSQL's sequences came with the dump)
    assert [r.id for r in queries.list_runs(engine)] == ["20261130-130000-cd34", "20261130-120000-ab12"]
    assert [s.node for s in queries.run_steps(engine, "20261130-120000-ab12")] == ["plan", "render", "verify"]
    assert [b.registers for b in queries.kernel_builds(engine, 2)] == [96, None]
    assert [(b.label, b.subject) for b in queries.benchmarks(engine)] == [("measured", "eager"),
                                                                          ("modelled", "operator")]
    assert records.add_candidate(engine, block="rmsnorm", source="x", source_hash="h", path="p") == 4
    records.add_step(engine, "20261130-120000-ab12", "resume", "taken up again")
    assert queries.run_steps(engine, "20261130-120000-ab12")[-1].seq == 4


def test_a_store_from_before_benchmark_labels_gains_them_and_loses_the_unwritten_tables(store_url):
    load_release(store_url, "929c0c3")
    before = snapshot(store_url)
    assert "label" not in schema(store_url)["benchmark"] and {"model", "block"} <= set(before)

    engine = get_engine(store_url)
    after = snapshot(store_url)
    assert_rows_survived(before, after)
    assert_at_todays_schema(store_url)
    assert [(r["label"], r["subject"]) for r in after["benchmark"]] == [("measured", "operator")] * 2
    assert [(b.label, b.subject, b.metric) for b in queries.benchmarks(engine)] == [
        ("measured", "operator", "time:fwd+bwd"), ("measured", "operator", "time:fwd")]
    assert len(queries.candidate_checks(engine, 1)) == 2


@pytest.mark.parametrize(("commit", "revision"), [("2f599b0", "0001"), ("929c0c3", "0003"), ("e470ffc", "0005")])
def test_a_store_made_before_migrations_is_stamped_with_its_releases_revision(tmp_path, commit, revision):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    load_release(url, commit)
    engine = raw(url)
    with engine.begin() as conn:
        assert release_revision(conn) == revision
        assert migrate(conn) == "none"
    with engine.begin() as conn:
        assert migrate(conn) == head()  # already there: nothing to do
    engine.dispose()
    assert_at_todays_schema(url)


def test_the_migrations_from_an_empty_database_build_todays_models_and_undo_to_nothing(store_url):
    """A new store is made by create_all and stamped (migrate says "new"); the revisions run one by one from
    nothing make the same schema, and their downgrades take it back to nothing."""
    engine = raw(store_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")
    assert_at_todays_schema(store_url)
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    assert set(schema(store_url)) == {"alembic_version"}
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")
    engine.dispose()
    assert_at_todays_schema(store_url)


def test_a_new_store_is_created_and_stamped(store_url):
    engine = raw(store_url)
    with engine.begin() as conn:
        assert migrate(conn) == "new"
    engine.dispose()
    assert_at_todays_schema(store_url)


@pytest.mark.slow  # several processes racing: the whole suite's
def test_processes_opening_an_old_store_together_migrate_it_once(store_url, open_together):
    """Four processes open a store of the last release at the same moment: one adopts and upgrades it under the
    schema lock, the others find it at the newest revision; every one reads the old runs."""
    load_release(store_url, "e470ffc")
    outcomes = open_together(store_url)
    assert [(rc, out) for rc, out, _ in outcomes] == [(0, "2")] * 4, outcomes
    assert_at_todays_schema(store_url)


def test_a_database_from_an_older_workbench_gains_the_new_columns(tmp_path):
    """A loss_replay table as the first release created it (with the rest of that release's tables): opened by this
    release, its rows read with the new columns at their defaults."""
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.executescript((RELEASES / "2f599b0.sqlite.sql").read_text())
    con.execute("INSERT INTO loss_replay (model, mode, preset, seed, ops, curve, reference_curve, status, reason, "
                "created_at) VALUES ('kimi-k3.1-pro', 'scratch', 'tiny', 0, '{}', '[2.0]', '[2.0]', 'pass', '', "
                "'2026-11-01 00:00:00')")
    con.commit()
    con.close()
    frame = loss_replays_frame(get_engine(f"sqlite:///{path}"))
    assert list(frame["status"]) == ["pass"] and frame["left_band_step"].isna().all()
    columns = {row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(loss_replay)")}
    assert {"kind", "steps", "backend", "left_band_step", "detail", "finished_at"} <= columns
    kinds = sqlite3.connect(path).execute("SELECT kind FROM loss_replay").fetchall()
    assert kinds == [("operators",)]
