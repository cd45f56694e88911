"""The parent's side of the warm worker (workbench/verify/forkserver.py): fork servers started at their first job and
kept until the process ends, inside the isolation in force, one per kind and Triton mode (TRITON_INTERPRET is read
when triton is imported):

- "verify" serves the sandbox workers (verification, compile-for-target, timing); it imports no workbench module;
- "model" serves the replay's and parity's training children (python -m MODULE with a JSON job on stdin; a
  distributed replay's launcher, which forks its ranks), with torch, transformers, PEFT and the workbench's
  training code imported.

    code = warm_server("verify", env).run(worker, job_dir, env, timeout_s, memory_bytes, readable, result_fd)
    proc = warm_popen("workbench.replay.child", env, cwd, timeout_s, writable, readable)   # None: run it cold

With bubblewrap the server runs with / read-only, no network, its own PID and IPC namespaces and the temporary
folder writable (the job folders live there); each job takes mount, PID, IPC and network namespaces of its own and
sees, of the temporary folders, only its own folders and the ones it reads (forkserver.py). Without bubblewrap the
jobs run under the worker's audit hook, as cold children do. WORKBENCH_WARM=0: every job starts a cold child.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from workbench.errors import WorkbenchError

FORKSERVER = Path(__file__).with_name("forkserver.py")
WORKERS = (Path(__file__).with_name("worker.py"), Path(__file__).with_name("compile_worker.py"),
           Path(__file__).resolve().parents[1] / "perf" / "measure_worker.py")
"""The sandbox workers the "verify" server imports once (each imports only the standard library at module level)."""
MODULES = ("workbench.replay.child", "workbench.replay.launcher", "workbench.replay.distributed",
           "workbench.integrations.parity_child", "workbench.replay.train",
           "workbench.replay.mtp", "workbench.replay.tiers", "workbench.integrations.families", "workbench.kernels",
           "transformers", "peft")
"""The "model" server's imports: its entry modules and what they import when they run."""
START_TIMEOUT_S = 120
REPLY_MARGIN_S = 30  # past the job's own timeout, which the server enforces, the parent stops waiting
_servers: dict[tuple, WarmServer | None] = {}
_lock = threading.Lock()
_starter = ThreadPoolExecutor(1, thread_name_prefix="warm-starter")
"""Servers start from this one thread, which lives as long as the process: a server dies with the thread that
started it (its parent-death signal follows the thread), and a verification's thread may end before its process."""


def enabled() -> bool:
    """Whether jobs run in a warm worker (WORKBENCH_WARM=0: a cold child each, as before)."""
    return os.environ.get("WORKBENCH_WARM", "1") != "0"


def job_root() -> Path:
    """The folder every warm job's folders live in (the temporary folder: the server may write there)."""
    return Path(tempfile.gettempdir()).resolve()


def _under_job_root(folders) -> bool:
    return all(Path(f).resolve().is_relative_to(job_root()) for f in folders)


