"""`workbench` commands. Verification of one candidate, and its builds on the GPU targets: verify, targets."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from workbench.cli._common import (
    DbOption,
    JsonOption,
    OpsOption,
    TargetsOption,
    _emit_json,
    _engine,
    _style,
    _targets,
    command,
    console,
)
from workbench.config import Settings
from workbench.errors import WorkbenchError
from workbench.vocabulary import Verdict


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
    targets: TargetsOption = None,
    forward_only: Annotated[bool, typer.Option(
        "--forward-only", help="verify the outputs only (inference kernels without a backward); recorded as such")]
    = False,
    db: DbOption = None, as_json: JsonOption = False,
) -> None:
    """Full verification of any candidate file: exit 0 pass, 1 fail, 2 usage error."""
    from workbench.backends import get_backend
    from workbench.store import records
    from workbench.verify.harness import read_candidate, verify_candidate

    settings = Settings.load(db)
    chosen = get_backend(backend)
    with console.status(f"verifying {candidate} on {chosen.name}...") if not as_json else nullcontext():
        result = verify_candidate(candidate, block=block, suites=suites.split(","),
                                  dtypes=dtypes.split(",") if dtypes else None, seeds=seeds, base_seed=seed,
                                  backend=chosen, timeout_s=timeout, targets=_targets(targets),
                                  forward_only=forward_only)
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
                      _style(Verdict.PASS) if all(c.passed for c in cs)
                      else _style(Verdict.FAIL) + " " + escape(worst.reason))
    if result.checks:
        console.print(table)
    if result.builds:
        console.print(_builds_table(f"{result.block}: what the GPU compilers say", result.builds))
    for finding in result.findings:
        console.print(f"[yellow]finding[/] {escape(finding)}")
    backward = "; forward only: the backward was not verified" if result.forward_only else ""
    console.print(f"{_style(result.verdict)} {escape(result.message)} ({result.seconds:.1f} s, of which compile "
                  f"{result.compile_seconds:.1f} s){backward}")


def _builds_table(title: str, builds: list[dict]) -> Table:
    """Kernel x target: "ok" with registers / spilled bytes / shared KB / CTAs per SM / tensor cores, or the
    compiler's error. The builds of launches captured for their target (workbench.verify.aot.spill_counted; the
    worst speaks for a kernel), and any build that failed."""
    from workbench.verify.aot import spill_counted

    shown = [b for b in builds if spill_counted(b["suite"]) or not b["ok"]] or builds
    targets = list(dict.fromkeys(b["target"] for b in builds))
    rows: dict[tuple[str, str], dict[str, dict]] = {}
    for b in shown:
        cell = rows.setdefault((b.get("operator", ""), b["kernel"]), {})
        worst = cell.get(b["target"])  # the worst build of this kernel on this target speaks for it
        spills_more = (b["spilled_bytes"] or 0) > (worst["spilled_bytes"] or 0) if worst else False
        if worst is None or (worst["ok"] and (not b["ok"] or spills_more)):
            cell[b["target"]] = b
    table = Table(title=title)
    table.add_column("kernel")
    for t in targets:
        table.add_column(t)
    for (operator, kernel), cells in rows.items():
        table.add_row(f"{operator} {kernel}".strip(), *(_build_cell(cells.get(t)) for t in targets))
    table.caption = "regs / spilled B per thread / shared KB / CTAs per SM; TC: tensor-core instructions on a dot"
    return table


def _build_cell(b: dict | None) -> str:
    if b is None:
        return "-"
    if not b["ok"]:
        return f"[red]error[/] {escape(b['error'][:80])}"
    spill = f"[red]{b['spilled_bytes']}[/]" if b["spilled_bytes"] else "0"
    tc = "" if b["uses_dot"] is None or not b["uses_dot"] else (" TC" if b["tensor_cores"] else " [red]no TC[/]")
    return f"{b['registers']} / {spill} / {(b['shared_bytes'] or 0) / 1024:.0f} / {b['ctas_per_sm']}{tc}"


@command
def targets(
    paths: Annotated[list[Path] | None, typer.Argument(help="candidate files (default: every promoted operator)")]
    = None,
    targets: TargetsOption = None,
    forward_only: Annotated[bool, typer.Option(
        "--forward-only", help="the named files' forward launches only (inference kernels without a backward)")]
    = False,
    suite: Annotated[str, typer.Option(help="shape suite: model (the model cards' sizes), smoke or edge")] = "model",
    operators: OpsOption = None, as_json: JsonOption = False,
) -> None:
    """The target matrix: each kernel's launches at the model card's sizes (or every shape of another suite),
    compiled for every GPU target (no GPU needed): registers, spilled bytes, shared memory, occupancy, tensor cores,
    or the compiler's error. Exit 1 when a kernel fails to compile for a target."""
    from workbench.operators import is_forward_only, newest_promoted
    from workbench.verify.harness import target_report

    if suite not in ("model", "smoke", "edge"):
        raise WorkbenchError(f"unknown suite '{suite}': model, smoke or edge")

    settings = Settings.load(None, operators)
    files = [(None, p, forward_only) for p in paths] if paths else \
        [(m["block"], Path(m["path"]), is_forward_only(m)) for m in newest_promoted(settings.operators_dir).values()]
    if not files:
        raise WorkbenchError(f"no candidates: name files, or promote operators into {settings.operators_dir}")
    results = []
    for block, path, forward in files:
        with console.status(f"capturing and compiling {path.name}...") if not as_json else nullcontext():
            results.append(target_report(path, block=block, targets=_targets(targets), forward_only=forward,
                                         suites=(suite,)))
    builds = [{**b, "operator": r.block} for r in results for b in r.builds]
    if as_json:
        _emit_json([{"block": r.block, "candidate": r.candidate, "verdict": r.verdict, "message": r.message,
                     "findings": r.findings, "builds": r.builds, **r.target_report()} for r in results])
    else:
        console.print(_builds_table(f"target matrix at the {suite} suite (compiled ahead of time, no GPU)", builds))
        for r in results:
            for finding in r.findings:
                console.print(f"[yellow]finding[/] {r.block}: {escape(finding)}")
            if not r.passed:
                console.print(f"{_style(r.verdict)} {r.block}: {escape(r.message)}")
        ok = sum(b["ok"] for b in builds)
        console.print(f"{ok} of {len(builds)} kernel x target builds compiled; "
                      f"{sum(1 for b in builds if b['ok'] and b['spilled_bytes'])} spill")
    raise typer.Exit(0 if all(r.passed for r in results) else 1)
