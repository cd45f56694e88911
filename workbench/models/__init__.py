"""Model cards: which blocks a model needs, at which sizes, and which of its numbers are public or assumed.

A card is a YAML file (``workbench onboard`` writes one from a model's config.json). A card with ``derived_from:
<name>`` is that card with its own ``facts`` and ``blocks`` laid over it (a block set to null is dropped) and
``differs``: what the derived model changes; its own blocks are marked ``differs_from: <base>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from workbench.blocks.base import Shape
from workbench.config import Settings
from workbench.errors import UnknownModelError, WorkbenchError, one_line
from workbench.resources import cards_dir

CARDS_DIR = cards_dir()
DEFAULT_MODEL = "kimi-k3.1-pro"  # the card the main job ports (`make port`) and the dashboard opens on


@dataclass(frozen=True)
class ModelCard:
    name: str
    title: str
    facts: dict[str, dict[str, Any]]
    blocks: dict[str, dict[str, Any]]
    targets: list[str] | None = None  # the GPU targets its kernels must compile for (None: the defaults)
    derived_from: str | None = None  # the card this one is laid over
    differs: str = ""  # what it changes from that card
    onboarded_from: dict[str, Any] | None = None  # the config it came from: {file, model_type, class} (not inherited)
    transformers: dict[str, Any] | None = None  # its config as the transformers class reads it (onboarding)
    weights: dict[str, Any] | None = None  # parameters and bytes by part (workbench.weights.summary; inherited)

    def block_shapes(self, block: str) -> list[Shape]:
        return [dict(s) for s in self.blocks.get(block, {}).get("shapes", [])]


def _read(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or \
                not isinstance(data.get("blocks"), dict):
            raise ValueError("needs a name and a blocks mapping")
        return data
    except (yaml.YAMLError, ValueError) as exc:
        raise WorkbenchError(f"model card {path.name} is malformed: {one_line(exc)}") from None


def _card(data: dict, found: dict[str, dict], seen: tuple[str, ...] = ()) -> ModelCard:
    """The card of ``data``, laid over its base card (from ``found``, by name) when it is derived."""
    name = data["name"]
    try:
        facts, blocks, weights = dict(data.get("facts") or {}), dict(data["blocks"]), data.get("weights")
        base_name = data.get("derived_from")
        if base_name:
            if base_name in seen or base_name == name:
                raise ValueError(f"derived_from makes a cycle: {' -> '.join((*seen, name, base_name))}")
            if base_name not in found:
                raise ValueError(f"derived_from names an unknown card '{base_name}'")
            base = _card(found[base_name], found, (*seen, name))
            dropped = {b for b, info in blocks.items() if info is None}
            own = {b: {**info, "differs_from": base_name} for b, info in blocks.items() if info is not None}
            blocks = {b: info for b, info in {**base.blocks, **own}.items() if b not in dropped}
            facts = {**base.facts, **facts}
            weights = weights or base.weights
        return ModelCard(name=name, title=data.get("title", name), facts=facts, blocks=blocks,
                         targets=list(data["targets"]) if data.get("targets") is not None else None,
                         derived_from=base_name, differs=str(data.get("differs", "")),
                         onboarded_from=data.get("onboarded_from"), transformers=data.get("transformers"),
                         weights=weights)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WorkbenchError(f"model card {name} is malformed: {one_line(exc)}") from None


def card_dirs() -> list[Path]:
    """Where model cards are found: the workbench's own, then each folder of $WORKBENCH_MODELS (os.pathsep
    separated; `workbench onboard` writes there when it is set). A later folder's card replaces an earlier one of
    the same name."""
    return [CARDS_DIR, *Settings.load().model_dirs]


def list_models() -> list[ModelCard]:
    found = {data["name"]: data for folder in card_dirs() for data in map(_read, sorted(folder.glob("*.yaml")))}
    return [_card(data, found) for _, data in sorted(found.items())]


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