class WarmJob:
    """A job handed to the server: ``wait`` for its exit code, ``kill`` it (closing the connection does)."""

    def __init__(self, conn: socket.socket, timeout_s: float, log_path: Path):
        self.conn, self.timeout_s, self.log_path = conn, timeout_s, log_path
        self.returncode: int | None = None
        self.timed_out = self.killed = False

    def wait(self) -> int | None:
        """The job's exit code (negative: the signal), None when it ran past its timeout or was killed; raises
        WorkbenchError when the server stopped under it."""
        reply = b""
        try:
            self.conn.settimeout(self.timeout_s + REPLY_MARGIN_S)
            while not reply.endswith(b"\n"):
                chunk = self.conn.recv(4096)
                if not chunk:
                    break
                reply += chunk
        except TimeoutError:
            self.killed = True  # closing the connection below makes the server kill the job
        except OSError:
            pass
        finally:
            self.conn.close()
        if not reply.endswith(b"\n"):
            if not self.killed:
                raise WorkbenchError(f"the warm worker stopped during the job (its log: {self.log_path})")
            self.timed_out = True
            return None
        answer = json.loads(reply)
        self.timed_out = bool(answer.get("timeout"))
        self.returncode = None if self.timed_out else int(answer["code"])
        return self.returncode

    def kill(self) -> None:
        self.killed = True
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class WarmServer:
    """One running fork server: its process, its socket, whether its jobs get namespaces of their own."""

    def __init__(self, kind: str, env: dict[str, str]):
        from workbench.verify.sandbox import child_env, isolation, server_command

        self.kind = kind
        self.folder = Path(tempfile.mkdtemp(prefix=f"warm-{kind}-", dir=job_root()))
        self.socket_path = str(self.folder / "server.sock")
        self.log_path = self.folder / "server.log"
        self.isolate = isolation() == "bwrap"
        loads = [str(w) for w in WORKERS] if kind == "verify" else [a for m in MODULES for a in ("--module", m)]
        command = [sys.executable, "-s", "-P", "-B", str(FORKSERVER), self.socket_path, *loads]
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - open for the server's lifetime
        self.proc = subprocess.Popen(server_command(command, [job_root()]), env=child_env(env),
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=self.folder)
        deadline = time.monotonic() + START_TIMEOUT_S
        while "ready" not in self.log_path.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-500:]
                self.close()
                raise WorkbenchError(f"the warm worker did not start: {tail.strip() or 'no output'}")
            time.sleep(0.02)
        probe = self.folder / "probe"
        probe.mkdir()
        read_fd, write_fd = os.pipe()
        os.close(read_fd)
        if self.start(probe, {}, START_TIMEOUT_S, [write_fd]).wait() != 0:
            log = probe / "output.log"
            reason = log.read_text(errors="replace").strip() if log.exists() else ""
            self.close()
            raise WorkbenchError(f"the warm worker cannot isolate its jobs here: {reason or 'no output'}")

    def start(self, job_dir: Path, env: dict[str, str], timeout_s: float, fds: list[int], *,
              worker: Path | None = None, module: str | None = None, cwd: Path | None = None,
              memory_bytes: int | None = None, readable=(), writable=()) -> WarmJob:
        """Hand the server a job: ``worker``'s main(job_dir, fds[0]) with its output in job_dir/output.log, or
        ``module`` as __main__ with fds as its stdin, stdout and stderr, in ``cwd`` (default: job_dir). Closes
        ``fds``. Neither: the server's probe (the job sets its isolation up and exits 0)."""
        from workbench.verify.sandbox import visible

        hidden = [str(p) for p in _outermost([job_root(), Path("/tmp").resolve()])] if self.isolate else []
        request = {"worker": str(worker or ""), "module": module or "", "job_dir": str(job_dir),
                   "cwd": str(cwd or job_dir), "timeout_s": timeout_s, "memory_bytes": memory_bytes, "env": env,
                   "isolate": self.isolate, "hidden": hidden, "stdio": module is not None,
                   "readable": [str(p) for p in visible(list(readable), cwd)] if self.isolate else [],
                   "writable": [str(Path(p).resolve()) for p in writable]}
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.socket_path)
            socket.send_fds(conn, [(json.dumps(request) + "\n").encode()], fds)
        except OSError as exc:
            conn.close()
            raise WorkbenchError(f"the warm worker stopped ({exc}; its log: {self.log_path})") from exc
        finally:
            for fd in fds:
                os.close(fd)
        return WarmJob(conn, timeout_s, self.log_path)

    def run(self, worker: Path, job_dir: Path, env: dict[str, str], timeout_s: float, memory_bytes: int | None,
            readable: list[Path], result_fd: int) -> int | None:
        """Run ``worker``'s main on ``job_dir`` in a fresh fork; its exit code (negative: the signal), None when it
        ran past ``timeout_s``. ``result_fd``: the write end of the result pipe, handed to the job and closed here."""
        return self.start(job_dir, env, timeout_s, [result_fd], worker=worker, memory_bytes=memory_bytes,
                          readable=readable).wait()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def server_pid(self) -> int | None:
        """The server's process id as seen here (the first python below setpriv, or below bubblewrap)."""
        below = _below(self.proc.pid, _parents())
        return next((pid for pid in [self.proc.pid, *below] if _command(pid)[:1] == [sys.executable]), None)

    def job_pids(self) -> list[int]:
        """The processes the server's jobs are running now (keepers, and the jobs' processes seen from here), by a
        walk of /proc below the server: what a timeout or a kill must leave empty."""
        server = self.server_pid()
        return _below(server, _parents()) if server else []

    def jobs_cpu_s(self) -> float:
        """The CPU time (user + system) of the server's finished jobs: every process of a job is reaped up the chain
        to the server, whose children's times hold them (/proc/PID/stat's cutime and cstime)."""
        fields = Path(f"/proc/{self.server_pid()}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _outermost(folders: list[Path]) -> list[Path]:
    """The folders that lie in none of the others (a tmpfs over /tmp hides a job root inside it too)."""
    return sorted({f for f in folders if not any(f != other and f.is_relative_to(other) for other in folders)})


def _parents() -> dict[int, int]:
    """Every process here and its parent, from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone while we looked
    return parents


def _below(root: int, parents: dict[int, int]) -> list[int]:
    """The descendants of ``root``, nearest first."""
    below, frontier = [], {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier}
        below += sorted(frontier)
    return below


def _command(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def warm_server(kind: str, env: dict[str, str]) -> WarmServer | None:
    """The ``kind`` server for ``env``'s Triton mode and the isolation in force, started on first use (and again if
    it died); None when the warm worker is off or its server could not start (then every job runs cold; the reason
    is printed once)."""
    if not enabled():
        return None
    from workbench.verify.sandbox import isolation

    key = (kind, env.get("TRITON_INTERPRET") == "1", isolation())
    with _lock:
        server = _servers.get(key, False)
        if server is False or (server is not None and not server.alive()):
            try:
                server = _starter.submit(WarmServer, kind,
                                         {k: v for k, v in env.items() if k == "TRITON_INTERPRET"}).result()
            except WorkbenchError as exc:
                print(f"warning: {exc}; every {kind} job starts a cold child", file=sys.stderr)
                server = None
            _servers[key] = server
        return server


class WarmProcess:
    """A "model" job with the part of subprocess.Popen's interface its callers use: ``stdin`` and ``stdout`` (text),
    ``wait``, ``poll``, ``kill``, ``communicate``; ``stderr`` goes to the file given, or is collected by
    ``communicate``."""

    def __init__(self, server: WarmServer, module: str, env: dict[str, str], cwd: Path, timeout_s: float,
                 writable: list[Path], readable: list[Path], stderr=None):
        stdin_read, stdin_write = os.pipe()
        stdout_read, stdout_write = os.pipe()
        if stderr is None:
            stderr_read, stderr_write = os.pipe()
        else:
            stderr_read, stderr_write = None, os.dup(stderr.fileno())
        scratch = next(iter(writable), cwd)
        self.job = server.start(Path(scratch), env, timeout_s, [stdin_read, stdout_write, stderr_write],
                                module=module, cwd=cwd, readable=readable, writable=writable)
        self.stdin = open(stdin_write, "w")  # noqa: SIM115 - the caller closes it
        self.stdout = open(stdout_read)  # noqa: SIM115
        self.stderr = open(stderr_read) if stderr_read is not None else None  # noqa: SIM115
        self.returncode: int | None = None
        self._done = threading.Event()
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        try:
            code = self.job.wait()
        except WorkbenchError as exc:
            print(f"warning: {exc}", file=sys.stderr)
            code = None
        self.returncode = -9 if code is None else code  # killed, as a cold child would be
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired("warm " + self.job.log_path.name, timeout)
        return self.returncode

    def kill(self) -> None:
        self.job.kill()

    def communicate(self, input: str, timeout: float) -> tuple[str, str]:
        """Write ``input``, read stdout and stderr to their ends; kills the job and raises
        subprocess.TimeoutExpired past ``timeout``."""
        out, err = io.StringIO(), io.StringIO()
        readers = [threading.Thread(target=lambda s=s, b=b: b.write(s.read()), daemon=True)
                   for s, b in ((self.stdout, out), (self.stderr, err)) if s is not None]
        for reader in readers:
            reader.start()
        try:
            self.stdin.write(input)
            self.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        for reader in readers:
            reader.join(30)
        return out.getvalue(), err.getvalue()


def warm_popen(module: str, env: dict[str, str], cwd: Path, timeout_s: float, writable: list[Path],
               readable: list[Path], stderr=None) -> WarmProcess | None:
    """``python -m module`` (a JSON job on its stdin) as a fork of the "model" server, where the warm worker runs and
    every folder it writes lies in the temporary folder (the first is its scratch); None: start it cold."""
    if not (writable and _under_job_root(writable)):
        return None
    server = warm_server("model", env)
    if server is None:
        return None
    return WarmProcess(server, module, env, cwd, timeout_s, writable, readable, stderr)


@atexit.register
def _close_all() -> None:
    for server in _servers.values():
        if server is not None:
            server.close()
