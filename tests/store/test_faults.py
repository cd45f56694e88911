"""The record survives faults: an agent killed with SIGKILL mid-run, two agents and a reader on one SQLite file."""

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

from workbench.store import get_engine
from workbench.store.queries import list_runs, run_candidates, run_steps

pytestmark = [pytest.mark.interpreter, pytest.mark.e2e]
WORKBENCH = str(Path(sys.executable).with_name("workbench"))


def _steps(db_path: Path) -> list[tuple]:
    if not db_path.exists():
        return []
    with sqlite3.connect(db_path, timeout=30) as conn:
        try:
            return conn.execute("SELECT run_id, seq, node FROM run_step ORDER BY run_id, seq").fetchall()
        except sqlite3.OperationalError:
            return []


def test_kill_9_mid_run_leaves_a_consistent_record_marked_interrupted(settings, tmp_path):
    db_path = tmp_path / "workbench.db"
    agent = subprocess.Popen(
        [WORKBENCH, "port", "rmsnorm", "--start", "row_block:BLOCK_N=64,ACC_DTYPE=float16", "--budget", "4"],
        env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(node == "verify" for _, _, node in _steps(db_path)):
        time.sleep(0.2)
    time.sleep(1.0)  # inside the second candidate's render/verify
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait()
    assert any(node == "verify" for _, _, node in _steps(db_path)), "the agent never reached verify"

    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    listed = subprocess.run([WORKBENCH, "runs", "--json"], capture_output=True, text=True, timeout=60)
    (run,) = json.loads(listed.stdout)
    assert run["status"] == "interrupted" and run["finished_at"]
    engine = get_engine(settings.db_url)
    seqs = [s.seq for s in run_steps(engine, run["id"])]
    assert seqs == list(range(1, len(seqs) + 1))
    first = run_candidates(engine, run["id"])[0]
    assert first.status in ("fail", "unwritten_output") and first.params["BLOCK_N"] == 64  # its verdict was kept
    # no sandbox process outlives the killed agent (PR_SET_PDEATHSIG)
    time.sleep(0.5)
    leftover = subprocess.run(["pgrep", "-f", f"worker.py {tmp_path}"], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""


def test_two_agents_and_a_reader_share_one_sqlite_file_and_lose_nothing(settings, tmp_path):
    common = ["--suites", "smoke", "--seeds", "1", "--dtypes", "float32"]
    agents = [subprocess.Popen([WORKBENCH, "port", block, *common], env=os.environ.copy(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
              for block in ("rmsnorm", "swiglu")]
    engine = get_engine(settings.db_url)
    reads = 0
    while any(a.poll() is None for a in agents):  # a dashboard-like reader polling throughout
        for run in list_runs(engine):
            run_steps(engine, run.id)
        reads += 1
        time.sleep(0.05)
    for agent in agents:
        assert agent.returncode == 0, agent.stderr.read()
    runs = list_runs(engine)
    assert sorted(r.block for r in runs) == ["rmsnorm", "swiglu"] and reads > 5
    for run in runs:
        assert run.status == "promoted"
        nodes = [s.node for s in run_steps(engine, run.id)]
        assert nodes == ["plan", "render", "compile", "verify", "replay", "promote", "record"]
        assert [c.status for c in run_candidates(engine, run.id)] == ["pass"]
