"""`workbench` commands. The layout planner: layout."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from workbench.cli._common import DbOption, JsonOption, _emit_json, command, console
from workbench.errors import WorkbenchError

GB = 1e9


@command
def layout(
    model: Annotated[str, typer.Argument(help="model card, e.g. kimi-k3.1-pro")],
    cards: Annotated[int, typer.Option(help="cards the model trains on")] = 8,
    layout: Annotated[str, typer.Option(
        "--layout", help="fsdp2+ep<E> (experts split over groups of E cards) or fsdp2+edp (experts replicated)")]
    = "fsdp2+ep8",
    lora: Annotated[int | None, typer.Option(help="LoRA rank (frozen base in its published formats; 0: the card's "
                                                  "lora_rank); default: a full fine-tune")] = None,
    cache: Annotated[list[str] | None, typer.Option(
        help="<block>,...:hbm|host keeps what these blocks save for backward in that tier instead of recomputing "
             "it; repeatable")] = None,
    recompute: Annotated[str, typer.Option(help="layers (activation checkpointing per layer) or none")] = "layers",
    pp: Annotated[int, typer.Option("--pp", help="pipeline stages")] = 1,
    split: Annotated[str, typer.Option(help="the pipeline's split: balanced (compute and memory) or uniform")]
    = "balanced",
    micro_batches: Annotated[int | None, typer.Option(help="per step with a pipeline (default 2 x --pp)")] = None,
    tokens: Annotated[int | None, typer.Option(help="tokens per card per step (default: the card's tokens_per_step)")]
    = None,
    target: Annotated[str, typer.Option(help="the card's GPU target: its HBM and bf16 peak")] = "sm_90a",
    hbm: Annotated[float | None, typer.Option(help="HBM per card, GB (default: the target's SKU)")] = None,
    host: Annotated[float | None, typer.Option(help="host memory per card, GB (default 256, assumed)")] = None,
    preset: Annotated[str | None, typer.Option(
        help="plan the card's replay model at this preset (tiny, small, medium) instead of the model")] = None,
    against: Annotated[int | None, typer.Option(
        help="a distributed replay's id: plan its model and layout and hold the plan to what its ranks measured")]
    = None,
    db: DbOption = None, as_json: JsonOption = False,
) -> None:
    """Per card: the bytes of weights, gradients, optimizer state, FSDP buffers and activations, and the bytes sent
    per step (All-to-All, FSDP all-gather and reduce-scatter, expert gradients, pipeline); whether it fits; expert
    data parallelism beside expert parallelism; a balanced pipeline split beside a uniform one. Every figure is
    modelled (workbench/layout)."""
    from workbench.backends import TARGETS
    from workbench.layout import compare_experts, from_card, from_replay, plan_layout
    from workbench.layout.plan import DEFAULT_HOST_GB, HBM_GB, held_by_block, held_to

    if target not in TARGETS or target not in HBM_GB:
        raise WorkbenchError(f"unknown target '{target}' (known: {', '.join(HBM_GB)})")
    measured = None
    if against is not None:
        model, preset, cards, layout, lora, recompute, cache, measured = _replay(model, against, db)
        pp, tokens = 1, None
    planned = from_replay(model, preset, cards) if preset else from_card(model)
    if lora == 0:
        lora = planned.lora_rank or None
    options = dict(lora=lora, cache=_cache(cache), recompute=recompute, pipeline=pp, split=split,
                   micro_batches=micro_batches, hbm_gb=hbm or HBM_GB[target], host_gb=host or DEFAULT_HOST_GB,
                   peak_flops=TARGETS[target].peaks.bf16_flops, tokens=tokens)
    plan = plan_layout(planned, cards, layout, **options)
    experts = compare_experts(planned, plan, **{**options, "split": plan.split if pp > 1 else split})
    splits = [plan_layout(planned, cards, layout, **{**options, "split": s}) for s in ("uniform", "balanced")] \
        if pp > 1 else []
    held = held_to(plan, measured) if measured else []
    by_block = held_by_block(planned, plan, measured) if measured else []
    if as_json:
        return _emit_json({"params": planned.params, "weight_bytes": planned.weight_bytes(),
                           "plan": plan.to_dict(), "experts": [p.to_dict() for p in experts],
                           "splits": [p.to_dict() for p in splits], "against": held,
                           "against_by_block": by_block})
    _show(planned, plan, experts, splits, held, by_block, against)


def _cache(words: list[str] | None) -> dict[str, str]:
    """["kda,mla:host", "moe_grouped_gemm:hbm"] -> {block: tier}."""
    chosen = {}
    for word in words or []:
        names, sep, tier = word.rpartition(":")
        if not sep or not names:
            raise WorkbenchError(f"bad --cache '{word}' (<block>,...:hbm|host)")
        chosen.update({name.strip(): tier for name in names.split(",") if name.strip()})
    return chosen


def _replay(model: str, replay_id: int, db: str | None) -> tuple:
    """(card, preset, ranks, layout, lora rank, recompute, cache words, rank memory) of distributed replay
    ``replay_id``."""
    from sqlmodel import Session

    from workbench.config import Settings
    from workbench.replay.presets import get_preset
    from workbench.store import LossReplay, get_engine

    with Session(get_engine(Settings.load(db).db_url)) as session:
        found = session.get(LossReplay, replay_id)
    if found is None:
        raise WorkbenchError(f"no replay #{replay_id}")
    memory = (found.detail or {}).get("rank_memory")
    if not memory:
        raise WorkbenchError(f"replay #{replay_id} has no measured memory (a distributed replay records it)")
    if found.model != model:
        raise WorkbenchError(f"replay #{replay_id} trained {found.model}, not {model}")
    ranks = found.layout["ranks"]
    cache = [",".join(found.layout["cache"]) + ":host"] if found.layout.get("cache") else []
    lora = get_preset(found.preset).lora_rank if found.mode == "lora" else None
    return model, found.preset, ranks, f"fsdp2+ep{ranks}", lora, "none", cache, memory


def _gb(nbytes: float) -> str:
    return f"{nbytes / GB:,.2f}" if nbytes >= 0.01 * GB else f"{nbytes:,.0f} B"


def _show(planned, plan, experts, splits, held, by_block, against) -> None:
    stage_col = plan.pipeline > 1
    weights = planned.weight_bytes()
    console.print(f"[bold]{plan.model}[/]: {planned.params / 1e9:,.1f}B parameters; weights {_gb(weights['bf16'])} "
                  f"GB in bf16, {_gb(weights['stored'])} GB as stored ({planned.dense_format} dense, "
                  f"{planned.expert_format} routed experts), {_gb(weights['4bit'])} GB at 4 bits (modelled)")
    console.print(f"on {plan.cards} cards · {plan.layout} · "
                  f"{'LoRA r=' + str(plan.lora_rank) if plan.lora_rank else 'full fine-tune'} · {plan.tokens:,} "
                  f"tokens per card per step · recompute {plan.recompute}"
                  + (f" · cached {', '.join(f'{b}:{t}' for b, t in plan.cache.items())}" if plan.cache else "")
                  + (f" · {plan.pipeline} stages ({plan.split}), {plan.micro_batches} micro-batches"
                     if stage_col else ""))
    memory = Table(title=f"Memory per card, GB (modelled; HBM {plan.hbm_gb:g} GB, host {plan.host_gb:g} GB)")
    kinds = list(plan.stages[0].memory)
    for col in (["stage", "layers"] if stage_col else []) + [k.replace("_", " ") for k in kinds] + \
            ["HBM total", "host", "fits"]:
        memory.add_column(col, justify="right")
    for index, stage in enumerate(plan.stages):
        fits = stage.hbm <= plan.hbm_gb * GB and stage.host <= plan.host_gb * GB
        memory.add_row(*([str(index), f"{stage.first}-{stage.last - 1}"] if stage_col else []),
                       *(_gb(stage.memory[k]) for k in kinds), _gb(stage.hbm), _gb(stage.host),
                       "[green]yes[/]" if fits else "[red]no[/]")
    console.print(memory)
    sent = Table(title="Sent per card per step, GB (modelled)")
    for col in (["stage"] if stage_col else []) + [k.replace("_", " ") for k in plan.stages[0].sent] + ["total"]:
        sent.add_column(col, justify="right")
    for index, stage in enumerate(plan.stages):
        sent.add_row(*([str(index)] if stage_col else []), *(_gb(v) for v in stage.sent.values()),
                     _gb(sum(stage.sent.values())))
    console.print(sent)
    compare = Table(title="Expert placement (modelled, the most loaded stage)")
    for col in ("layout", "experts per card", "HBM per card", "All-to-All", "expert all-reduce", "step floor s",
                "fits"):
        compare.add_column(col, justify="right", no_wrap=col == "layout")
    for p in experts:
        worst = max(p.stages, key=lambda s: s.hbm)
        compare.add_row(p.layout, f"1/{p.expert_parallel}" if p.expert_parallel > 1 else "all", _gb(worst.hbm),
                        _gb(max(s.sent["all_to_all"] for s in p.stages)),
                        _gb(max(s.sent["expert_all_reduce"] for s in p.stages)), f"{p.step_floor_s:.3g}",
                        "[green]yes[/]" if p.fits else "[red]no[/]")
    console.print(compare)
    if splits:
        table = Table(title="Pipeline split (modelled)")
        for col in ("split", "layers per stage", "TFLOP per stage", "HBM per stage, GB", "step floor s", "fits"):
            table.add_column(col, justify="right")
        for p in splits:
            table.add_row(p.split, " ".join(str(s.last - s.first) for s in p.stages),
                          " ".join(f"{s.flops / 1e12:,.0f}" for s in p.stages),
                          " ".join(f"{s.hbm / GB:.1f}" for s in p.stages), f"{p.step_floor_s:.4g}",
                          "[green]yes[/]" if p.fits else "[red]no[/]")
        console.print(table)
    if held:
        _held(f"Held to replay #{against}: modelled vs measured per rank (the largest)", "kind", held)
        _held(f"Activations by block, replay #{against}: modelled vs saved at the device tier's peak", "block",
              by_block)
    console.print(f"step floor {plan.step_floor_s:.4g} s: the slowest stage's training FLOPs at the bf16 peak"
                  + (f", pipeline bubble {plan.bubble:.0%}" if stage_col else "") + f"; {plan.note}")


def _held(title: str, key: str, rows: list[dict]) -> None:
    """A table of modelled beside measured bytes, one row per ``row[key]``."""
    table = Table(title=title)
    for col in (key, "modelled", "measured", "modelled / measured"):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(row[key], f"{row['modelled']:,.0f}", f"{row['measured']:,.0f}",
                      f"{row['ratio']:.3f}" if row["ratio"] is not None else "-")
    console.print(table)
