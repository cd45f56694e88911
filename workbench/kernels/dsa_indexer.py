"""workbench::dsa_indexer(q_idx, k_idx, w, topk) -> scores, indices: DSA lightning indexer: relu-weighted multi-head
index scores, causal top-k selection, as workbench/blocks/dsa_indexer.py defines it, backed by the newest promoted
dsa_indexer operator; gradients for q_idx, k_idx, w."""

from workbench.kernels._ops import BlockOp

dsa_indexer = BlockOp("dsa_indexer")
