"""workbench::kda_gate(f, A_log, dt_bias, lower_bound) -> g: lower_bound * sigmoid(exp(A_log) * (f + dt_bias)): KDA's
bounded full-rank decay gate, float32 out, as workbench/blocks/kda_gate.py defines it, backed by the newest promoted
kda_gate operator; gradients for f, A_log, dt_bias."""

from workbench.kernels._ops import BlockOp

kda_gate = BlockOp("kda_gate")
