"""workbench::kda(q, k, v, g, beta, scale, initial_state) -> o, final_state: Kimi Delta Attention: per-channel gated
delta rule, recurrent ground truth, GVA, optional initial state, as workbench/blocks/kda.py defines it, backed by
the newest promoted kda operator; gradients for q, k, v, g, beta, initial_state."""

from workbench.kernels._ops import BlockOp

kda = BlockOp("kda")
