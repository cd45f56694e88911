"""workbench::vocab_blockwise_ce(h, W, y, ignore_index, reduction) -> loss: linear cross-entropy (h @ W^T against y)
over vocabulary blocks, never holding the [N, V] logits, as workbench/blocks/vocab_blockwise_ce.py defines it, backed
by the newest promoted vocab_blockwise_ce operator; gradients for h and W. The loss is 0-dim float32 (float64 for
float64 inputs)."""

from workbench.kernels._ops import BlockOp, linear_ce_fake

vocab_blockwise_ce = BlockOp("vocab_blockwise_ce", fake=linear_ce_fake)
