"""workbench::kda_short_conv(x, weight) -> y: causal depthwise conv1d (W taps per channel) + SiLU on KDA's q, k, v;
float32 math, as workbench/blocks/kda_short_conv.py defines it, backed by the newest promoted kda_short_conv
operator; gradients for x, weight."""

from workbench.kernels._ops import BlockOp

kda_short_conv = BlockOp("kda_short_conv")
