"""The process a distributed replay runs in: ``python -m workbench.replay.launcher`` with the job (JSON) on stdin.
It starts the job's N ranks (``python -m workbench.replay.distributed``, a rendezvous on a free localhost port,
RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in their environment), passes rank 0's events on to its own stdout
and watches every rank.

When a rank fails, the replay ends: the launcher waits a moment for the other ranks' reports, names the rank that
caused it (one that raised or died of its own, before a rank that only lost its peer or timed out in a collective;
a rank still running while the others time out waiting for it has hung), stops every rank and reports one
{"event": "error", "rank", "message"}. Its parent (workbench.replay.supervise.launch) holds the overall timeout and
kills the launcher's process group, ranks included.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass

from workbench.replay.child import MARK, send_event

PR_SET_NAME = 15
REPORT_GRACE_S = 3.0
"""After the first failure, how long the other ranks' reports are awaited before the cause is named."""
PEER_FAILURE = re.compile(r"Connection (closed|reset)|peer|timed out|Timeout|Broken pipe|NCCL|[Gg]loo", re.I)
"""A rank failing with one of these lost a peer or waited for it: a consequence, not a cause."""


@dataclass
class Failure:
    rank: int
    message: str
    at: float

    @property
    def secondary(self) -> bool:
        return bool(PEER_FAILURE.search(self.message))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read(rank: int, stream, events: queue.Queue) -> None:
    for line in stream:
        if line.startswith(MARK):
            events.put((rank, json.loads(line[len(MARK):])))
        else:
            sys.stdout.write(line)  # what an operator prints
    events.put((rank, {"event": "eof"}))


def _last_line(stderr) -> str:
    stderr.seek(0)
    lines = stderr.read().decode(errors="replace").strip().splitlines()
    return lines[-1][:300] if lines else ""


RANK_NAME = "wb-rank-"
"""The name a forked rank gives itself (``ps -o comm``; /proc/<pid>/comm): its command line is the warm server's."""


def _name_process(name: str) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _popen(env: dict[str, str], stderr) -> subprocess.Popen:
    """A rank as a new interpreter."""
    return subprocess.Popen([sys.executable, "-m", "workbench.replay.distributed"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=stderr, env=env, text=True)


class ForkedRank:
    """A rank as a fork of this process (a fork of the warm worker's model server, where the ranks' code is
    imported): what run_ranks uses of subprocess.Popen (stdin, stdout, poll, wait, kill)."""

    def __init__(self, env: dict[str, str], stderr):
        stdin_read, stdin_write = os.pipe()
        stdout_read, stdout_write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                os.close(stdin_write)  # or its stdin never ends
                os.close(stdout_read)
                _name_process(f"{RANK_NAME}{env['RANK']}")
                os.dup2(stdin_read, 0)
                os.dup2(stdout_write, 1)
                os.dup2(stderr.fileno(), 2)
                sys.stdin, sys.stdout = open(0, closefd=False), open(1, "w", closefd=False)  # noqa: SIM115
                os.environ.clear()
                os.environ.update(env)
                from workbench.replay import distributed

                distributed.main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 - the rank's traceback, on its stderr
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(stdin_read)
        os.close(stdout_write)
        self.stdin, self.stdout = open(stdin_write, "w"), open(stdout_read)  # noqa: SIM115 - closed by their users
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_ranks(job: dict) -> int:
    """Start the ranks, relay their events, return the launcher's exit code (0: every rank finished)."""
    world = job["layout"]["ranks"]
    port = free_port()
    events: queue.Queue = queue.Queue()
    procs, stderrs = [], []
    # a fork of the warm worker (the ranks' code already imported, no thread started yet) forks its ranks
    start = ForkedRank if os.environ.get("WORKBENCH_WARM_JOB") == "1" else _popen
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        stderr = tempfile.TemporaryFile()
        proc = start(env, stderr)
        proc.stdin.write(json.dumps(job))
        proc.stdin.close()
        procs.append(proc)
        stderrs.append(stderr)
    for rank, proc in enumerate(procs):
        threading.Thread(target=_read, args=(rank, proc.stdout, events), daemon=True).start()
    failures: list[Failure] = []
    ended: set[int] = set()
    step = -1
    try:
        while len(ended) < world:
            if failures and time.monotonic() - failures[0].at > REPORT_GRACE_S:
                break
            try:
                rank, event = events.get(timeout=0.2)
            except queue.Empty:
                continue
            kind = event["event"]
            if kind == "step":
                step = event["step"]
                send_event(event)
            elif kind == "done":
                send_event(event)
            elif kind == "error":
                failures.append(Failure(rank, event["message"], time.monotonic()))
            elif kind == "eof":
                ended.add(rank)
                code = procs[rank].wait()
                if code != 0 and not any(f.rank == rank for f in failures):
                    failures.append(Failure(rank, f"the process died (exit {code}): {_last_line(stderrs[rank])}",
                                            time.monotonic()))
    finally:
        running = [r for r, p in enumerate(procs) if p.poll() is None]
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    if not failures:
        return 0
    send_event({"event": "error", **_cause(failures, running, step)})
    return 1


def _cause(failures: list[Failure], running: list[int], step: int) -> dict:
    """The rank that ended the replay and why: one that failed of its own first; else one still running while the
    others gave up waiting on it (it hung); else the first to report."""
    primary = [f for f in failures if not f.secondary]
    if primary:
        first = primary[0]
        return {"rank": first.rank, "message": f"rank {first.rank}: {first.message}"}
    if running:
        waited = ", ".join(str(f.rank) for f in failures)
        return {"rank": running[0], "message": f"rank {running[0]} hung at step {step + 1}: rank(s) {waited} timed "
                                               f"out waiting for it in a collective ({failures[0].message[:200]})"}
    first = failures[0]
    return {"rank": first.rank, "message": f"rank {first.rank}: {first.message}"}


def main() -> None:
    job = json.loads(sys.stdin.read())
    sys.exit(run_ranks(job))


if __name__ == "__main__":
    main()
