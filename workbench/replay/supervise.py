"""Replay training children: the job a child trains (``training_job``), and its supervision (``launch``): one
child process, or the launcher of N ranks for a distributed layout, under the overall timeout; a failure, a crash or a
hang is a ReplayError with its one-line reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from workbench.backends import Backend
from workbench.errors import WorkbenchError
from workbench.replay.arch import Architecture
from workbench.replay.child import MARK
from workbench.replay.distributed import DEFAULT_COLLECTIVE_TIMEOUT_S, Layout
from workbench.replay.ops import operator_file
from workbench.replay.presets import Preset
from workbench.replay.train import RunResult
from workbench.verify.sandbox import child_command, child_env
from workbench.verify.warm import WarmProcess, warm_popen

DEFAULT_TIMEOUT_S = 3600.0
CHILD, LAUNCHER = "workbench.replay.child", "workbench.replay.launcher"
Event = Callable[[str, dict], None]
"""on_event(kind, payload): what a replay reports as it goes (the CLI's live table, the agent's trace)."""


class ReplayError(WorkbenchError):
    """A training process that failed, crashed or timed out (its one-line reason)."""


def training_job(task: str, preset: Preset, arch: Architecture, mode: str, steps: int, seed: int,
                 ops: dict[str, str], backend: Backend, base: Path | None, layout: Layout | None = None,
                 rank_ops: dict[int, dict[str, str]] | None = None,
                 collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S, mtp: bool = False,
                 profile: Path | None = None) -> dict:
    """The job a training process reads (see workbench.replay.child; with a distributed layout,
    workbench.replay.launcher and workbench.replay.distributed: its ranks, each rank's own ops, and ``profile``:
    the folder where each rank writes its profiler trace)."""
    job = {"task": task, "preset": preset.name, "arch": arch.to_dict(), "mode": mode, "steps": steps, "seed": seed,
           "ops": ops, "device": backend.device, "base": str(base) if base else None}
    if mtp:
        job["mtp"] = True
    if layout is not None:
        job.update(layout=layout.to_dict(), rank_ops={str(r): o for r, o in (rank_ops or {}).items()},
                   collective_timeout_s=collective_timeout_s)
        if profile is not None:
            job["profile"] = str(profile)
    return job


def launch(job: dict, backend: Backend, timeout_s: float, on_step: Callable[[int, float, float], None] | None = None
           ) -> RunResult:
    """Train in a child process (the backend's environment, e.g. the Triton interpreter); raises ReplayError."""
    return RunResult(**launch_process(job, backend, timeout_s, on_step)["result"])


def launch_process(job: dict, backend: Backend, timeout_s: float,
                   on_step: Callable[[int, float, float], None] | None = None) -> dict:
    """The training process's "done" event: one child, or the launcher of the job's ranks when its layout is
    distributed (the overall timeout covers every rank: the whole process group is killed). Raises ReplayError."""
    entry = LAUNCHER if job.get("layout", {}).get("ranks", 1) > 1 else CHILD
    base = Path(job["base"]).parent if job.get("base") else None
    files = [operator_file(target) for target in job["ops"].values()]
    files += [operator_file(t) for ops in job.get("rank_ops", {}).values() for t in ops.values()]
    readable = [Path(f).parent for f in files if f is not None] + ([base] if base else [])
    writable = [base] if base and job["task"] == "base" else []  # the base checkpoint is written beside the curves
    writable += [Path(job["profile"])] if job.get("profile") else []  # the ranks' profiler traces
    for folder in writable:
        folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="replay-") as scratch, tempfile.TemporaryFile() as stderr:
        # the operators' own temporary files and Triton's cache: the only other place the child may write
        job = {**job, "writable": [str(p) for p in writable] + [scratch]}
        env = {**child_env(backend.env), "TMPDIR": scratch, "TRITON_CACHE_DIR": str(Path(scratch) / "triton-cache")}
        # the training child, or the launcher (which forks its ranks): a fork of the warm worker where it runs
        proc = warm_popen(entry, env, Path.cwd(), timeout_s, [Path(scratch), *writable], readable, stderr)
        if proc is None:
            command = child_command([sys.executable, "-m", entry], memory_bytes=None,
                                    timeout_s=timeout_s, writable=[*writable, Path(scratch)], readable=readable,
                                    cwd=Path.cwd())
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env,
                                    text=True, start_new_session=True)
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            _kill_group(proc)

        timer = threading.Timer(timeout_s, expire)
        timer.start()
        done, error, last_step = None, None, -1
        try:
            proc.stdin.write(json.dumps(job))
            proc.stdin.close()
            for line in proc.stdout:
                if not line.startswith(MARK):
                    continue
                event = json.loads(line[len(MARK):])
                if event["event"] == "step":
                    last_step = event["step"]
                    if on_step:
                        on_step(event["step"], event["loss"], event["seconds"])
                elif event["event"] == "done":
                    done = event
                elif event["event"] == "error":
                    error = event["message"]
            code = proc.wait()
        finally:
            timer.cancel()
            _kill_group(proc)
        if done is not None and code == 0:
            return done
        if error:
            raise ReplayError(f"training failed at step {last_step + 1}: {error}")
        if timed_out.is_set():
            raise ReplayError(f"training timed out after {timeout_s:.0f} s (at step {last_step + 1})")
        stderr.seek(0)
        tail = stderr.read().decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise ReplayError(f"the training process died (exit {code}) at step {last_step + 1}: {tail[0][:300]}")


def _kill_group(proc: subprocess.Popen | WarmProcess) -> None:
    """The child and everything it started (its own session: the ranks of a distributed replay) stopped."""
    if isinstance(proc, WarmProcess):  # the server kills the job's PID namespace, or its session
        proc.kill()
        proc.wait()
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.kill()
    proc.wait()
