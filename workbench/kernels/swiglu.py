"""workbench::swiglu(a, b) -> y: silu(a) * b, float32 math, as workbench/blocks/swiglu.py defines it, backed by the
newest promoted swiglu operator; gradients for a, b."""

from workbench.kernels._ops import BlockOp

swiglu = BlockOp("swiglu")
