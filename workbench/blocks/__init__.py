"""The block catalog: one module per architecture block, registered here by name."""

from __future__ import annotations

from workbench.blocks import rmsnorm, swiglu
from workbench.blocks.base import BlockSpec
from workbench.errors import UnknownBlockError

REGISTRY: dict[str, BlockSpec] = {spec.name: spec for spec in (rmsnorm.SPEC, swiglu.SPEC)}


def get_block(name: str) -> BlockSpec:
    """The spec registered under ``name``; UnknownBlockError (one line, with the known names) otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownBlockError(f"unknown block '{name}' (known: {', '.join(sorted(REGISTRY))})") from None
