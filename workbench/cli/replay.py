"""`workbench` commands. Loss-curve replays: replay."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from workbench.cli._common import DbOption, JsonOption, OpsOption, _emit_json, _style, command, console
from workbench.config import Settings
from workbench.errors import WorkbenchError
from workbench.vocabulary import ReplayStatus, key_values


@command
def replay(
    model: Annotated[str, typer.Argument(help="model card, e.g. kimi-k3.1-pro")],
    mode: Annotated[str, typer.Option(help="scratch (random init) or lora (frozen base checkpoint + adapters)")]
    = "scratch",
    preset: Annotated[str, typer.Option(help="tiny (CPU, CI), small or medium (GPU)")] = "tiny",
    steps: Annotated[int | None, typer.Option(help="training steps (default: the preset's for the mode)")] = None,
    ops: Annotated[list[str] | None, typer.Option(
        "--ops", help="promoted | library | reference | <block>=<file|reference>; repeatable, later words win")] = None,
    seed: Annotated[int, typer.Option(help="initialization and data seed")] = 0,
    rerun_reference: Annotated[bool, typer.Option(
        "--rerun-reference", help="run the reference again (twice, checked bit-identical) instead of the stored one")]
    = False,
    export_reference: Annotated[bool, typer.Option(
        "--export-reference", help="write the reference run to replays/<model>/<preset>/ for CI")] = False,
    plot: Annotated[Path | None, typer.Option(help="PNG path (default .workbench/replays/replay-<id>.png)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds per training process")] = 3600.0,
    ranks: Annotated[int, typer.Option(help="processes to train in (torch.distributed, started by the workbench)")]
    = 1,
    layout: Annotated[str | None, typer.Option(
        help="parallel layout over the ranks: fsdp2+ep (dense parameters sharded with FSDP2, routed experts split "
             "across the ranks; the default with --ranks 2+)")] = None,
    cache: Annotated[str | None, typer.Option(
        help="<block>,...:host keeps what these blocks save for backward in host memory")] = None,
    rank_ops: Annotated[list[str] | None, typer.Option(
        "--rank-ops", help="RANK:<block>=<file|reference>: one rank runs another implementation; repeatable")] = None,
    collective_timeout: Annotated[float | None, typer.Option(
        help="seconds a rank waits for the others in a collective before the replay names the rank that hung "
             "(default: min(300, timeout / 2))")] = None,
    dispatch_chunks: Annotated[int, typer.Option(
        help="token chunks of the expert dispatch: chunk c+1's All-to-All overlaps chunk c's experts")] = 1,
    mtp: Annotated[bool, typer.Option(
        "--mtp", help="one multi-token-prediction depth (DeepSeek-V3), its loss held against its own reference")]
    = False,
    profile: Annotated[bool, typer.Option(
        "--profile", help="each rank records a profiler trace of its steps (with --ranks 2+; read by workbench "
                          "trace <replay-id>)")] = False,
    db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False,
) -> None:
    """Train the small model with operators and hold its loss curve against the reference run; exit 1 when the
    curve leaves the band (or the final loss, trained parameters or eval top-k differ; with --ranks, when a rank's
    local loss leaves the band of the same layout's reference run)."""
    from rich.live import Live

    from workbench.replay.compare import band_width
    from workbench.replay.runner import execute, plan_replay

    settings = Settings.load(db, operators)
    plan = plan_replay(model, mode, settings, preset=preset, steps=steps, ops=ops, seed=seed, ranks=ranks,
                       layout=layout, cache=cache, rank_ops=_rank_ops(rank_ops), mtp=mtp,
                       chunks=dispatch_chunks, profile=profile)
    spread = f" · {plan.layout.ranks} ranks {plan.layout.sharding}+{plan.layout.experts}" \
        if plan.layout.distributed else ""
    table = Table(title=f"{model} · {mode} replay · preset {preset} · {plan.steps} steps on {plan.backend.name}"
                        + spread)
    for col in ("step", "reference", "operators", "deviation", "s"):
        table.add_column(col, justify="right")

    def show(kind: str, data: dict) -> None:
        if as_json:
            return
        if kind == "base":
            console.print(f"training the LoRA base checkpoint ({data['steps']} reference steps) -> {data['path']}")
        elif kind == "reference":
            console.print(f"running the reference ({data['steps']} steps, twice: it must be bit-identical)")
        elif kind == "layout_reference":
            console.print(f"running the reference blocks on {data['ranks']} ranks ({data['steps']} steps): each "
                          f"rank's loss is held against it")
        elif kind == "start":
            custom = {k: v for k, v in data["ops"].items() if k != "band" and v != "reference"}
            console.print(f"replay #{data['replay_id']}: reference from the {data['reference_source']}; operators: "
                          + (key_values(custom) or "none (all reference)")
                          + "".join(f"; rank {r} runs {key_values(o)}" for r, o in data["rank_ops"].items()))
        elif kind == "step":
            ref, loss = data["reference"], data["loss"]
            dev = f"{(loss - ref) / abs(ref):+.2e}" if ref is not None else "-"
            style = "red" if ref is not None and abs(loss - ref) > band_width(ref, plan.preset) else ""
            row = (str(data["step"]), f"{ref:.5f}" if ref is not None else "-", f"{loss:.5f}",
                   f"[{style}]{dev}[/]" if style else dev, f"{data['seconds']:.1f}")
            if live:
                table.add_row(*row)
            else:  # a log, not a terminal: one line a step
                console.print("step {} reference {} operators {} deviation {} ({} s)".format(*row))

    live = console.is_terminal and not as_json
    with Live(table, console=console, refresh_per_second=4) if live else nullcontext():
        outcome = execute(plan, settings, rerun_reference=rerun_reference, export=export_reference, plot=plot,
                          timeout_s=timeout, on_event=show, collective_timeout_s=collective_timeout)
    if as_json:
        _emit_json(asdict(outcome))
    else:
        ref_s = outcome.reference_seconds_per_step
        console.print(f"{_style(outcome.status)} replay #{outcome.replay_id}: {escape(outcome.reason)}")
        console.print(f"{len(outcome.curve)} steps, {outcome.seconds_per_step:.2f} s/step with operators"
                      + (f", {ref_s:.3f} s/step reference" if ref_s else "")
                      + (f"; plot {outcome.plot}" if outcome.plot else ""))
        if outcome.traces:
            console.print(f"rank traces in {Path(outcome.traces[0]).parent}: workbench trace {outcome.replay_id}")
    if outcome.status != ReplayStatus.PASS:
        raise typer.Exit(1)


def _rank_ops(words: list[str] | None) -> dict[int, list[str]]:
    """["1:moe_combine=f.py", ...] -> {1: ["moe_combine=f.py"]}."""
    per_rank: dict[int, list[str]] = {}
    for word in words or []:
        rank, sep, rest = word.partition(":")
        if not sep or not rank.isdigit() or "=" not in rest:
            raise WorkbenchError(f"bad --rank-ops '{word}' (RANK:<block>=<file|reference>)")
        per_rank.setdefault(int(rank), []).append(rest)
    return per_rank
