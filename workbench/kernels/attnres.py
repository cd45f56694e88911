"""workbench::attnres(sources, query, key_weight, out_weight, eps, scale, normalized_values=False) -> h, p:
softmax-over-depth mixing of residual sources (raw, or RMS-normalised with normalized_values) with RMSNorm keys,
optional fused output RMSNorm, as workbench/blocks/attnres.py defines it, backed by the newest promoted attnres
operator; gradients for sources, query, key_weight, out_weight."""

from workbench.kernels._ops import BlockOp

attnres = BlockOp("attnres")
