"""`workbench` commands. The catalog and the model cards: blocks, models, onboard, plan."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from workbench.cli._common import DbOption, JsonOption, OpsOption, _emit_json, _engine, _style, command, console
from workbench.config import Settings
from workbench.vocabulary import BlockStatus, key_values


@command
def blocks(db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False) -> None:
    """The block catalog: name, family, shape suites, templates, port status."""
    from workbench.blocks import REGISTRY
    from workbench.status import block_status
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
def onboard(
    config: Annotated[str, typer.Argument(help="a Hugging Face-style config.json, a folder holding one, or a "
                                               "model_type the installed transformers knows (its class's defaults)")],
    name: Annotated[str | None, typer.Option(help="the card's name (default: from the file or folder)")] = None,
    out: Annotated[str | None, typer.Option(help="where the card is written (default: the first folder of "
                                                 "$WORKBENCH_MODELS, else the workbench's own cards)")] = None,
    as_json: JsonOption = False,
) -> None:
    """Write a model card from a model's config: its blocks at their real sizes, layer counts, sources and gaps; where
    transformers has the family's code, every module class probed against the catalog's references."""
    from workbench.blocks import REGISTRY
    from workbench.models import CARDS_DIR
    from workbench.onboard import onboard as make_card
    from workbench.onboard import write_card

    card = make_card(config, name)
    folder = out or next(iter(Settings.load().model_dirs), None) or CARDS_DIR
    path = write_card(card, folder)
    gaps = {b: info["gap"] for b, info in card["blocks"].items() if "gap" in info or b not in REGISTRY}
    if as_json:
        return _emit_json({"card": str(path), **card, "gaps": gaps})
    source = card["onboarded_from"].get("file") or f"{config} (the class's defaults)"
    table = Table(title=f"{card['name']}: {len(card['blocks'])} blocks from {source}")
    for col in ("block", "layers", "model sizes", "in the catalog", "evidence"):
        table.add_column(col)
    for block, info in card["blocks"].items():
        sizes = "; ".join(key_values(s, ",") for s in info["shapes"])
        where = _style(BlockStatus.NO_SPEC) + escape(info.get("gap", "").removeprefix("no spec")) if block in gaps \
            else "spec" + (f"; differs: {escape(info['differs'])}" if info.get("differs") else "")
        table.add_row(block, str(info.get("layers", "")), sizes, where, escape(str(info.get("evidence", ""))))
    console.print(table)
    view = card.get("transformers") or {}
    if view.get("error"):
        console.print(f"transformers: {escape(view['error'])}")
    if (card.get("probe") or {}).get("error"):
        console.print(f"probe: {escape(card['probe']['error'])}; the card follows the config's fields alone")
    elif card.get("probe"):
        console.print(module_table(view["modules"], f"Modules of {view['class']} ({card['probe']['code']}, probed in "
                                                     f"{card['probe']['seconds']} s)"))
        counts = card["probe"]["counts"]
        console.print(f"{counts['covered']} module classes covered ({counts['probed']} proven by the probe, the rest "
                      f"inside them), {counts['differs']} another variant, {counts['no spec']} without a block, "
                      f"{counts['framework']} framework; `workbench parity {card['name']}` runs the model with the "
                      "kernels" + (f"; the class does not read {', '.join(view['unread_fields'])}"
                                   if view.get("unread_fields") else ""))
    assumed = [k for k, v in card["facts"].items() if v["source"] == "assumption"]
    console.print(f"wrote {path}: {len(card['blocks']) - len(gaps)} blocks with a spec, {len(gaps)} without; "
                  f"assumed: {', '.join(assumed) or 'nothing'}; onboarded in {card['onboard_seconds']} s. "
                  f"`workbench plan {card['name']}` shows its status.")


def module_table(modules: list[dict], title: str) -> Table:
    """The probe's rows: every module class of the model, how the catalog computes it, and the measured error."""
    table = Table(title=title)
    for col in ("module class", "count", "status", "blocks (variant)", "error out / grad", "what it computes"):
        table.add_column(col)
    for m in modules:
        error = m.get("error")
        measured = f"{error['output']:.1e} / {error['grad']:.1e}" if error else ""
        blocks = ", ".join(m.get("blocks", [])) + (f" ({m['variant']})" if m.get("variant") else "")
        role = m.get("differs") or m.get("role", "") + (f" (inside {', '.join(m['within'])})" if m.get("within")
                                                          else "")
        table.add_row(m["cls"], str(m.get("count", "")), _style(m["status"]), escape(blocks), measured, escape(role))
    return table


def weights_line(summary: dict) -> str:
    """One line of a card's weights section: parameters, bytes in bfloat16 and as published (modelled)."""
    quantized = {p["format"] for p in summary["parts"].values()} - {"bf16"}
    published = f"{summary['bytes_published'] / 1e12:.2f} TB as published ({', '.join(sorted(quantized))} parts)" \
        if quantized else "published in bfloat16"
    left_out = f"; not counted: {'; '.join(summary['uncounted'])}" if summary.get("uncounted") else ""
    return (f"Weights (modelled from the config): {summary['params'] / 1e9:,.0f}B parameters, "
            f"{summary['bytes_bf16'] / 1e12:.2f} TB in bfloat16, {published}{left_out}")


@command
def plan(model: str, db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False) -> None:
    """Each block a model needs, its sizes and its port status."""
    from workbench.models import get_model
    from workbench.status import block_status

    settings = Settings.load(db, operators)
    card = get_model(model)
    engine = _engine(settings)
    rows = []
    for name, info in card.blocks.items():
        status, detail = block_status(engine, settings.operators_dir, name)
        notes = ([info["gap"]] if info.get("gap") and not detail else []) + \
            ([f"differs: {info['differs']}"] if info.get("differs") else [])
        detail = " · ".join([detail, *notes] if detail else notes)
        rows.append({"block": name, "role": info.get("role", ""), "shapes": card.block_shapes(name),
                     "layers": info.get("layers"), "status": status, "detail": detail,
                     "evidence": info.get("evidence", "")})
    modules = (card.transformers or {}).get("modules") or []
    if as_json:
        return _emit_json({"model": card.name, "facts": card.facts, "blocks": rows, "weights": card.weights,
                           "modules": modules})
    table = Table(title=f"Port plan: {card.title}")
    for col in ("block", "role", "model sizes", "status", "detail", "evidence"):
        table.add_column(col)
    for r in rows:
        sizes = "; ".join(key_values(s, ",") for s in r["shapes"])
        table.add_row(r["block"], escape(r["role"]), sizes, _style(r["status"]), escape(r["detail"]),
                      escape(r["evidence"]))
    console.print(table)
    if modules and "status" in modules[0]:  # the probe's rows (a card onboarded through the family's code)
        console.print(module_table(modules, f"Modules of {card.transformers['class']} (the onboarding probe)"))
    done = sum(r["status"] == BlockStatus.PROMOTED for r in rows)
    assumed = [k for k, v in card.facts.items() if v.get("source") == "assumption"]
    console.print(f"{done} of {len(rows)} blocks promoted. Assumed (not public) sizes: {', '.join(assumed)}")
    if card.weights:
        base = f" (the {card.derived_from} card's count: what {card.name} changes is not in it)" \
            if card.derived_from else ""
        console.print(weights_line(card.weights) + base)
