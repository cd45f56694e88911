"""The port of a whole card from the worst-ordered template points: every sidecar's choices reversed
(workbench.templating.reverse_choices), so each block starts at its least preferred point and default launch
settings, and what it promotes is what the search found. Prints, per block: candidates verified, compile-only
probes, the promoted point and its launch settings per target, the targets it is spill-free on, and its modelled
time on each target over that of the operator promoted from the hand-ordered templates (``--against``).

    python bench/reversed_port.py --out /tmp/reversed              # reverse, port the card, print the table
    python bench/reversed_port.py --out /tmp/hand --no-reverse     # the same port from the templates as shipped

The port runs as `make port` runs it (`workbench port --model MODEL`, its replay gate included) in a store and an
operators folder of its own under --out; its wall time is printed. Figures are modelled (the cost model on the
compile reports), never measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from sqlmodel import Session, select

from workbench.operators import list_promoted
from workbench.store import Candidate, PortRun, TuneProbe, get_engine
from workbench.templating import format_point, reverse_choices

TARGETS = ("sm_80", "sm_90a", "sm_100a", "gfx942", "gfx950")


def port(out: Path, model: str, reverse: bool, blocks: list[str], tune_seconds: float | None) -> float:
    env = dict(os.environ)
    if reverse:
        env["WORKBENCH_TEMPLATES"] = str(reverse_choices(out / "templates"))
    command = [str(Path(sys.executable).with_name("workbench")), "port", *(blocks or ["--model", model]),
               "--db", f"sqlite:///{out / 'store.db'}", "--operators", str(out / "operators"),
               *(["--tune-seconds", str(tune_seconds)] if tune_seconds else [])]
    started = time.monotonic()
    subprocess.run(command, env=env, check=False, stdout=(out / "port.log").open("w"), stderr=subprocess.STDOUT)
    return time.monotonic() - started


def ratio(ours: dict, hand: dict | None, target: str) -> str:
    """Our modelled time on ``target`` over the hand-ordered operator's."""
    mine = ours.get("modelled", {}).get(target, {}).get("time_ms")
    theirs = (hand or {}).get("modelled", {}).get(target, {}).get("time_ms")
    return f"{mine / theirs:.2f}" if mine and theirs else "-"


def table(out: Path, against: Path) -> list[str]:
    engine = get_engine(f"sqlite:///{out / 'store.db'}")
    lines = ["| block | status | candidates | probes | promoted point | launch per target (tuned) | spill-free on | "
             "modelled / hand-ordered " + " / ".join(TARGETS) + " |", "|" + "---|" * 8]
    with Session(engine) as s:
        runs = {r.block: r for r in s.exec(select(PortRun).order_by(PortRun.started_at))}
        for block, run in sorted(runs.items()):
            candidates = len(s.exec(select(Candidate.id).where(Candidate.run_id == run.id)).all())
            probes = len(set(s.exec(select(TuneProbe.probe).where(TuneProbe.run_id == run.id)).all()))
            ours = next(iter(list_promoted(out / "operators", block)), None)
            hand = next(iter(list_promoted(against, block)), None)
            if ours is None:
                lines.append(f"| {block} | {run.status} | {candidates} | {probes} | {run.reason[:80]} | | | |")
                continue
            tuned = ours.get("launch_settings", {}).get("tuned", {})
            launch = "; ".join(f"{t} {format_point(v)}" for t, v in tuned.items()) or "template defaults"
            free = ours.get("target_report", {}).get("spill_free_on", [])
            lines.append(f"| {block} | {run.status} | {candidates} | {probes} | {ours['template']} "
                         f"{format_point(ours['params'])} | {launch} | "
                         f"{'all five' if set(TARGETS) <= set(free) else ', '.join(free)} | "
                         f"{' / '.join(ratio(ours, hand, t) for t in TARGETS)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the store, operators and log")
    parser.add_argument("--model", default="kimi-k3.1-pro")
    parser.add_argument("--blocks", nargs="*", default=[], help="these blocks only (default: the card's)")
    parser.add_argument("--reverse", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--against", type=Path, default=Path(__file__).resolve().parents[1] / "operators",
                        help="the operators promoted from the hand-ordered templates")
    parser.add_argument("--tune-seconds", type=float, help="the port's --tune-seconds (default: its own)")
    parser.add_argument("--table-only", action="store_true", help="tabulate a port already run under --out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        seconds = port(args.out, args.model, args.reverse, args.blocks, args.tune_seconds)
        print(f"port of {args.blocks or args.model} from the {'reversed' if args.reverse else 'shipped'} templates: "
              f"{seconds / 60:.1f} min wall (log: {args.out / 'port.log'})")
    print("\n".join(table(args.out, args.against)))
    print(f"\n`python bench/reversed_port.py {' '.join(sys.argv[1:])}`; modelled times (the cost model), "
          f"{json.dumps(TARGETS)}")


if __name__ == "__main__":
    main()
