"""The port status of blocks: the store's runs combined with the block catalog, the templates and the promoted
operators folder. Read by the CLI (`workbench blocks`, `workbench plan`) and the dashboard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from workbench.blocks import REGISTRY
from workbench.operators import evidence_line, list_promoted, operator_evidence
from workbench.store.queries import list_runs, recorded_blocks
from workbench.templating import list_templates
from workbench.vocabulary import BlockStatus, RunStatus, key_values

# The statuses a block of a model card can have, in the order a port goes through them.
STATUSES = tuple(BlockStatus)

# A block's status from its latest run (a promoted run whose operator file is gone still passed its numerics).
RUN_TO_BLOCK = {RunStatus.RUNNING: BlockStatus.IN_PROGRESS, RunStatus.INTERRUPTED: BlockStatus.BLOCKED,
                RunStatus.PROMOTED: BlockStatus.NUMERICS_PASS, RunStatus.WAITING_APPROVAL: BlockStatus.NUMERICS_PASS,
                RunStatus.REJECTED: BlockStatus.BLOCKED, RunStatus.BLOCKED: BlockStatus.BLOCKED,
                RunStatus.FAILED: BlockStatus.FAILED}

PLAN_COLUMNS = ["block", "role", "status", "evidence_level", "detail", "sizes"]


def block_status(engine: Engine, operators_dir: Path, block: str) -> tuple[str, str]:
    """(status, detail) of one block: promoted operators first, then the latest run, else not started."""
    if block not in REGISTRY:
        return BlockStatus.NO_SPEC, ""
    promoted = list_promoted(Path(operators_dir), block)
    if promoted:
        return BlockStatus.PROMOTED, f"{Path(promoted[0]['path']).name}: {evidence_line(promoted[0])}"
    runs = list_runs(engine, limit=1, block=block)
    if not runs:
        return BlockStatus.NOT_STARTED, f"{len(list_templates(block))} templates"
    run = runs[0]
    return RUN_TO_BLOCK.get(run.status, run.status), f"run {run.id}: {run.reason or run.status}"


def known_blocks(engine: Engine) -> list[str]:
    """Blocks with a spec, then any other block named by a run or a candidate."""
    return list(REGISTRY) + sorted(recorded_blocks(engine) - set(REGISTRY))


def model_plan(engine: Engine, operators_dir: str | Path, model: str) -> list[dict[str, Any]]:
    """Each block a model card needs, in the card's order: PLAN_COLUMNS, with evidence_level the strongest level a
    promoted operator reaches (workbench.operators.EVIDENCE_LEVELS; "" otherwise) and sizes the model's shapes."""
    from workbench.models import get_model

    card, operators_dir = get_model(model), Path(operators_dir)
    rows = []
    for name, info in card.blocks.items():
        status, detail = block_status(engine, operators_dir, name)
        promoted = list_promoted(operators_dir, name) if name in REGISTRY else []
        sizes = "; ".join(key_values(shape, ",") for shape in card.block_shapes(name))
        level = operator_evidence(promoted[0])["strongest"] if promoted else ""
        rows.append({"block": name, "role": info.get("role", ""), "status": status, "evidence_level": level,
                     "detail": detail, "sizes": sizes})
    return rows
