"""workbench::kda_gate(f, A_log, dt_bias, lower_bound) -> g: KDA's full-rank decay gate, bounded
(lower_bound * sigmoid(exp(A_log) * (f + dt_bias))) or, with lower_bound None, unbounded (-exp(A_log) *
softplus(f + dt_bias)), float32 out, as workbench/blocks/kda_gate.py defines it, backed by the newest promoted
kda_gate operator; gradients for f, A_log, dt_bias."""

from workbench.kernels._ops import BlockOp

kda_gate = BlockOp("kda_gate")
