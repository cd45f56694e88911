"""What one verification costs, cold (a fresh sandboxed child importing torch and triton) and warm (a fork of the
warm worker, workbench/verify/forkserver.py): the job's start and its trials, for promoted operators on the smoke
suite; and what a parity child costs, cold and warm.

    python bench/verify_cost.py                          # rmsnorm, kda_gate, swiglu; 3 runs each; cold and warm
    python bench/verify_cost.py --blocks kda mla --runs 5
    python bench/verify_cost.py --isolation audit         # the audit hook's isolation instead of bubblewrap's
    python bench/verify_cost.py --parity glm4_moe         # also a 2-layer parity of that family, cold and warm
    python bench/verify_cost.py --full --runs 1           # a port's verification: all suites, five targets

What the figures are. Each run is one verify_candidate call (float32, one seed, no GPU target) on the backend seen
here (the Triton interpreter on a CPU). "wall s" is the call's wall time; "job cpu s" the CPU time (user + system)
of the job's processes: cold, from getrusage of this process's children (under bubblewrap its PID namespace's init
reaps the child and the figure is lost: n/a); warm, from the server's reaped children (/proc/PID/stat). The
"start" row verifies a candidate that returns at once and fails: what a job costs before any trial runs. The
server's own start (once per process and kind) is its own row. Medians of --runs runs, after one run that is not
counted (the warm rows' first run starts the server).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START = '''BLOCK = "rmsnorm"


def run(x, weight, eps):
    return x  # wrong at once: the trials cost nothing, the job's start is all
'''


def job_cpu(warm_on: bool, backend) -> float | None:
    """The CPU seconds of every finished job so far: this process's children (cold), the server's (warm)."""
    from workbench.verify import sandbox, warm

    if warm_on:  # the interpreter's server and the compilers' (a full verification's compile jobs)
        servers = [s for key, s in warm._servers.items() if key[0] == "verify" and s is not None and s.alive()]
        return sum(s.jobs_cpu_s() for s in servers) if servers else None
    if sandbox.isolation() != "audit":
        return None
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(call, runs: int, cpu) -> tuple[float, float | None]:
    """(median wall s, median job CPU s) of ``runs`` calls, after one that is not counted."""
    call()
    walls, cpus = [], []
    for _ in range(runs):
        before, started = cpu(), time.perf_counter()
        call()
        walls.append(time.perf_counter() - started)
        after = cpu()
        cpus.append(None if before is None or after is None else after - before)
    return statistics.median(walls), (statistics.median(cpus) if None not in cpus else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", nargs="+", default=["rmsnorm", "kda_gate", "swiglu"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--isolation", default="auto", choices=("audit", "auto"))
    parser.add_argument("--parity", nargs="*", default=[], help="families whose 2-layer parity is timed too")
    parser.add_argument("--full", action="store_true",
                        help="a port's verification instead of the smoke suite: every suite, dtype and default "
                             "target, each run with an empty compile cache")
    args = parser.parse_args()
    os.environ["WORKBENCH_ISOLATION"] = args.isolation

    from workbench.backends import get_backend
    from workbench.integrations.parity import run_parity
    from workbench.verify import warm
    from workbench.verify.harness import verify_candidate
    from workbench.verify.sandbox import isolation

    backend = get_backend()
    rows, verdicts = [], {}

    def verification(path: Path, block: str):
        def call():
            if args.full:  # a port's verification: every suite, dtype and default target, compiled afresh
                os.environ["WORKBENCH_COMPILE_CACHE"] = tempfile.mkdtemp(prefix="compile-cache-")
                result = verify_candidate(path, block=block, backend=backend)
                shutil.rmtree(os.environ.pop("WORKBENCH_COMPILE_CACHE"), ignore_errors=True)
            else:
                result = verify_candidate(path, block=block, backend=backend, suites=["smoke"], dtypes=["float32"],
                                          seeds=1, base_seed=0, targets=[])
            verdicts[path.name] = str(result.verdict)
        return call

    started = time.perf_counter()
    server = warm.WarmServer("verify", backend.env)
    server_start = time.perf_counter() - started
    server.close()
    with tempfile.TemporaryDirectory() as scratch:
        start = Path(scratch) / "start.py"
        start.write_text(START)
        candidates = [("start (a candidate that fails at once)", start, "rmsnorm")]
        for block in args.blocks:
            files = sorted((ROOT / "operators" / block).glob("*.py"))
            if not files:
                sys.exit(f"no promoted operator for {block!r} in {ROOT / 'operators'}")
            candidates.append((f"{block}: {files[0].name}", files[0], block))
        for name, path, block in candidates:
            figures = []
            for warm_on in (False, True):
                os.environ["WORKBENCH_WARM"] = "1" if warm_on else "0"
                figures += measure(verification(path, block), args.runs, lambda w=warm_on: job_cpu(w, backend))
            rows.append((name, *figures, verdicts[path.name]))
    for family in args.parity:
        figures = []
        for warm_on in (False, True):
            os.environ["WORKBENCH_WARM"] = "1" if warm_on else "0"
            figures += measure(lambda f=family: verdicts.__setitem__(f, run_parity(f, layers=2, tokens=16).status),
                               args.runs, lambda: None)
        rows.append((f"parity {family} (2 layers, 16 tokens)", *figures, verdicts[family]))

    print(f"$ python {' '.join(shlex.quote(a) for a in sys.argv)}")
    what = "every suite, dtype and default target, empty compile cache" if args.full else "smoke suite, float32"
    print(f"backend {backend.name}, isolation {isolation()}, {what}, medians of {args.runs} runs, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print(f"warm server start (imports, once per process): {server_start:.2f} s")
    print(f"{'job':52s} {'cold wall s':>11s} {'cold cpu s':>10s} {'warm wall s':>11s} {'warm cpu s':>10s}  verdict")

    def shown(value: float | None, width: int) -> str:
        return f"{value:{width}.2f}" if value is not None else f"{'n/a':>{width}s}"

    for name, cold_wall, cold_cpu, warm_wall, warm_cpu, verdict in rows:
        print(f"{name:52s} {shown(cold_wall, 11)} {shown(cold_cpu, 10)} {shown(warm_wall, 11)} "
              f"{shown(warm_cpu, 10)}  {verdict}")


if __name__ == "__main__":
    main()
