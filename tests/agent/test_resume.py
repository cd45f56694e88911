"""Resumable runs: a `workbench port` killed in the middle of a run, and a run that failed on a workbench error,
continue from their last checkpoint; the store shows them resumed and holds nothing twice."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.agent.run import port_block, resume_port
from workbench.cli import app
from workbench.dashboard.frames import runs_frame
from workbench.errors import WorkbenchError
from workbench.executor import InProcessExecutor
from workbench.store import get_engine, records
from workbench.store.queries import candidate_checks, find_run, list_runs, run_candidates, run_steps

FAST = {"seeds": 1, "suites": ["smoke"], "dtypes": ["float32"]}


def assert_recorded_once(engine, run_id: str) -> list:
    """One candidate per iteration, and no check recorded twice for a candidate."""
    candidates = run_candidates(engine, run_id)
    assert [c.iteration for c in candidates] == list(range(1, len(candidates) + 1))
    for candidate in candidates:
        keys = Counter((c.suite, c.shape, c.dtype, c.seed, c.direction) for c in candidate_checks(engine, candidate.id))
        assert keys and max(keys.values()) == 1, candidate.iteration
    return candidates


@pytest.mark.interpreter
@pytest.mark.e2e
def test_a_port_killed_mid_run_resumes_from_its_last_node(settings):
    exe = shutil.which("workbench", path=str(Path(sys.executable).parent))
    proc = subprocess.Popen([exe, "port", "rmsnorm", "--start", "row_block:BLOCK_N=64,ACC_DTYPE=float16",
                             "--budget", "4", "--seeds", "1", "--suites", "smoke", "--dtypes", "float32"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    engine = get_engine(settings.db_url)
    deadline = time.monotonic() + 240
    try:
        while True:  # kill it as soon as the first candidate is verified
            runs = list_runs(engine)
            if runs and any(s.node == "verify" for s in run_steps(engine, runs[0].id)):
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no candidate verified in time"
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    run_id = runs[0].id
    # killed in the middle: the first candidate verified, the second at most rendered, the run unfinished
    before = [c.status for c in run_candidates(engine, run_id)]
    assert before[0] != "rendered" and before[1:] in ([], ["rendered"])
    assert find_run(engine, run_id).finished_at is None

    events = []
    outcome = resume_port(run_id, settings, on_event=lambda node, message, data: events.append(node))
    assert outcome.status == "promoted", outcome.reason
    assert events[0] == "resume" and events[-1] == "record"
    candidates = assert_recorded_once(engine, run_id)
    assert len(candidates) == 3 and candidates[0].params["BLOCK_N"] == 64 and candidates[-1].status == "pass"

    run = find_run(engine, run_id)
    assert run.status == "promoted" and run.finished_at is not None and run.operator_path
    (resumed,) = [s for s in run_steps(engine, run_id) if s.node == "resume"]
    assert resumed.message.startswith("resumed at ") and "after interrupted" in resumed.message
    assert runs_frame(engine).set_index("id").loc[run_id, "resumes"] == 1
    assert "resumed 1 time" in CliRunner().invoke(app, ["show", run_id]).stdout
    # an ended run has nothing left to resume
    result = CliRunner().invoke(app, ["port", "--resume", run_id])
    assert result.exit_code == 2 and "has ended (promoted): nothing to resume" in result.stderr


def lose_the_disk_at_the_first_verify():
    """An event hook that raises OSError on the run's first verify event, as a workbench error would."""
    failed: list[str] = []

    def hook(node: str, message: str, data: dict) -> None:
        if node == "verify" and not failed:
            failed.append(message)
            raise OSError("the agent host lost its disk")

    return hook


@pytest.mark.interpreter
def test_a_run_that_failed_on_a_workbench_error_resumes(settings):
    with pytest.raises(OSError):
        port_block("rmsnorm", settings, budget=2, on_event=lose_the_disk_at_the_first_verify(), **FAST)
    engine = get_engine(settings.db_url)
    (run,) = list_runs(engine)
    assert run.status == "failed" and "lost its disk" in run.reason

    outcome = resume_port(run.id[:17], settings)
    assert outcome.status == "promoted" and outcome.run_id == run.id
    (candidate,) = assert_recorded_once(engine, run.id)
    assert candidate.status == "pass"
    assert "after failed: workbench error: OSError" in next(s.message for s in run_steps(engine, run.id)
                                                               if s.node == "resume")


class TwoAtOnce(InProcessExecutor):
    """Verifies in this process, two at once: each explore branch's thread runs its own candidate's sandbox."""

    workers = 2


@pytest.mark.interpreter
def test_a_run_that_failed_while_candidates_were_verified_side_by_side_resumes_and_records_each_once(settings):
    with pytest.raises(OSError):
        port_block("rmsnorm", settings, budget=3, explore=2, executor=TwoAtOnce(),
                   on_event=lose_the_disk_at_the_first_verify(), **FAST)
    engine = get_engine(settings.db_url)
    (run,) = list_runs(engine)
    assert run.status == "failed" and "side by side" in run_steps(engine, run.id)[0].message

    outcome = resume_port(run.id, settings, executor=TwoAtOnce())
    assert outcome.status == "promoted" and outcome.attempts == 2, outcome.reason
    candidates = assert_recorded_once(engine, run.id)
    assert [c.status for c in candidates] == ["pass", "pass"]
    nodes = [s.node for s in run_steps(engine, run.id)]
    # a branch that had ended keeps its verdict (its writes are checkpointed); one still running verifies again
    assert nodes[:nodes.index("resume")].count("verify") >= 1 and nodes.count("verify") <= 3
    assert nodes.count("explore") == 1 and nodes[-2:] == ["promote", "record"]


def test_resume_refuses_unknown_running_and_missing_runs(settings):
    with pytest.raises(WorkbenchError, match="no run 'nosuch'"):
        resume_port("nosuch", settings)
    engine = get_engine(settings.db_url)
    mine = records.start_run(engine, block="rmsnorm", proposer="search", backend="interpreter", budget=2,
                             config={"suites": ["smoke"], "dtypes": ["float32"], "seeds": 1, "timeout_s": 60.0})
    with pytest.raises(WorkbenchError, match=f"run {mine} is still running \\(pid {os.getpid()}"):
        resume_port(mine, settings)
    records.finish_run(engine, mine, "interrupted", "the agent process ended before the run finished")
    with pytest.raises(WorkbenchError, match="has no checkpoint to resume from"):
        resume_port(mine, settings)
    result = CliRunner().invoke(app, ["port", "swiglu", "--resume", mine])
    assert result.exit_code == 2 and f"run {mine} ports rmsnorm, not swiglu" in result.stderr
