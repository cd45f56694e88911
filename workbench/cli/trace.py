"""`workbench` commands. The traces of a distributed replay: trace."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from workbench.cli._common import DbOption, JsonOption, _emit_json, _engine, command, console
from workbench.config import Settings
from workbench.errors import WorkbenchError

BUBBLES_SHOWN = 10


@command
def trace(
    replay_id: Annotated[int, typer.Argument(help="a replay run with --ranks 2+ --profile")],
    bubble_ms: Annotated[float, typer.Option(min=0.0, help="idle gaps of at least this many ms are bubbles")] = 1.0,
    db: DbOption = None, as_json: JsonOption = False,
) -> None:
    """Where each rank's steps went, from a profiled distributed replay's traces: compute, communication and idle
    per rank and step, the All-to-All (waited on, hidden under the experts' compute), the bubbles, and the slowest
    rank with the op that explains it (workbench/replay/trace.py)."""
    from workbench.replay.trace import EXPERTS, SLOW_SHARE, WARMUP_STEPS, replay_traces, report
    from workbench.store.queries import get_replay

    row = get_replay(_engine(Settings.load(db)), replay_id)
    if row is None:
        raise WorkbenchError(f"no replay #{replay_id}")
    found = report(replay_traces(row.detail, replay_id), bubble_ms)
    if as_json:
        return _emit_json({"replay_id": replay_id, **found.to_dict()})
    layout = row.layout or {}
    chunks = layout.get("chunks") or 1
    steps = Table(title=f"Replay #{replay_id} · {row.model} · {layout.get('ranks', 1)} ranks · dispatch in {chunks} "
                        f"chunk{'s' if chunks > 1 else ''} · ms on each rank's main thread")
    for col in ("rank", "step", "step ms", "compute", "communication", "idle", "All-to-All", "waiting on it",
                "hidden under experts"):
        steps.add_column(col, justify="right")
    for s in found.steps:
        steps.add_row(str(s.rank), str(s.step), f"{s.ms:.1f}", f"{s.compute_ms:.1f}", f"{s.communication_ms:.1f}",
                      f"{s.idle_ms:.1f}", f"{s.all_to_all_ms:.1f}", f"{s.all_to_all_wait_ms:.1f}",
                      f"{s.hidden_ms:.1f} ({s.hidden_fraction:.0%})")
    console.print(steps)
    if found.bubbles:
        bubbles = Table(title=f"Bubbles: idle gaps of {bubble_ms:g} ms or more"
                              + (f" (the {BUBBLES_SHOWN} longest of {len(found.bubbles)})"
                                 if len(found.bubbles) > BUBBLES_SHOWN else ""))
        for col in ("rank", "step", "at ms", "ms"):
            bubbles.add_column(col, justify="right")
        bubbles.add_column("op before")
        bubbles.add_column("op after")
        for b in found.bubbles[:BUBBLES_SHOWN]:
            bubbles.add_row(str(b.rank), str(b.step), f"{b.at_ms:.1f}", f"{b.ms:.1f}", escape(b.before),
                            escape(b.after))
        console.print(bubbles)
    else:
        console.print(f"no bubbles: no idle gap of {bubble_ms:g} ms or more")
    console.print(f"All-to-All: {found.all_to_all_ms:.1f} ms in flight, {found.hidden_fraction:.0%} of it hidden under "
                  f"{EXPERTS} ({found.hidden_ms:.1f} ms)")
    slow = found.slowest
    if slow is None:
        console.print(f"slowest: none, no rank computes {SLOW_SHARE:.0%} longer than the others at any step")
    else:
        warmup = f"; step {found.steps[0].step} left out, its one-time costs" \
            if len({s.step for s in found.steps}) > WARMUP_STEPS else ""
        console.print(f"slowest: rank {slow.rank} at step {slow.step}, {slow.compute_ms:.1f} ms of compute against "
                      f"{slow.others_compute_ms:.1f} ms on the other ranks (mean{warmup})")
        console.print(f"  explained by {escape(slow.op)}: {slow.op_ms - slow.others_op_ms:+.1f} ms ({slow.op_ms:.1f} "
                      f"against {slow.others_op_ms:.1f} ms)")
