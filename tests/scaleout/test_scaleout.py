"""The fan-out on a real local Ray instance (2 CPUs): a whole-model port with 2 workers promotes every block and
records every step once, a verification whose worker is killed is retried and gets one verdict, a CI job with 2
workers gives the JUnit of 1, Ctrl-C and a cluster that cannot be joined, the executor's resources and its
in-process form."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest
from sqlmodel import Session, func, select
from typer.testing import CliRunner

from workbench.agent.run import port_block
from workbench.backends import CUDA, INTERPRETER, Backend
from workbench.cli import app
from workbench.executor import (
    MAX_RETRIES,
    SYSTEM_TEMP,
    WORKER_SCRATCH,
    InProcessExecutor,
    RayExecutor,
    make_executor,
    ray_options,
    worker_scratch,
)
from workbench.operators import promote_file
from workbench.store import get_engine
from workbench.store.models import PortRun, RunStep
from workbench.store.queries import find_run, run_candidates, run_steps
from workbench.store.records import process_alive
from workbench.templating import load_template
from workbench.verify.harness import source_hash

runner = CliRunner()
QUICK = ["--suites", "smoke", "--dtypes", "float32", "--seeds", "1", "--targets", "none"]
# A command as a terminal starts it, SIGINT at its default: a suite run as a background job (`make test &`) ignores
# SIGINT, and a command started from it would inherit that and never see the Ctrl-C.
WITH_CTRL_C = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
               "os.execv(sys.argv[1], sys.argv[1:])"]
TASK_TITLE = b"ray::_in_worker"  # what Ray names a worker process while it runs one of the executor's tasks


def test_ray_options_name_cpus_gpus_and_other_accelerators():
    assert ray_options(INTERPRETER.resources) == {"num_cpus": 1, "num_gpus": 0}
    assert ray_options(CUDA.resources) == {"num_cpus": 1, "num_gpus": 1}
    ascend = Backend("ascend", "npu", ("float16",), ("smoke",), resources={"CPU": 1, "NPU": 1})
    assert ray_options(ascend.resources) == {"num_cpus": 1, "num_gpus": 0, "resources": {"NPU": 1}}


def test_one_worker_runs_in_process_without_ray(settings):
    executor = make_executor(settings, workers=1, address="127.0.0.1:1")  # one worker wins over an address
    assert isinstance(executor, InProcessExecutor) and executor.workers == 1
    assert executor.submit({}, os.getpid).result() == os.getpid()
    failed = executor.submit({}, int, "not a number")
    with pytest.raises(ValueError):
        failed.result()


def _descendant(pid: int, ancestor: int) -> bool:
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
        if pid == ancestor:
            return True
    return False


def task_workers() -> set[int]:
    """Pids of this test process's Ray workers running an executor task now (a child the worker has just forked
    carries its title until it execs: only the outermost of such a family counts)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                title = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if title.startswith(TASK_TITLE) and _descendant(int(entry), os.getpid()):
                found.add(int(entry))
    return {pid for pid in found if not any(_descendant(pid, other) for other in found - {pid})}


@pytest.mark.slow
@pytest.mark.interpreter
def test_a_whole_model_port_on_two_workers_promotes_every_block_and_records_each_step_once(
        settings, ray_instance, two_block_card):
    result = runner.invoke(app, ["port", "--model", two_block_card, "--workers", "2", "--budget", "3", *QUICK])
    assert result.exit_code == 0, result.output
    engine = get_engine(settings.db_url)
    runs = {}
    for block in ("rmsnorm", "situ"):
        manifests = list((settings.operators_dir / block).glob("*.json"))
        assert len(manifests) == 1, block
        run_id = json.loads(manifests[0].read_text())["run_id"]
        runs[block] = find_run(engine, run_id)
        assert runs[block].status == "promoted" and runs[block].model == two_block_card
        steps = run_steps(engine, run_id)
        assert [s.seq for s in steps] == list(range(1, len(steps) + 1))
        nodes = Counter(s.node for s in steps)
        candidates = run_candidates(engine, run_id)
        assert nodes["plan"] == nodes["promote"] == nodes["record"] == 1
        assert nodes["verify"] == len(candidates) == len({c.iteration for c in candidates})
        assert all(c.status for c in candidates) and candidates[-1].status == "pass"
        # the live view names the block of every event
        assert f"{block}     plan" in result.output and f"{block}   verify pass" in result.output
    # the two ports ran at once
    assert runs["rmsnorm"].started_at < runs["situ"].finished_at
    assert runs["situ"].started_at < runs["rmsnorm"].finished_at


