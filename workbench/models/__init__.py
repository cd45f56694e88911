"""Model cards: which blocks a model needs, at which sizes, and which of its numbers are public or assumed."""

from __future__ import annotations

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


def list_models() -> list[ModelCard]:
    return [_load(p) for p in sorted(CARDS_DIR.glob("*.yaml"))]


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
