"""workbench::moe_combine(y, weights, row_of_slot) -> out: weighted per-token sum of its k expert-output rows, float32
accumulation, deterministic, as workbench/blocks/moe_combine.py defines it, backed by the newest promoted
moe_combine operator; gradients for y, weights."""

from workbench.kernels._ops import BlockOp

moe_combine = BlockOp("moe_combine")
