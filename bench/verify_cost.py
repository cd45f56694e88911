"""What one verification costs: the sandbox child's start (importing torch and triton, the worker's instrumentation)
and its trials, for promoted operators on the smoke suite.

    python bench/verify_cost.py                          # rmsnorm, kda_gate, swiglu; 3 runs each
    python bench/verify_cost.py --blocks kda mla --runs 5
    python bench/verify_cost.py --isolation auto          # bubblewrap where it works: no child CPU figure

What the figures are. Each run is one verify_candidate call (float32, one seed, no GPU target) on the backend seen
here (the Triton interpreter on a CPU): "wall s" is the call's wall time, "child cpu s" the CPU time (user + system)
of the processes it started (the sandbox child), from getrusage. Bubblewrap's PID namespace hides that figure (its
init reaps the child), so the isolation here is the audit hook's unless --isolation auto. The "start" row verifies a
candidate that returns at once and fails: what a child costs before any trial runs. Medians of --runs runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START = '''BLOCK = "rmsnorm"


def run(x, weight, eps):
    return x  # wrong at once: the trials cost nothing, the child's start is all
'''


def measure(path: Path, block: str, backend, runs: int) -> tuple[float, float, str, int]:
    """(median wall s, median child CPU s, verdict, trials) of ``runs`` smoke verifications of ``path``."""
    from workbench.verify.harness import verify_candidate

    walls, cpus = [], []
    for _ in range(runs):
        before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        result = verify_candidate(path, block=block, backend=backend, suites=["smoke"], dtypes=["float32"], seeds=1,
                                  base_seed=0, targets=[])
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    trials = len({(c.shape, c.dtype, c.seed) for c in result.checks if c.suite == "smoke"})
    return statistics.median(walls), statistics.median(cpus), str(result.verdict), trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", nargs="+", default=["rmsnorm", "kda_gate", "swiglu"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--isolation", default="audit", choices=("audit", "auto"))
    args = parser.parse_args()
    os.environ["WORKBENCH_ISOLATION"] = args.isolation

    from workbench.backends import get_backend
    from workbench.verify.sandbox import isolation

    backend = get_backend()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        start = Path(scratch) / "start.py"
        start.write_text(START)
        rows.append(("start (a candidate that fails at once)", *measure(start, "rmsnorm", backend, args.runs)))
    for block in args.blocks:
        files = sorted((ROOT / "operators" / block).glob("*.py"))
        if not files:
            sys.exit(f"no promoted operator for {block!r} in {ROOT / 'operators'}")
        rows.append((f"{block}: {files[0].name}", *measure(files[0], block, backend, args.runs)))

    print(f"$ python {' '.join(shlex.quote(a) for a in sys.argv)}")
    print(f"backend {backend.name}, isolation {isolation()}, smoke suite, float32, medians of {args.runs} runs, "
          f"{platform.processor() or platform.machine()}")
    print(f"{'candidate':52s} {'trials':>6s} {'wall s':>7s} {'child cpu s':>12s}  verdict")
    for name, wall, cpu, verdict, trials in rows:
        shown = f"{cpu:12.2f}" if isolation() == "audit" else f"{'n/a':>12s}"
        print(f"{name:52s} {trials:6d} {wall:7.2f} {shown}  {verdict}")


if __name__ == "__main__":
    main()
