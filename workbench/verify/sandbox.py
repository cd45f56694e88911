"""Run the sandbox worker in a child process: clean environment, its own process group, limits on wall-clock time,
address space and printed output; the result comes back over a pipe that only the parent reads."""

from __future__ import annotations

import ctypes
import io
import os
import resource
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("worker.py")
OUTPUT_TAIL_BYTES = 4000
OUTPUT_LIMIT_BYTES = 64 << 20
PR_SET_PDEATHSIG = 1
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "CUDA_VISIBLE_DEVICES", "TRITON_CACHE_DIR")


@dataclass
class SandboxOutcome:
    """status: ok (a result came back), timeout, crashed, oom. results: what the worker sent (status ok only)."""

    status: str
    message: str
    results: dict | None
    output_tail: str


def child_limits(memory_bytes: int | None, timeout_s: float):
    """Runs in the child before the worker starts: address space, core dumps, file size, CPU time, and death with
    the parent (a killed agent must not leave a candidate running)."""
    def apply() -> None:
        if memory_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_LIMIT_BYTES, OUTPUT_LIMIT_BYTES))
        cpu = int(2 * timeout_s) + 60
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    return apply


def child_env(backend_env: dict[str, str]) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.update({"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    env.update(backend_env)
    return env


def run_job(job_dir: Path, job: dict, backend_env: dict[str, str], timeout_s: float,
            memory_bytes: int | None) -> SandboxOutcome:
    """Write job.pt, run the worker on it, and read its result from the pipe."""
    torch.save(job, job_dir / "job.pt")
    log_path = job_dir / "output.log"
    read_fd, write_fd = os.pipe()
    received = io.BytesIO()
    reader = threading.Thread(target=_drain, args=(read_fd, received), daemon=True)
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", str(WORKER), str(job_dir), str(write_fd)], pass_fds=(write_fd,),
                cwd=job_dir, env=child_env(backend_env), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=child_limits(memory_bytes, timeout_s))
        finally:
            os.close(write_fd)
        reader.start()
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            reader.join(5)
            return SandboxOutcome("timeout", f"no result within {timeout_s:g} s", None, _tail(log_path))
    _kill_group(proc.pid)  # whatever the candidate left running in its process group
    reader.join(30)
    tail = _tail(log_path)
    if log_path.stat().st_size >= OUTPUT_LIMIT_BYTES:  # Python ignores SIGXFSZ: its writes fail with EFBIG
        return SandboxOutcome("crashed", f"printed more than {OUTPUT_LIMIT_BYTES >> 20} MiB", None, tail)
    if code != 0 or not received.getbuffer().nbytes:
        if code < 0:
            name = signal.Signals(-code).name
            if name == "SIGXFSZ":
                return SandboxOutcome("crashed", f"printed more than {OUTPUT_LIMIT_BYTES >> 20} MiB", None, tail)
            return SandboxOutcome("crashed", f"candidate process killed by {name}", None, tail)
        if "MemoryError" in tail or "can't allocate memory" in tail:
            return SandboxOutcome("oom", "candidate process ran out of memory", None, tail)
        return SandboxOutcome("crashed", f"candidate process exited with code {code} without a result", None, tail)
    try:
        results = torch.load(io.BytesIO(received.getvalue()), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a result we cannot read is the candidate's fault
        return SandboxOutcome("crashed", f"unreadable result: {type(exc).__name__}: {exc}"[:300], None, tail)
    return SandboxOutcome("ok", "", results, tail)


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
