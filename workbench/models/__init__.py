"""Model cards: which blocks a model needs, at which sizes, and which of its numbers are public or assumed."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from workbench.blocks.base import Shape
from workbench.errors import UnknownModelError, WorkbenchError, one_line

CARDS_DIR = Path(__file__).parent


@dataclass(frozen=True)
class ModelCard:
    name: str
    title: str
    facts: dict[str, dict[str, Any]]
    blocks: dict[str, dict[str, Any]]
    targets: list[str] | None = None  # the GPU targets its kernels must compile for (None: the defaults)

    def block_shapes(self, block: str) -> list[Shape]:
        return [dict(s) for s in self.blocks.get(block, {}).get("shapes", [])]


def _load(path: Path) -> ModelCard:
    try:
        data = yaml.safe_load(path.read_text())
        return ModelCard(name=data["name"], title=data.get("title", data["name"]),
                         facts=dict(data.get("facts", {})), blocks=dict(data["blocks"]),
                         targets=list(data["targets"]) if data.get("targets") is not None else None)
    except (yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WorkbenchError(f"model card {path.name} is malformed: {one_line(exc)}") from None


def card_dirs() -> list[Path]:
    """Where model cards are found: the workbench's own, then each folder of $WORKBENCH_MODELS (os.pathsep
    separated; `workbench onboard` writes there when it is set). A later folder's card replaces an earlier one of
    the same name."""
    extra = [Path(p) for p in os.environ.get("WORKBENCH_MODELS", "").split(os.pathsep) if p]
    return [CARDS_DIR, *extra]


def list_models() -> list[ModelCard]:
    cards = {card.name: card for folder in card_dirs() for card in map(_load, sorted(folder.glob("*.yaml")))}
    return sorted(cards.values(), key=lambda c: c.name)


def get_model(name: str) -> ModelCard:
    cards = {card.name: card for card in list_models()}
    if name not in cards:
        raise UnknownModelError(f"unknown model '{name}' (known: {', '.join(sorted(cards))})")
    return cards[name]


def model_shapes(block: str) -> list[Shape]:
    """The ``model`` suite of a block: its shapes in every model card, without repeats."""
    shapes: list[Shape] = []
    for card in list_models():
        shapes += [s for s in card.block_shapes(block) if s not in shapes]
    return shapes
