"""`workbench` commands. The record: runs, show."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from workbench.cli._common import DbOption, JsonOption, _emit_json, _engine, _style, command, console
from workbench.config import Settings
from workbench.errors import WorkbenchError
from workbench.vocabulary import key_values


@command
def runs(block: Annotated[str | None, typer.Option(help="only this block")] = None,
         limit: Annotated[int, typer.Option(help="most recent N")] = 30,
         db: DbOption = None, as_json: JsonOption = False) -> None:
    """The agent runs, newest first."""
    from workbench.store import records
    from workbench.store.queries import list_runs

    engine = _engine(Settings.load(db))
    records.mark_interrupted(engine)
    rows = list_runs(engine, limit=limit, block=block)
    if as_json:
        return _emit_json([r.model_dump() for r in rows])
    if not rows:
        console.print("No runs yet: `workbench port rmsnorm` starts one.")
        return
    table = Table(title="Port runs")
    for col in ("run", "block", "status", "proposer", "budget", "started (UTC)", "reason"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.id, r.block, _style(r.status), r.proposer, str(r.budget),
                      r.started_at.strftime("%Y-%m-%d %H:%M:%S"), escape(r.reason[:100]))
    console.print(table)


@command
def show(run_id: str, db: DbOption = None, as_json: JsonOption = False) -> None:
    """What each iteration of a run tried, why, and what came of it."""
    from workbench.store import records
    from workbench.store.queries import find_run, run_candidates, run_steps

    engine = _engine(Settings.load(db))
    records.mark_interrupted(engine)
    run = find_run(engine, run_id)
    if run is None:
        raise WorkbenchError(f"no run '{run_id}' (see `workbench runs`)")
    steps, candidates = run_steps(engine, run.id), run_candidates(engine, run.id)
    if as_json:
        return _emit_json({"run": run.model_dump(), "steps": [s.model_dump() for s in steps],
                           "candidates": [c.model_dump(exclude={"source"}) for c in candidates]})
    console.print(f"run {run.id}: {run.block}, {_style(run.status)}, proposer {run.proposer}, "
                  f"backend {run.backend}, budget {run.budget}")
    console.print(f"  {escape(run.reason)}")
    resumes = sum(s.node == "resume" for s in steps)
    if resumes:
        console.print(f"  resumed {resumes} time{'s' if resumes > 1 else ''}")
    if run.operator_path:
        console.print(f"  operator: {run.operator_path}")
    table = Table(title="Candidates")
    for col in ("#", "template", "params", "verdict", "worst err/bound", "verify s", "message"):
        table.add_column(col)
    for c in candidates:
        params = key_values(c.params)
        table.add_row(str(c.iteration), c.template or "-", params, _style(c.status),
                      f"{c.worst_ratio:.3g}" if c.worst_ratio is not None else "-",
                      f"{c.verify_seconds:.1f}" if c.verify_seconds else "-", escape(c.message[:90]))
    console.print(table)
    trace = Table(title="Agent trace")
    for col in ("step", "node", "what and why"):
        trace.add_column(col)
    for s in steps:
        trace.add_row(str(s.seq), s.node, escape(s.message))
    console.print(trace)
