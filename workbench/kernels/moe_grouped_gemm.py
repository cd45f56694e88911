"""workbench::moe_grouped_gemm(x, offsets, w1, w3, w2, activation, beta, linear_beta) -> y: every expert's gated MLP
over its rows of the permuted tokens, as workbench/blocks/moe_grouped_gemm.py defines it, backed by the newest
promoted moe_grouped_gemm operator; gradients for x, w1, w3 and w2."""

from workbench.kernels._ops import BlockOp


def fake(x, offsets, w1, w3, w2, activation, beta, linear_beta):
    """y [M, D] in x's dtype (one row per row of x)."""
    return x.new_empty(x.shape[0], w2.shape[1])


moe_grouped_gemm = BlockOp("moe_grouped_gemm", fake=fake)
