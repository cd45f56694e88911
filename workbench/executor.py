"""Where verifications run: in this process one after another (``--workers 1``, no Ray at all), or fanned out on
Ray, a local instance the workbench starts (``--workers N``: N at once, default the cores) or a cluster it joins
(``--ray-address``, $WORKBENCH_RAY_ADDRESS).

Each verification is a Ray task asking for what its backend names (``Backend.resources``: one CPU on the
interpreter, one GPU on cuda, an accelerator's own resource elsewhere), so N devices run N verifications and each
sandboxed child sees only the device Ray gave its task. The candidate's source travels with the task (a cluster node
need not see the driver's files); the task returns the VerificationResult and never writes the store or
operators/: the driver is the one writer. A worker killed mid-task is retried (Ray's ``max_retries``); one lost
MAX_RETRIES + 1 times is the verdict "crashed", so every candidate gets exactly one verdict and the run goes on.
A worker's scratch (``workbench-worker-PID`` under the system's temp) outlives a worker Ray killed until the next
task on that machine, or the driver shutting its local instance down, removes it.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workbench.backends import Backend
from workbench.config import Settings
from workbench.errors import WorkbenchError, one_line
from workbench.perf.measure import measure_candidate
from workbench.store.records import process_alive
from workbench.verify.harness import source_hash, verify_candidate
from workbench.verify.result import VerificationResult
from workbench.vocabulary import Verdict

MAX_RETRIES = 2  # a verification whose worker died is run again this many times before it is "crashed"


@contextmanager
def candidate_file(path: str, source: str) -> Iterator[Path]:
    """``source`` written under the file name of ``path`` in a scratch folder of this process (removed after)."""
    with tempfile.TemporaryDirectory(prefix="candidate-") as folder:
        local = Path(folder) / Path(path).name
        local.write_text(source)
        yield local


def verify_source(path: str, source: str, **options: Any) -> VerificationResult:
    """verify_candidate on ``source`` (the candidate at ``path`` on the driver); the result names ``path``."""
    with candidate_file(path, source) as local:
        result = verify_candidate(local, **options)
    result.candidate = path
    return result


def measure_source(path: str, source: str, *args: Any, **options: Any) -> dict:
    """measure_candidate on ``source`` (the candidate at ``path`` on the driver)."""
    with candidate_file(path, source) as local:
        return measure_candidate(local, *args, **options)


class Executor:
    """Runs independent calls and hands back their results. ``workers``: how many run at once (1: here, in turn).
    ``lost``: the errors that mean a call's worker died on every try."""

    workers: int = 1
    lost: tuple[type[BaseException], ...] = ()

    def __init__(self) -> None:
        self._stopped: Future = Future()  # done once stop() is called
        self._driver_slots = threading.BoundedSemaphore(self.workers)

    @contextmanager
    def driver_slot(self) -> Iterator[None]:
        """Held around work that must run on the driver's machine (a replay gate trains in a child of the driver and
        writes the store as it goes): at most ``workers`` such processes at once (and no more than the driver's cores),
        however many ports run."""
        with self._driver_slots:
            yield

    def stop(self) -> None:
        """End every wait on a call still running with KeyboardInterrupt, in whichever thread waits (Ctrl-C in the
        driver reaches every block's port)."""
        if not self._stopped.done():
            self._stopped.set_result(None)

    def wait(self, future: Future) -> Any:
        """The call's result, once it is done or the executor is stopped (then KeyboardInterrupt)."""
        wait([future, self._stopped], return_when=FIRST_COMPLETED)
        if not future.done():
            raise KeyboardInterrupt("the command was interrupted")
        return future.result()

    def submit(self, resources: dict[str, float], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        raise NotImplementedError

    def close(self) -> None:
        """Give back what the executor started."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def submit_verification(self, path: str | Path, *, backend: Backend, **options: Any) -> Future:
        """Verify the candidate at ``path`` (its source read now) on ``backend``'s resources:
        verify_candidate's options. settle() gives its VerificationResult."""
        path = str(Path(path).resolve())
        return self.submit(backend.resources, verify_source, path, Path(path).read_text(), backend=backend, **options)

    def settle(self, future: Future, path: str | Path, block: str, backend: Backend) -> VerificationResult:
        """The result of submit_verification; a worker lost on every try is the verdict "crashed"."""
        try:
            return self.wait(future)
        except self.lost as exc:
            return VerificationResult(block=block, candidate=str(Path(path).resolve()),
                                      source_hash=source_hash(Path(path).read_text()), backend=backend.name,
                                      verdict=Verdict.CRASHED, message=f"verification worker lost "
                                      f"{MAX_RETRIES + 1} times: {one_line(exc)}"[:500])

    def verify(self, path: str | Path, *, block: str, backend: Backend, **options: Any) -> VerificationResult:
        """Verify one candidate and wait for it (a port's verify step; its driver thread waits, others go on)."""
        return self.settle(self.submit_verification(path, block=block, backend=backend, **options), path, block,
                           backend)

    def measure(self, path: str | Path, block: str, shapes: list[dict], backend: Backend, **options: Any) -> dict:
        """measure_candidate on the device of a task of its own (a GPU no other verification uses meanwhile)."""
        path = str(Path(path).resolve())
        return self.wait(self.submit(backend.resources, measure_source, path, Path(path).read_text(), block, shapes,
                                     backend, **options))


class InProcessExecutor(Executor):
    """Everything in this process, one call after another (for debugging; no Ray)."""

    def submit(self, resources: dict[str, float], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - handed to whoever reads the future, as Ray would
            future.set_exception(exc)
        return future


WORKER_SCRATCH = "workbench-worker-"  # + the worker's pid: a Ray worker's scratch folder under the system's temp
SYSTEM_TEMP = Path(tempfile.gettempdir())


def remove_dead_scratch(base: Path) -> None:
    """Remove the scratch folders under ``base`` of workers that have died: Ray ends a worker with SIGKILL when it
    shuts down or a task's worker is lost, so what the task had under way (a candidate's copy, a verification's
    tensors) is left for the next task or the driver's close() to remove."""
    for folder in base.glob(f"{WORKER_SCRATCH}*"):
        pid = folder.name.removeprefix(WORKER_SCRATCH)
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def worker_scratch(base: Path) -> Path:
    """This worker process's scratch folder under ``base`` (made once), after the dead workers' are removed."""
    remove_dead_scratch(base)
    mine = base / f"{WORKER_SCRATCH}{os.getpid()}"
    mine.mkdir(exist_ok=True)
    return mine


def _in_worker(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """A Ray task: ``fn(*args, **kwargs)`` with this worker process's scratch folder as tempfile's default and its
    own Triton cache there."""
    tempfile.tempdir = str(worker_scratch(SYSTEM_TEMP))
    os.environ["TRITON_CACHE_DIR"] = str(Path(tempfile.tempdir) / "triton-cache")
    return fn(*args, **kwargs)


CONNECT_TIMEOUT_S = 10.0


def _check_reachable(address: str) -> None:
    """A WorkbenchError unless the head at ``address`` ("host:port" or "ray://host:port"; "auto" and "local" are
    Ray's to find) accepts a connection within CONNECT_TIMEOUT_S: Ray itself keeps trying for minutes."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise WorkbenchError(f"could not join the Ray cluster at {address}: {one_line(exc)} (--workers 1 verifies "
                             f"in this process, without Ray)") from None


def ray_options(resources: dict[str, float]) -> dict[str, Any]:
    """Ray's task options for a backend's resources: CPU and GPU by their own options, any other (an "NPU") as a
    custom resource."""
    others = {name: amount for name, amount in resources.items() if name not in ("CPU", "GPU")}
    return {"num_cpus": resources.get("CPU", 0), "num_gpus": resources.get("GPU", 0),
            **({"resources": others} if others else {})}


class RayExecutor(Executor):
    """Calls as Ray tasks: on the Ray this process already joined, else on a cluster at ``address``, else on a
    local instance started here with ``workers`` CPUs (shut down by close())."""

    def __init__(self, address: str | None, workers: int):
        import ray

        super().__init__()
        self.started = not ray.is_initialized()
        if self.started:
            if address:
                _check_reachable(address)
            try:
                ray.init(address=address, num_cpus=None if address else workers, include_dashboard=False,
                         log_to_driver=False, logging_level=logging.WARNING)
            except Exception as exc:  # noqa: BLE001 - any reason Ray cannot start is one line for the user
                where = f"join the Ray cluster at {address}" if address else "start a local Ray instance"
                raise WorkbenchError(f"could not {where}: {one_line(exc)} (--workers 1 verifies in this process, "
                                     f"without Ray)") from None
        self.workers = max(1, int(ray.cluster_resources().get("CPU", workers)))
        self._driver_slots = threading.BoundedSemaphore(min(self.workers, os.cpu_count() or 1))
        self.lost = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError)
        self._task = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False)(_in_worker)

    def submit(self, resources: dict[str, float], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        return self._task.options(**ray_options(resources)).remote(fn, args, kwargs).future()

    def close(self) -> None:
        import ray

        if self.started:
            ray.shutdown()
            remove_dead_scratch(SYSTEM_TEMP)  # the local instance's workers, ended by the shutdown


def make_executor(settings: Settings, workers: int | None = None, address: str | None = None) -> Executor:
    """The executor a command asked for, its flags before the environment: ``workers`` 1 runs here without Ray;
    else Ray at ``address``; else $WORKBENCH_WORKERS 1 here, $WORKBENCH_RAY_ADDRESS a cluster; else a local Ray
    instance with ``workers`` (else $WORKBENCH_WORKERS, else the cores; one core: here)."""
    if workers != 1 and address:
        return RayExecutor(address, workers or 1)
    workers = workers or settings.workers
    if workers != 1 and settings.ray_address:
        return RayExecutor(settings.ray_address, workers or 1)
    workers = workers or os.cpu_count() or 1
    return InProcessExecutor() if workers == 1 else RayExecutor(None, workers)
