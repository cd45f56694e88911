"""workbench::lora_linear(x, W, A, B, scaling) -> y: frozen linear + low-rank adapter x W^T + scaling * (x A^T) B^T;
gradients for x, A, B, as workbench/blocks/lora_linear.py defines it, backed by the newest promoted lora_linear
operator; gradients for x, A, B."""

from workbench.kernels._ops import BlockOp

lora_linear = BlockOp("lora_linear")
