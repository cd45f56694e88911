"""Run the sandbox worker in a child process: clean environment, its own process group, limits on wall-clock time,
address space and printed output; the result comes back over a pipe that only the parent reads.

Isolation: with bubblewrap (Debian's ``bubblewrap``) the child sees the whole filesystem read-only except its job
folder and a private /tmp, has no network (its own empty network namespace) and its own PID namespace, and dies
with the parent (``isolation`` "bwrap"). Without it, or with WORKBENCH_ISOLATION=audit, the worker's audit hook
refuses every write outside the job folder that the candidate's code makes ("audit", the weaker isolation). Every
verification records which one was in force.
"""

from __future__ import annotations

import functools
import io
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.errors import WorkbenchError

WORKER = Path(__file__).with_name("worker.py")
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the workbench package (its source, if editable)
OUTPUT_TAIL_BYTES = 4000
OUTPUT_LIMIT_BYTES = 64 << 20
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "CUDA_VISIBLE_DEVICES", "TRITON_CACHE_DIR")


@dataclass
class SandboxOutcome:
    """status: ok (a result came back), timeout, crashed, oom. results: what the worker sent (status ok only)."""

    status: str
    message: str
    results: dict | None
    output_tail: str
    warm: bool = False  # the job ran as a fork of the warm worker (workbench.verify.warm), not a cold child


def limited(command: list[str], memory_bytes: int | None, timeout_s: float) -> list[str]:
    """``command`` under its limits, set by util-linux before it is exec'd (no ``preexec_fn``, which is unsafe once
    the parent has threads): address space, no core dumps, file size, CPU time (prlimit), and death with the parent
    (setpriv --pdeathsig: a killed agent must not leave a candidate running)."""
    setpriv, prlimit = shutil.which("setpriv"), shutil.which("prlimit")
    if not (setpriv and prlimit):
        raise WorkbenchError("the sandbox needs setpriv and prlimit (util-linux) to limit its child processes")
    cpu = int(2 * timeout_s) + 60
    limits = ["--core=0", f"--fsize={OUTPUT_LIMIT_BYTES}", f"--cpu={cpu}"] + \
        ([f"--as={memory_bytes}"] if memory_bytes else [])
    return [setpriv, "--pdeathsig", "KILL", prlimit, *limits, "--", *command]


def child_command(command: list[str], *, memory_bytes: int | None, timeout_s: float, writable: list[Path],
                  readable: list[Path], cwd: Path) -> list[str]:
    """How every child that runs untrusted code starts (the verification and compile workers, the replay's
    training process): under its limits, inside the isolation in force."""
    return limited(isolated(command, writable, readable, cwd), memory_bytes, timeout_s)


