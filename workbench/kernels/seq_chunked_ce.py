"""workbench::seq_chunked_ce(h, W, y, ignore_index, reduction) -> loss: linear cross-entropy (h @ W^T against y) that
never holds the [N, V] logits, as workbench/blocks/seq_chunked_ce.py defines it, backed by the newest promoted
seq_chunked_ce operator; gradients for h and W. The loss is 0-dim float32 (float64 for float64 inputs)."""

from workbench.kernels._ops import BlockOp, linear_ce_fake

seq_chunked_ce = BlockOp("seq_chunked_ce", fake=linear_ce_fake)
