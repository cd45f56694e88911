"""The record survives faults, on a SQLite file and on a PostgreSQL database: an agent killed with SIGKILL mid-run,
two agents and a dashboard reader on one store."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError

from workbench.dashboard.frames import candidates_frame, runs_frame, steps_frame
from workbench.store import get_engine
from workbench.store.queries import list_runs, run_candidates, run_steps

pytestmark = [pytest.mark.interpreter, pytest.mark.e2e]
WORKBENCH = str(Path(sys.executable).with_name("workbench"))


@pytest.fixture
def store(settings, store_url, monkeypatch) -> str:
    """The agents' store: a SQLite file, then a PostgreSQL database (exported as $WORKBENCH_DB for the CLI)."""
    monkeypatch.setenv("WORKBENCH_DB", store_url)
    return store_url


def _nodes(url: str) -> list[str]:
    """The nodes of every step recorded so far ([] before the agent has created the tables)."""
    try:
        with get_engine(url).connect() as conn:
            return list(conn.exec_driver_sql("SELECT node FROM run_step ORDER BY run_id, seq").scalars())
    except (OperationalError, ProgrammingError):  # no table yet
        return []


def _orphans(url: str) -> list[tuple]:
    """Rows whose parent row is missing: steps and candidates without their run, checks and builds without their
    candidate (what a torn write would leave)."""
    queries = [
        "SELECT 'run_step', s.id FROM run_step s LEFT JOIN port_run r ON r.id = s.run_id WHERE r.id IS NULL",
        "SELECT 'candidate', c.id FROM candidate c LEFT JOIN port_run r ON r.id = c.run_id "
        "WHERE c.run_id IS NOT NULL AND r.id IS NULL",
        "SELECT 'verification_check', v.id FROM verification_check v LEFT JOIN candidate c ON c.id = v.candidate_id "
        "WHERE c.id IS NULL",
        "SELECT 'kernel_build', b.id FROM kernel_build b LEFT JOIN candidate c ON c.id = b.candidate_id "
        "WHERE c.id IS NULL",
    ]
    with get_engine(url).connect() as conn:
        return [tuple(row) for q in queries for row in conn.exec_driver_sql(q)]


def test_kill_9_mid_run_leaves_a_consistent_record_marked_interrupted(store, tmp_path):
    agent = subprocess.Popen(
        [WORKBENCH, "port", "rmsnorm", "--start", "row_block:BLOCK_N=64,ACC_DTYPE=float16", "--budget", "4"],
        env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "verify" not in _nodes(store):
        time.sleep(0.2)
    time.sleep(1.0)  # inside the second candidate's render/verify
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait()
    assert "verify" in _nodes(store), "the agent never reached verify"

    if store.startswith("sqlite"):
        with sqlite3.connect(make_url(store).database) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert _orphans(store) == []
    listed = subprocess.run([WORKBENCH, "runs", "--json"], capture_output=True, text=True, timeout=60)
    (run,) = json.loads(listed.stdout)
    assert run["status"] == "interrupted" and run["finished_at"]
    engine = get_engine(store)
    seqs = [s.seq for s in run_steps(engine, run["id"])]
    assert seqs == list(range(1, len(seqs) + 1))
    first = run_candidates(engine, run["id"])[0]
    # its verdict was kept: the host code refuses the rows wider than 64
    assert first.status == "runtime_error" and first.params["BLOCK_N"] == 64
    # no sandbox process outlives the killed agent (PR_SET_PDEATHSIG)
    time.sleep(0.5)
    leftover = subprocess.run(["pgrep", "-f", f"worker.py {tmp_path}"], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""


def test_two_agents_and_a_dashboard_reader_share_one_store_and_lose_nothing(store, tmp_path):
    common = ["--suites", "smoke", "--seeds", "1", "--dtypes", "float32"]
    agents = [subprocess.Popen([WORKBENCH, "port", block, *common], env=os.environ.copy(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
              for block in ("rmsnorm", "swiglu")]
    engine = get_engine(store)
    reads = 0
    while any(a.poll() is None for a in agents):  # the dashboard's reads, polling throughout
        for run_id in runs_frame(engine)["id"]:
            steps_frame(engine, run_id)
            candidates_frame(engine, run_id=run_id)
        reads += 1
        time.sleep(0.05)
    for agent in agents:
        assert agent.returncode == 0, agent.stderr.read()
    runs = list_runs(engine)
    assert sorted(r.block for r in runs) == ["rmsnorm", "swiglu"] and reads > 5
    for run in runs:
        assert run.status == "promoted"
        nodes = [s.node for s in run_steps(engine, run.id)]
        assert nodes == ["plan", "render", "contract", "verify", "tune", "replay", "promote", "record"]
        assert [c.status for c in run_candidates(engine, run.id)] == ["pass"]