@functools.cache
def _bwrap() -> str | None:
    """The bubblewrap binary, if it is installed and can make namespaces here (it cannot in some containers)."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    probe = subprocess.run([path, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--die-with-parent",
                            "true"], capture_output=True, timeout=30)
    return path if probe.returncode == 0 else None


def isolation() -> str:
    """"bwrap" when bubblewrap works here (unless WORKBENCH_ISOLATION=audit), else "audit"."""
    if os.environ.get("WORKBENCH_ISOLATION", "auto") == "audit":
        return "audit"
    return "bwrap" if _bwrap() else "audit"


ISOLATION_TEXT = {"bwrap": "bubblewrap: read-only filesystem but the job folder, no network, own PID namespace",
                  "audit": "audit hook: writes outside the job folder refused (weaker: no namespaces)"}


def isolated(command: list[str], writable: list[Path], readable: list[Path], cwd: Path) -> list[str]:
    """``command`` inside bubblewrap when that is the isolation in force: / read-only, a private /tmp, the
    ``writable`` folders (the job folder) writable and the ``readable`` ones (the candidate's folder, which may
    lie under /tmp) read-only over the private /tmp, working directory ``cwd``."""
    if isolation() != "bwrap":
        return command
    binds = []
    for path in visible(readable, cwd):
        binds += ["--ro-bind", str(path), str(path)]
    for path in dict.fromkeys(Path(p).resolve() for p in writable):
        binds += ["--bind", str(path), str(path)]
    return [_bwrap(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", *binds,
            "--chdir", str(cwd), "--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent", *command]


def visible(readable: list[Path], cwd: Path | None = None) -> list[Path]:
    """The folders a child reads, resolved and existing: ``readable`` and ``cwd``, and the interpreter, its packages
    and the workbench's own source, which may live in a temporary folder too (a clone there, a site-packages folder
    a .pth line adds to the import path)."""
    paths = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent, PACKAGE_ROOT,
             *(Path(p) for p in sys.path if p and Path(p).is_dir()), *([cwd] if cwd else []), *readable]
    return list(dict.fromkeys(Path(p).resolve() for p in paths if Path(p).exists()))


def server_command(command: list[str], writable: list[Path]) -> list[str]:
    """How a warm worker's server starts (workbench.verify.warm): dying with its parent and, where bubblewrap is
    the isolation, inside it with / read-only, the ``writable`` folders (the temporary folder, where every job folder
    lives) writable, no network and its own PID and IPC namespaces. Its jobs take their own limits and namespaces
    (workbench/verify/forkserver.py)."""
    setpriv = shutil.which("setpriv")
    if not setpriv:
        raise WorkbenchError("the sandbox needs setpriv (util-linux) to tie its servers to their parent")
    if isolation() == "bwrap":
        binds = [arg for path in writable for arg in ("--bind", str(path), str(path))]
        # as root, the server keeps the three capabilities its jobs' namespaces need; each job drops them before it
        # runs anything (without them, a job's namespaces include a user namespace)
        caps = [a for cap in ("CAP_SYS_ADMIN", "CAP_SETPCAP", "CAP_NET_ADMIN") for a in ("--cap-add", cap)] \
            if os.geteuid() == 0 else []
        command = [_bwrap(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *binds, *caps,
                   "--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent", *command]
    return [setpriv, "--pdeathsig", "KILL", *command]


def child_env(backend_env: dict[str, str]) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.update({"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    env.update(backend_env)
    return env


@dataclass
class ChildOutcome:
    """status: ok (exited 0 with something on the pipe), timeout, crashed, oom; payload: the bytes sent on the
    pipe (also what a killed child sent before it died); code: the exit code (negative: the signal)."""

    status: str
    message: str
    payload: bytes
    output_tail: str
    code: int | None
    warm: bool = False


def run_child(worker: Path, job_dir: Path, backend_env: dict[str, str], timeout_s: float,
              memory_bytes: int | None, readable: list[Path] = ()) -> ChildOutcome:
    """Run ``worker``'s ``main(JOB_DIR, RESULT_FD)`` on job_dir under the limits and the isolation in force (see the
    module docstring; ``readable``: folders the worker reads besides the installed packages, e.g. the candidate's),
    and collect what it sends: in a fork of the warm worker (workbench.verify.warm) where it runs and the job
    folder lies in the temporary folder, else in a cold ``python -s -P -B worker JOB_DIR RESULT_FD``."""
    from workbench.verify.warm import job_root, warm_server

    log_path = job_dir / "output.log"
    read_fd, write_fd = os.pipe()
    received = io.BytesIO()
    reader = threading.Thread(target=_drain, args=(read_fd, received), daemon=True)
    reader.start()
    server = warm_server("verify", backend_env) if job_dir.resolve().is_relative_to(job_root()) else None
    if server is not None:
        log_path.touch()
        try:
            code = server.run(worker, job_dir, child_env(backend_env), timeout_s, memory_bytes, list(readable),
                              write_fd)
        except WorkbenchError as exc:  # the server stopped under the job: classified as a crash, never lost
            return ChildOutcome("crashed", str(exc), received.getvalue(), _tail(log_path), None)
    else:
        code = _run_cold(worker, job_dir, backend_env, timeout_s, memory_bytes, readable, write_fd)
    outcome = _classify(code, timeout_s, reader, received, log_path)
    outcome.warm = server is not None
    return outcome


def _classify(code: int | None, timeout_s: float, reader: threading.Thread, received: io.BytesIO,
              log_path: Path) -> ChildOutcome:
    """What a finished job's exit code, output and pipe say."""
    if code is None:
        reader.join(5)
        return ChildOutcome("timeout", f"no result within {timeout_s:g} s", received.getvalue(), _tail(log_path),
                            None)
    reader.join(30)
    tail, payload = _tail(log_path), received.getvalue()
    if log_path.stat().st_size >= OUTPUT_LIMIT_BYTES:  # Python ignores SIGXFSZ: its writes fail with EFBIG
        return ChildOutcome("crashed", f"printed more than {OUTPUT_LIMIT_BYTES >> 20} MiB", payload, tail, code)
    if code != 0 or not payload:
        if code < 0:
            name = signal.Signals(-code).name
            if name == "SIGXFSZ":
                return ChildOutcome("crashed", f"printed more than {OUTPUT_LIMIT_BYTES >> 20} MiB", payload, tail,
                                    code)
            return ChildOutcome("crashed", f"candidate process killed by {name}", payload, tail, code)
        if "MemoryError" in tail or "can't allocate memory" in tail:
            return ChildOutcome("oom", "candidate process ran out of memory", payload, tail, code)
        return ChildOutcome("crashed", f"candidate process exited with code {code} without a result", payload,
                            tail, code)
    return ChildOutcome("ok", "", payload, tail, code)


