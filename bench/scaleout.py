"""The main job on 1 worker and on more: wall time of `workbench port --model M` (or of a subset of its blocks) and
candidates verified per minute, each run on a fresh store, operators and scratch folder of its own.

    python bench/scaleout.py                                  # the whole main job (kimi-k3.1-pro), 1 and 2 workers
    python bench/scaleout.py --blocks rmsnorm,situ            # two of its blocks
    python bench/scaleout.py --blocks rmsnorm,situ --workers 1,2,4 -- --seeds 1 --replay-steps 0

What the figures are. "wall s": the command's wall clock, Ray's start included (a local instance the command starts
and stops). "verified": the verify steps the runs recorded (one per candidate that reached the sandbox);
"per min": verified / wall minutes. "promoted": blocks whose run ended promoted. The ratios are against the first
--workers value. Everything after "--" goes to `workbench port` unchanged (its defaults are the main job's).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def port_command(model: str, blocks: list[str], workers: int, extra: list[str]) -> list[str]:
    """`workbench port --model M` (a subset: the blocks by name, the card's settings being the defaults)."""
    chosen = blocks or ["--model", model]
    workbench = Path(sys.executable).with_name("workbench")  # the script installed beside this interpreter
    return [str(workbench), "port", *chosen, "--workers", str(workers), "--json", *extra]


def counts(db_url: str) -> tuple[int, int]:
    """(verify steps recorded, runs promoted) in the store at ``db_url``."""
    from sqlmodel import Session, func, select

    from workbench.store import get_engine
    from workbench.store.models import PortRun, RunStep

    with Session(get_engine(db_url)) as s:
        verified = s.exec(select(func.count()).select_from(RunStep).where(RunStep.node == "verify")).one()
        promoted = s.exec(select(func.count()).select_from(PortRun).where(PortRun.status == "promoted")).one()
    return verified, promoted


def run_once(command: list[str], folder: Path) -> dict:
    db_url = f"sqlite:///{folder / 'workbench.db'}"
    env = {**os.environ, "WORKBENCH_DB": db_url, "WORKBENCH_OPERATORS": str(folder / "operators"),
           "WORKBENCH_HOME": str(folder / "home")}
    env.pop("WORKBENCH_WORKERS", None)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):  # 1: a block ended blocked, which is a figure, not a failure of the bench
        sys.exit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    verified, promoted = counts(db_url)
    return {"wall": wall, "verified": verified, "promoted": promoted, "per_min": verified / (wall / 60)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="kimi-k3.1-pro")
    parser.add_argument("--blocks", default="", help="comma-separated subset of the card's blocks (default: all)")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts, the first the baseline")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    blocks = [b for b in args.blocks.split(",") if b]
    rows = []
    for workers in (int(w) for w in args.workers.split(",")):
        command = port_command(args.model, blocks, workers, extra)
        with tempfile.TemporaryDirectory(prefix="scaleout-") as folder:
            rows.append((workers, command, run_once(command, Path(folder))))
    base = rows[0][2]
    print(f"{'workers':>7} {'wall s':>8} {'verified':>8} {'per min':>8} {'promoted':>8} {'wall ratio':>10} "
          f"{'rate ratio':>10}")
    for workers, _, r in rows:
        print(f"{workers:>7} {r['wall']:>8.1f} {r['verified']:>8} {r['per_min']:>8.2f} {r['promoted']:>8} "
              f"{base['wall'] / r['wall']:>9.2f}x {r['per_min'] / base['per_min']:>9.2f}x")
    for workers, command, _ in rows:
        print(f"# {workers} workers: workbench {' '.join(command[1:])}")
    print(f"# {os.cpu_count()} cores here; wall ratio: wall time on the first row over this row's")


if __name__ == "__main__":
    main()
