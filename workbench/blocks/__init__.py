"""The block catalog: one module per architecture block, each with a ``SPEC`` (workbench.blocks.base.BlockSpec),
found here by walking this package: adding a block is adding its module. Modules whose names start with ``_`` hold
shared helpers and are not blocks."""

from __future__ import annotations

import importlib
import pkgutil

from workbench.blocks.base import FAMILIES, BlockSpec
from workbench.errors import UnknownBlockError

REPLAY_PARTS = ("", "layer", "moe", "shared_expert", "loss", "K", "D", "M")
"""The parts of the replay model a block can be called in (``BlockSpec.replay``)."""


def _discover() -> dict[str, BlockSpec]:
    specs = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "base":
            continue
        spec = getattr(importlib.import_module(f"{__name__}.{info.name}"), "SPEC", None)
        if not isinstance(spec, BlockSpec) or spec.name != info.name:
            raise ImportError(f"workbench/blocks/{info.name}.py must define SPEC = BlockSpec(name='{info.name}', ...)")
        if spec.family not in FAMILIES or spec.replay not in REPLAY_PARTS:
            raise ImportError(f"workbench/blocks/{info.name}.py: family {spec.family!r} is not one of {FAMILIES}, or "
                              f"replay {spec.replay!r} not one of {REPLAY_PARTS}")
        specs[spec.name] = spec
    return specs


REGISTRY: dict[str, BlockSpec] = _discover()


def get_block(name: str) -> BlockSpec:
    """The spec registered under ``name``; UnknownBlockError (one line, with the known names) otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownBlockError(f"unknown block '{name}' (known: {', '.join(sorted(REGISTRY))})") from None