def _run_cold(worker: Path, job_dir: Path, backend_env: dict[str, str], timeout_s: float, memory_bytes: int | None,
              readable, write_fd: int) -> int | None:
    """A cold child: a new interpreter under its limits and isolation. Its exit code (negative: the signal), None
    on timeout; closes ``write_fd``."""
    with open(job_dir / "output.log", "wb") as log:
        try:
            # -s -P: no user site, no script folder on sys.path; the environment is child_env's alone, so its
            # PYTHONHASHSEED and PYTHONDONTWRITEBYTECODE hold (-I would drop them); -B: no bytecode either way
            command = [sys.executable, "-s", "-P", "-B", str(worker), str(job_dir), str(write_fd)]
            proc = subprocess.Popen(
                child_command(command, memory_bytes=memory_bytes, timeout_s=timeout_s, writable=[job_dir],
                              readable=list(readable), cwd=job_dir), pass_fds=(write_fd,),
                cwd=job_dir, env=child_env(backend_env), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            os.close(write_fd)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None
    _kill_group(proc.pid)  # whatever the candidate left running in its process group
    if code > 128 and isolation() == "bwrap":  # bubblewrap exits 128 + N for a child killed by signal N
        code = 128 - code
    return code


def run_job(job_dir: Path, job: dict, backend_env: dict[str, str], timeout_s: float,
            memory_bytes: int | None) -> SandboxOutcome:
    """Write job.pt, run the verification worker on it, and read its result from the pipe."""
    job = {**job, "isolation": isolation()}
    torch.save(job, job_dir / "job.pt")
    # Triton's cache in the scratch folder, the only place the candidate's code may write (a GPU backend compiles)
    env = {**backend_env, "TRITON_CACHE_DIR": str(job_dir / "scratch" / "triton-cache")}
    child = run_child(WORKER, job_dir, env, timeout_s, memory_bytes, [Path(job["candidate"]).parent])
    if child.status != "ok":
        return SandboxOutcome(child.status, child.message, None, child.output_tail, child.warm)
    try:
        results = torch.load(io.BytesIO(child.payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a result we cannot read is the candidate's fault
        return SandboxOutcome("crashed", f"unreadable result: {type(exc).__name__}: {exc}"[:300], None,
                              child.output_tail, child.warm)
    return SandboxOutcome("ok", "", results, child.output_tail, child.warm)


def _drain(fd: int, sink: io.BytesIO) -> None:
    with os.fdopen(fd, "rb") as pipe:
        while chunk := pipe.read(1 << 20):
            sink.write(chunk)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - OUTPUT_TAIL_BYTES))
        return f.read().decode("utf-8", "replace")
