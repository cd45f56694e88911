"""situ: the gated SiTU activation of Kimi K3's experts and dense layers (hidden_act "situ"), over the concatenated
gate and up projections:

    gate, up = gate_up[..., :N], gate_up[..., N:]
    g = beta * tanh(gate / beta) * sigmoid(gate)        (beta 4.0: activation_situ_beta)
    u = linear_beta * tanh(up / linear_beta)            (linear_beta 25.0: activation_situ_linear_beta)
    y = g * u

computed in float32 (float64 for float64 inputs) and cast to the input dtype once. The tanh soft caps bound the
gate branch by beta and the up branch by linear_beta; inputs are drawn wide (gate ~ N(0, 36), up ~ N(0, 400), a few
values far past both caps) so the saturated tails, where a careless tanh overflows or loses its sign, are tested.

Shapes: gate_up [rows, 2N] (gate first), y [rows, N]. Gradient: gate_up (both halves):
    d gate = dy * u * ((1 - tanh(gate / beta)^2) * sigmoid(gate) + beta * tanh(gate / beta) * s * (1 - s))
    d up   = dy * g * (1 - tanh(up / linear_beta)^2)
"""

from __future__ import annotations

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._rows import ROW_SUITES, gated_activation_found, gated_activation_work
from workbench.blocks.base import BlockSpec, Shape
from workbench.numerics import compute_dtype

BETA = 4.0  # Kimi K3's activation_situ_beta
LINEAR_BETA = 25.0  # Kimi K3's activation_situ_linear_beta


def reference(gate_up: torch.Tensor, beta: float, linear_beta: float) -> torch.Tensor:
    ct = compute_dtype(gate_up)
    gate, up = gate_up.to(ct).chunk(2, dim=-1)
    g = beta * torch.tanh(gate / beta) * torch.sigmoid(gate)
    u = linear_beta * torch.tanh(up / linear_beta)
    return (g * u).to(gate_up.dtype)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """gate_up [rows, 2N]: gate ~ N(0, 36), up ~ N(0, 400), and about one element in 16 of each half 10x wider
    (drawn, not at fixed places: a one-element case must not saturate for every seed, or all seeds agree)."""
    g = torch.Generator().manual_seed(seed)
    rows, n = shape["rows"], shape["N"]
    gate = 6 * torch.randn(rows, n, generator=g)
    up = 20 * torch.randn(rows, n, generator=g)
    gate = torch.where(torch.rand(rows, n, generator=g) < 1 / 16, 10 * gate, gate)
    up = torch.where(torch.rand(rows, n, generator=g) < 1 / 16, 10 * up, up)
    gate_up = torch.cat([gate, up], dim=-1)
    return {"gate_up": gate_up.to(device, dtype), "beta": BETA, "linear_beta": LINEAR_BETA}


def onboard(model: ModelConfig) -> list[Found]:
    """The shared experts' and the dense layers' activation when hidden_act is situ, with its two constants."""
    beta, beta_field = model.field("activation_situ_beta")
    linear_beta, linear_beta_field = model.field("activation_situ_linear_beta")
    return gated_activation_found(model, "situ", f"SiTU activation (beta {beta}, linear beta {linear_beta}) of the "
                                  "{where}", (beta_field, linear_beta_field))


SPEC = BlockSpec(
    name="situ",
    family="activation",
    summary="beta*tanh(g/beta)*sigmoid(g) * lb*tanh(u/lb) over [gate | up], float32 math",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("gate_up",),
    outputs=("y",),
    shapes=ROW_SUITES,
    work=gated_activation_work,
    onboard=onboard,
    replay="shared_expert",
)
