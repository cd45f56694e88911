"""workbench::dsa_sparse_attention(q, k, v, indices, gate, scale) -> out: DSA sparse attention over per-query selected
keys (GQA/MQA), optional sigmoid output gate, as workbench/blocks/dsa_sparse_attention.py defines it, backed by the
newest promoted dsa_sparse_attention operator; gradients for q, k, v, gate."""

from workbench.kernels._ops import BlockOp

dsa_sparse_attention = BlockOp("dsa_sparse_attention")
