"""The `workbench` command line: catalog, model cards, port runs, verification, the record."""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from workbench.config import Settings
from workbench.errors import WorkbenchError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Port a model's architecture blocks to Triton kernels, verify them, track the port.")
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

DbOption = Annotated[str | None, typer.Option("--db", help="database URL (default $WORKBENCH_DB or sqlite:///workbench.db)")]
OpsOption = Annotated[Path | None, typer.Option("--operators", help="promoted operators folder (default ./operators)")]
JsonOption = Annotated[bool, typer.Option("--json", help="machine-readable output")]

VERDICT_STYLE = {"pass": "green", "passed": "green", "promoted": "green", "fail": "red", "failed": "red",
                 "blocked": "red", "running": "yellow",
                 "in progress": "yellow", "numerics pass": "cyan", "no spec": "dim", "not started": "dim"}


def _style(word: str) -> str:
    return f"[{VERDICT_STYLE.get(word, 'magenta')}]{escape(word)}[/]"


def _emit_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def command(fn):
    """Register ``fn`` as a command whose user mistakes (WorkbenchError) are one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except WorkbenchError as exc:
            err_console.print(f"[red]error:[/] {escape(str(exc))}")
            raise typer.Exit(2) from None

    return app.command()(wrapper)


def _engine(settings: Settings):
    from workbench.store import get_engine

    return get_engine(settings.db_url)


@command
def blocks(db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False) -> None:
    """The block catalog: name, family, shape suites, templates, port status."""
    from workbench.blocks import REGISTRY
    from workbench.store.queries import block_status
    from workbench.templating import list_templates

    settings = Settings.load(db, operators)
    engine = _engine(settings)
    rows = []
    for spec in REGISTRY.values():
        status, detail = block_status(engine, settings.operators_dir, spec.name)
        rows.append({"name": spec.name, "family": spec.family, "summary": spec.summary,
                     "suites": {k: len(v) for k, v in spec.shapes.items()},
                     "templates": [t.name for t in list_templates(spec.name)], "status": status, "detail": detail})
    if as_json:
        return _emit_json(rows)
    table = Table(title="Block catalog")
    for col in ("block", "family", "shape suites", "templates", "status", "detail"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["family"], ", ".join(f"{k} {n}" for k, n in r["suites"].items()),
                      ", ".join(r["templates"]), _style(r["status"]), escape(r["detail"]))
    console.print(table)


@command
def models(as_json: JsonOption = False) -> None:
    """The model cards."""
    from workbench.models import list_models

    cards = list_models()
    if as_json:
        return _emit_json([{"name": c.name, "title": c.title, "blocks": list(c.blocks), "facts": c.facts}
                           for c in cards])
    table = Table(title="Model cards")
    for col in ("model", "title", "blocks"):
        table.add_column(col)
    for c in cards:
        table.add_row(c.name, c.title, str(len(c.blocks)))
    console.print(table)
    console.print("`workbench plan <model>` shows each block the model needs and its status.")


@command
def plan(model: str, db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False) -> None:
    """Each block a model needs, its sizes and its port status."""
    from workbench.models import get_model
    from workbench.store.queries import block_status

    settings = Settings.load(db, operators)
    card = get_model(model)
    engine = _engine(settings)
    rows = []
    for name, info in card.blocks.items():
        status, detail = block_status(engine, settings.operators_dir, name)
        rows.append({"block": name, "role": info.get("role", ""), "shapes": card.block_shapes(name),
                     "status": status, "detail": detail})
    if as_json:
        return _emit_json({"model": card.name, "facts": card.facts, "blocks": rows})
    table = Table(title=f"Port plan: {card.title}")
    for col in ("block", "role", "model sizes", "status", "detail"):
        table.add_column(col)
    for r in rows:
        sizes = "; ".join(",".join(f"{k}={v}" for k, v in s.items()) for s in r["shapes"])
        table.add_row(r["block"], escape(r["role"]), sizes, _style(r["status"]), escape(r["detail"]))
    console.print(table)
    done = sum(r["status"] == "promoted" for r in rows)
    assumed = [k for k, v in card.facts.items() if v.get("source") == "assumption"]
    console.print(f"{done} of {len(rows)} blocks promoted. Assumed (not public) sizes: {', '.join(assumed)}")


@command
def port(
    block_names: Annotated[list[str] | None, typer.Argument(metavar="[BLOCK]...", help="blocks to port")] = None,
    model: Annotated[str | None, typer.Option(help="port every block of this model card that has a spec")] = None,
    budget: Annotated[int, typer.Option(help="most candidates to render and verify per block")] = 8,
    explore: Annotated[int, typer.Option(help="verify until this many pass, promote the best")] = 1,
    start: Annotated[str | None, typer.Option(help="start point, e.g. row_block:BLOCK_N=64")] = None,
    proposer: Annotated[str, typer.Option(help="how candidates are proposed")] = "search",
    suites: Annotated[str, typer.Option(help="shape suites to verify on")] = "smoke,edge",
    dtypes: Annotated[str | None, typer.Option(help="dtypes (default: all the backend runs)")] = None,
    seeds: Annotated[int, typer.Option(help="random inputs per shape and dtype")] = 2,
    timeout: Annotated[float, typer.Option(help="seconds one candidate's verification may take")] = 300.0,
    backend: Annotated[str | None, typer.Option(help="auto, interpreter or cuda")] = None,
    db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False,
) -> None:
    """Port blocks with the agent: render, compile, verify, diagnose, revise, promote. Exit 1 if any ends blocked."""
    from workbench.agent.run import port_block
    from workbench.backends import get_backend
    from workbench.blocks import REGISTRY, get_block
    from workbench.models import get_model

    settings = Settings.load(db, operators)
    names = list(block_names or [])
    if model:
        names += [b for b in get_model(model).blocks if b in REGISTRY and b not in names]
    if not names:
        raise WorkbenchError("name a block to port, or --model to port every block of a model card")
    for name in names:
        get_block(name)
    if start and len(names) > 1:
        raise WorkbenchError("--start applies to one block")
    chosen = get_backend(backend)

    def show(node: str, message: str, _data: dict) -> None:
        if not as_json:
            console.print(f"  [bold]{node:>8}[/] {escape(message)}")

    outcomes = []
    for name in names:
        if not as_json:
            console.rule(f"port {name} on {chosen.name}")
        outcome = port_block(name, settings, budget=budget, explore=explore, start=start, proposer=proposer,
                             suites=suites.split(","), dtypes=dtypes.split(",") if dtypes else None, seeds=seeds,
                             backend=chosen, timeout_s=timeout, model=model, on_event=show)
        outcomes.append(outcome)
        if not as_json:
            console.print(f"{_style(outcome.status)} {name} after {outcome.attempts} candidates "
                          f"(run {outcome.run_id}): {escape(outcome.reason)}")
    if as_json:
        _emit_json([asdict(o) for o in outcomes])
    raise typer.Exit(0 if all(o.status == "promoted" for o in outcomes) else 1)


@command
def verify(
    candidate: Annotated[Path, typer.Argument(help="candidate file (BLOCK = ..., def run(...))")],
    block: Annotated[str | None, typer.Option(help="block to verify against (default: the file's BLOCK)")] = None,
    suites: Annotated[str, typer.Option(help="shape suites")] = "smoke,edge",
    dtypes: Annotated[str | None, typer.Option(help="dtypes (default: all the backend runs)")] = None,
    seeds: Annotated[int, typer.Option(help="random inputs per shape and dtype")] = 2,
    seed: Annotated[int | None, typer.Option(help="base seed (default: drawn at random, printed)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds the candidate may take")] = 300.0,
    backend: Annotated[str | None, typer.Option(help="auto, interpreter or cuda")] = None,
    db: DbOption = None, as_json: JsonOption = False,
) -> None:
    """Full verification of any candidate file: exit 0 pass, 1 fail, 2 usage error."""
    from workbench.backends import get_backend
    from workbench.store import records
    from workbench.verify.harness import read_candidate, verify_candidate

    settings = Settings.load(db)
    chosen = get_backend(backend)
    with console.status(f"verifying {candidate} on {chosen.name}...") if not as_json else _nullcontext():
        result = verify_candidate(candidate, block=block, suites=suites.split(","),
                                  dtypes=dtypes.split(",") if dtypes else None, seeds=seeds, base_seed=seed,
                                  backend=chosen, timeout_s=timeout)
    engine = _engine(settings)
    _, source = read_candidate(candidate)
    cid = records.add_candidate(engine, block=result.block, source=source, source_hash=result.source_hash,
                                path=str(Path(candidate).resolve()))
    records.record_verification(engine, cid, result)
    if as_json:
        _emit_json(result.to_dict())
    else:
        _print_checks(result)
    raise typer.Exit(0 if result.passed else 1)


def _nullcontext():
    from contextlib import nullcontext

    return nullcontext()


def _print_checks(result) -> None:
    table = Table(title=f"{result.block}: {Path(result.candidate).name} on {result.backend} (base seed "
                        f"{result.base_seed})")
    for col in ("shape", "dtype", "check", "max abs err", "bound", "err ratio", "verdict"):
        table.add_column(col, justify="right" if col in ("max abs err", "bound", "err ratio") else "left")
    grouped: dict[tuple, list] = {}
    for c in result.checks:
        grouped.setdefault((c.suite, c.shape, c.dtype, c.direction), []).append(c)
    for (_suite, shape, dtype, direction), cs in grouped.items():
        worst = max(cs, key=lambda c: (c.max_abs or 0) / (c.bound or 1) if c.bound else float("inf"))
        fmt = (lambda v: f"{v:.2e}" if v is not None else "-")
        table.add_row(shape, dtype, direction, fmt(worst.max_abs), fmt(worst.bound), fmt(worst.err_ratio),
                      _style("pass") if all(c.passed for c in cs) else _style("fail") + " " + escape(worst.reason))
    if result.checks:
        console.print(table)
    console.print(f"{_style(result.verdict)} {escape(result.message)} ({result.seconds:.1f} s)")


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
def ci(
    junit: Annotated[Path | None, typer.Option(help="write JUnit XML here (one testcase per operator x check)")] = None,
    changed_only: Annotated[bool, typer.Option("--changed-only", help="only operators changed since the baseline")]
    = False,
    update_baseline: Annotated[bool, typer.Option("--update-baseline",
                                                  help="write operators/ci_baseline.json from this job")] = False,
    timeout: Annotated[float, typer.Option(help="seconds one operator's verification may take")] = 300.0,
    db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False,
) -> None:
    """Re-verify every promoted operator against the last recorded results: exit 1 on a regression."""
    from workbench.ci import run_ci, write_baseline, write_junit

    settings = Settings.load(db, operators)

    def show_report(report) -> None:
        if not as_json:
            console.print(f"{_style(report.verdict)} {report.block}: {escape(report.operator)} "
                          f"({report.seconds:.1f} s) {escape(report.message)}")

    job, reports = run_ci(settings, changed_only=changed_only, timeout_s=timeout, on_report=show_report)
    if junit:
        write_junit(junit, job, reports)
    if update_baseline:
        write_baseline(settings, reports)
    regressions = job.summary["regressions"]
    if as_json:
        _emit_json({"job": job.id, "status": job.status, "commit": job.commit, "regressions": regressions,
                    "operators": [vars(r) for r in reports]})
    else:
        for line in regressions:
            err_console.print(f"[red]regression:[/] {escape(line)}")
        console.print(f"CI job {job.id}: {_style(job.status)}, {len(reports)} operators, {len(regressions)} "
                      f"regressions")
    raise typer.Exit(1 if regressions else 0)


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
    if run.operator_path:
        console.print(f"  operator: {run.operator_path}")
    table = Table(title="Candidates")
    for col in ("#", "template", "params", "verdict", "worst err/bound", "verify s", "message"):
        table.add_column(col)
    for c in candidates:
        params = ", ".join(f"{k}={v}" for k, v in c.params.items())
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


@command
def dashboard(db: DbOption = None, operators: OpsOption = None,
              port: Annotated[int, typer.Option(help="local port to serve on")] = 8501) -> None:
    """The Streamlit dashboard on http://localhost:PORT: port status, candidates, traces, replays, CI, live runs."""
    import os
    import subprocess

    app_path = Path(__file__).resolve().parent.parent / "dashboards" / "app.py"
    if not app_path.is_file():
        raise WorkbenchError(f"no dashboard at {app_path} (run from a checkout of the workbench)")
    settings = Settings.load(db, operators)
    env = {**os.environ, "WORKBENCH_DB": settings.db_url, "WORKBENCH_OPERATORS": str(settings.operators_dir)}
    console.print(f"dashboard on http://localhost:{port} (database {settings.db_url}); Ctrl-C stops it")
    cmd = [sys.executable, "-m", "streamlit", "run", str(app_path), "--server.headless", "true",
           "--server.port", str(port), "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]
    try:
        code = subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)


def main() -> None:
    app()
