"""workbench::rmsnorm(x, weight, eps) -> y: RMSNorm with weight, float32 math, one downcast, as
workbench/blocks/rmsnorm.py defines it, backed by the newest promoted rmsnorm operator; gradients for x, weight."""

from workbench.kernels._ops import BlockOp

rmsnorm = BlockOp("rmsnorm")