def verifying(worker: int) -> bool:
    """Whether the worker's verification job is running: its job folder has its output log and no job.pt any more
    (the sandbox worker removes it when it starts)."""
    return any((job / "output.log").exists() and not (job / "job.pt").exists()
               for job in (SYSTEM_TEMP / f"{WORKER_SCRATCH}{worker}").glob("verify-*"))


@pytest.mark.slow
@pytest.mark.interpreter
def test_a_worker_killed_mid_verification_is_retried_and_the_candidate_gets_one_verdict(settings, ray_instance):
    executor = RayExecutor(None, 2)
    outcome: dict = {}
    port = threading.Thread(target=lambda: outcome.update(result=port_block(
        "rmsnorm", settings, suites=["smoke"], dtypes=["float32"], seeds=1, budget=3, targets=[],
        executor=executor)))
    port.start()
    deadline = time.monotonic() + 120
    while not (first := task_workers()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(first) == 1, "no worker ran the verification"
    killed = first.pop()
    deadline = time.monotonic() + 120
    while not verifying(killed) and time.monotonic() < deadline:  # into the verification: the job runs
        time.sleep(0.005)
    assert verifying(killed), "the worker never started the verification's job"
    os.kill(killed, signal.SIGKILL)
    retried = set()
    while port.is_alive() and not retried:
        retried = task_workers() - {killed}
        time.sleep(0.05)
    port.join(300)
    assert retried, "the verification was not run again on another worker"
    result = outcome["result"]
    assert result.status == "promoted", result.reason
    engine = get_engine(settings.db_url)
    candidates = run_candidates(engine, result.run_id)
    steps = run_steps(engine, result.run_id)
    assert candidates[0].status == "pass"
    assert sum(s.node == "verify" for s in steps) == len(candidates)
    assert [s.message.split(":")[0] for s in steps if s.node == "verify"][0] == "pass"
    # the killed worker's scratch (the candidate's copy, the verification's tensors) went with the retry's task
    assert not (SYSTEM_TEMP / f"{WORKER_SCRATCH}{killed}").exists()


def test_a_worker_removes_the_scratch_folders_of_dead_workers_and_keeps_the_living(tmp_path):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"{WORKER_SCRATCH}{int(ended.stdout)}"
    living = tmp_path / f"{WORKER_SCRATCH}{os.getppid()}"
    for folder in (dead, living):
        (folder / "verify-x").mkdir(parents=True)
        (folder / "verify-x" / "job.pt").write_bytes(b"tensors")
    mine = worker_scratch(tmp_path)
    assert mine == tmp_path / f"{WORKER_SCRATCH}{os.getpid()}" and mine.is_dir()
    assert not dead.exists() and (living / "verify-x" / "job.pt").exists()
    assert worker_scratch(tmp_path) == mine  # made once, kept


@pytest.mark.slow
@pytest.mark.interpreter
def test_exploring_on_two_workers_verifies_two_candidates_side_by_side(settings, ray_instance):
    result = runner.invoke(app, ["port", "rmsnorm", "--workers", "2", "--explore", "3", "--budget", "4",
                                 "--replay-steps", "0", "--json", *QUICK])
    assert result.exit_code == 0, result.output
    [outcome] = json.loads(result.stdout)
    assert outcome["status"] == "promoted", outcome
    engine = get_engine(settings.db_url)
    candidates = run_candidates(engine, outcome["run_id"])
    steps = [(s.node, s.message) for s in run_steps(engine, outcome["run_id"])]
    assert sorted(c.iteration for c in candidates) == [1, 2, 3] and all(c.status == "pass" for c in candidates)
    # each Ray worker holds warm servers of its own: every job there started as a fork of one
    assert [c.target_report["start"] for c in candidates] == ["warm"] * 3
    nodes = [node for node, _ in steps]
    assert nodes.count("verify") == 3 and "3 passing" in next(m for n, m in steps if n == "promote")
    # the first two were in flight at once: both rendered before either's verification ended, joined once; the
    # third (one more passing wanted) went alone
    assert nodes[:nodes.index("verify")].count("render") == 2 and "the first 2 side by side" in steps[0][1]
    assert nodes.index("explore") > [i for i, n in enumerate(nodes) if n == "verify"][1]
    assert "#1-#2 side by side: 2 of 2 passed" in next(m for n, m in steps if n == "explore")
    assert nodes[nodes.index("explore") + 1:].count("render") == 1


def _promote(settings, tmp_path, block: str, template: str) -> None:
    t = load_template(block, template)
    source = t.render(next(p for p in t.points() if not t.unmet(p, {"rows": 1, "N": 8192})))
    path = tmp_path / f"{block}_{template}.py"
    path.write_text(source)
    promote_file(path, settings.operators_dir, block, {"block": block, "template": template,
                                                       "source_hash": source_hash(source), "promoted_at": "1"})


def _junit(path: Path) -> list[tuple]:
    """The testcases of a JUnit file, with their failures, without timings."""
    suite = ET.parse(path).getroot()
    return [suite.get("tests"), suite.get("failures")] + sorted(
        (c.get("classname"), c.get("name"), c.get("file"), ET.tostring(c.find("failure")) if c.find("failure")
         is not None else None) for c in suite.iter("testcase"))


@pytest.mark.slow
@pytest.mark.interpreter
def test_a_ci_job_on_two_workers_gives_the_junit_of_one(settings, ray_instance, tmp_path):
    _promote(settings, tmp_path, "rmsnorm", "row_block")
    _promote(settings, tmp_path, "situ", "flat")
    junits = {}
    for workers in ("1", "2"):
        junits[workers] = tmp_path / f"junit-{workers}.xml"
        result = runner.invoke(app, ["ci", "--junit", str(junits[workers]), "--no-replays", "--no-parity",
                                     "--targets", "none", "--workers", workers])
        assert result.exit_code == 0, result.output
    assert _junit(junits["1"]) == _junit(junits["2"])
    assert len(_junit(junits["2"])) > 10


def test_a_ray_cluster_that_cannot_be_joined_is_one_line_and_exit_code_2(settings, tmp_path):
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    done = subprocess.run([str(Path(sys.executable).with_name("workbench")), "ci", "--no-replays", "--no-parity",
                           "--ray-address", f"127.0.0.1:{port}"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: could not join the Ray cluster at 127.0.0.1:{port}: [Errno 111] Connection refused (--workers 1 "
        f"verifies in this process, without Ray)"]


@pytest.mark.slow
@pytest.mark.interpreter
def test_ctrl_c_during_a_parallel_port_ends_the_command_and_leaves_every_run_interrupted(settings, tmp_path):
    # verifications of some seconds (two suites, two dtypes, two seeds): the signal comes while both are running
    command = [str(Path(sys.executable).with_name("workbench")), "port", "rmsnorm", "situ", "--workers", "2",
               "--suites", "smoke,edge", "--dtypes", "float32,float16", "--seeds", "2", "--targets", "none"]
    log = (tmp_path / "port.log").open("w")
    port = subprocess.Popen(WITH_CTRL_C + command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and port.poll() is None:
            with Session(get_engine(settings.db_url)) as s:
                if s.exec(select(func.count()).select_from(RunStep).where(RunStep.node == "contract")).one() == 2:
                    assert not s.exec(select(RunStep).where(RunStep.node == "verify")).first()
                    break
            time.sleep(0.2)
        time.sleep(1.0)  # both ports wait on their verifications
        state = Path(f"/proc/{port.pid}/status").read_text() if port.poll() is None else "ended"
        port.send_signal(signal.SIGINT)
        code = port.wait(60)
        log.close()
        assert code == 130, f"{[line for line in state.splitlines() if line.startswith(('Sig', 'Shd'))]}\n" \
            + (tmp_path / "port.log").read_text()[-3000:]
    finally:
        port.kill()
    with Session(get_engine(settings.db_url)) as s:
        runs = s.exec(select(PortRun)).all()
    assert sorted(r.block for r in runs) == ["rmsnorm", "situ"]
    assert {(r.status, r.reason) for r in runs} == {("interrupted", "interrupted by the user")}
    # the local Ray the command started is shut down, and its workers' scratch folders with it
    left = SYSTEM_TEMP.glob(f"{WORKER_SCRATCH}*")
    assert all(process_alive(int(folder.name.removeprefix(WORKER_SCRATCH))) for folder in left)


@pytest.mark.slow
@pytest.mark.interpreter
def test_a_verification_whose_worker_dies_on_every_try_is_the_verdict_crashed(ray_instance, tmp_path):
    """MAX_RETRIES + 1 tries, each worker killed as it starts the task: one "crashed" result, no error."""
    t = load_template("rmsnorm", "row_block")
    candidate = tmp_path / "rmsnorm_row_block.py"
    candidate.write_text(t.render(next(t.points())))
    executor = RayExecutor(None, 2)
    future = executor.submit_verification(candidate, block="rmsnorm", backend=INTERPRETER, suites=["smoke"],
                                          dtypes=["float32"], seeds=1, targets=[])
    killed: set[int] = set()
    deadline = time.monotonic() + 180
    while not future.done() and time.monotonic() < deadline:
        for pid in task_workers() - killed:
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.05)
    result = executor.settle(future, candidate, "rmsnorm", INTERPRETER)
    assert len(killed) == MAX_RETRIES + 1
    assert result.verdict == "crashed" and result.message.startswith(f"verification worker lost {MAX_RETRIES + 1}")
    assert result.candidate == str(candidate) and result.source_hash == source_hash(candidate.read_text())
