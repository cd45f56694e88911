"""workbench::situ(gate_up, beta, linear_beta) -> y: beta*tanh(g/beta)*sigmoid(g) * lb*tanh(u/lb) over [gate | up],
float32 math, as workbench/blocks/situ.py defines it, backed by the newest promoted situ operator; gradients for
gate_up."""

from workbench.kernels._ops import BlockOp

situ = BlockOp("situ")
