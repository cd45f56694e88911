"""`workbench` commands. CI verification jobs: ci."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from workbench.cli._common import (
    DbOption,
    JsonOption,
    OpsOption,
    RayAddressOption,
    TargetsOption,
    WorkersOption,
    _emit_json,
    _style,
    _targets,
    command,
    console,
    err_console,
)
from workbench.config import Settings


@command
def ci(
    junit: Annotated[Path | None, typer.Option(help="write JUnit XML here (one testcase per operator x check)")] = None,
    changed_only: Annotated[bool, typer.Option("--changed-only", help="only operators changed since the baseline")]
    = False,
    update_baseline: Annotated[bool, typer.Option("--update-baseline",
                                                  help="write operators/ci_baseline.json from this job")] = False,
    timeout: Annotated[float, typer.Option(help="seconds one operator's verification may take")] = 300.0,
    replays: Annotated[bool, typer.Option("--replays/--no-replays",
                                          help="short scratch and LoRA replays with every promoted operator")] = True,
    parity: Annotated[bool, typer.Option("--parity/--no-parity",
                                         help="workbench parity of every model card that names a transformers class")]
    = True,
    targets: TargetsOption = None,
    workers: WorkersOption = None, ray_address: RayAddressOption = None,
    db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False,
) -> None:
    """Re-verify every promoted operator against the last recorded results and replay short loss curves with them:
    exit 1 on a regression. The verifications fan out on Ray (--workers, --ray-address)."""
    from workbench.ci import CI_REPLAYS, record_junit, run_ci, write_baseline, write_junit
    from workbench.executor import make_executor
    from workbench.integrations.parity import card_parity_sources

    settings = Settings.load(db, operators)

    def show_report(report) -> None:
        if not as_json:
            console.print(f"{_style(report.verdict)} {report.block}: {escape(report.operator)} "
                          f"({report.seconds:.1f} s) {escape(report.message)}")

    def show_replay(report) -> None:
        if not as_json:
            console.print(f"{_style(report.status)} replay {report.name} ({report.seconds:.1f} s) "
                          f"{escape(report.reason)}")

    def show_parity(result) -> None:
        if not as_json:
            console.print(f"{_style(result.status)} parity {escape(result.source)} ({result.seconds:.1f} s) "
                          f"{escape(result.message)}")

    with make_executor(settings, workers, ray_address) as executor:
        job, reports, replay_reports, parities = run_ci(
            settings, changed_only=changed_only, timeout_s=timeout, replays=CI_REPLAYS if replays else (),
            on_report=show_report, on_replay=show_replay, targets=_targets(targets), executor=executor,
            parity_sources=tuple(card_parity_sources()) if parity else (), on_parity=show_parity)
    if junit:
        write_junit(junit, job, reports, replay_reports, parities)
        record_junit(settings, job, junit)
    if update_baseline:
        write_baseline(settings, job)
    regressions = job.summary["regressions"]
    if as_json:
        _emit_json({"job": job.id, "status": job.status, "commit": job.commit, "regressions": regressions,
                    "operators": [vars(r) for r in reports], "replays": [vars(r) for r in replay_reports],
                    "parity": job.summary["parity"]})
    else:
        for line in regressions:
            err_console.print(f"[red]regression:[/] {escape(line)}")
        console.print(f"CI job {job.id}: {_style(job.status)}, {len(reports)} operators, {len(replay_reports)} "
                      f"replays, {len(parities)} parity runs, {len(regressions)} regressions")
    raise typer.Exit(1 if regressions else 0)
