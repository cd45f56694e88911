"""The block catalog: one module per architecture block, registered here by name."""

from __future__ import annotations

from workbench.blocks import (
    attnres,
    dsa_indexer,
    dsa_sparse_attention,
    kda,
    lora_linear,
    moe_combine,
    moe_grouped_gemm,
    moe_permute,
    moe_router,
    rmsnorm,
    seq_chunked_ce,
    situ,
    swiglu,
    vocab_blockwise_ce,
)
from workbench.blocks.base import BlockSpec
from workbench.errors import UnknownBlockError

REGISTRY: dict[str, BlockSpec] = {spec.name: spec for spec in (
    rmsnorm.SPEC, swiglu.SPEC, situ.SPEC, attnres.SPEC, seq_chunked_ce.SPEC, vocab_blockwise_ce.SPEC, lora_linear.SPEC,
    dsa_indexer.SPEC, kda.SPEC, moe_router.SPEC, moe_permute.SPEC, moe_grouped_gemm.SPEC, moe_combine.SPEC,
    dsa_sparse_attention.SPEC)}


def get_block(name: str) -> BlockSpec:
    """The spec registered under ``name``; UnknownBlockError (one line, with the known names) otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownBlockError(f"unknown block '{name}' (known: {', '.join(sorted(REGISTRY))})") from None
