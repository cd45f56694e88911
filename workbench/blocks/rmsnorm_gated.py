"""rmsnorm_gated: the gated output norm of linear-attention layers, an RMSNorm with a learned weight whose output is
gated elementwise by an activation of a second input:

    y = x / sqrt(mean(x^2, -1) + eps) * weight * act(gate)
    act = sigmoid                                   (activation "sigmoid": Kimi Linear's and GLM-5-Next's KDA
                                                     output norm, Kimi K3's; vLLM's FusedRMSNormGated(activation=
                                                     "sigmoid"))
    act = silu, gate * sigmoid(gate)                (activation "silu": Qwen3-Next's Gated DeltaNet output norm)

computed in float32 (float64 for float64 inputs) and cast to x.dtype once, at the end. The weight is the plain
multiplier (initialised to ones), not zero-centred.

Shapes: x, gate [rows, N] (per-head rows: tokens x heads, N the head size; any leading dims work alike), weight
[N], y [rows, N]; activation "sigmoid" or "silu". Gradients: x, weight and gate. With r = 1 / sqrt(mean(x^2) + eps),
xhat = x r, s = act(gate) and the upstream gradient dy:
    d gate   = dy * xhat * weight * act'(gate)     sigmoid' = s (1 - s); silu' = sigma (1 + gate (1 - sigma))
    d weight = sum over rows of dy * s * xhat
    d x      = r * (weight dy s - xhat * mean(xhat * weight dy s, -1))    (RMSNorm's backward of dy * s)
Inputs: x ~ N(0, 1) with one outlier channel in 32 of magnitude 8-40, as linear-attention outputs carry (at the
edge suite's 4097 columns their squares sum past float16's 65504: a kernel that accumulates x^2 in float16
overflows); gate ~ N(0, 16) with about one element in 16 four times wider, so
the sigmoid reaches its saturated tails on both sides (|gate| up to about 50), where a careless exp overflows.
"""

from __future__ import annotations

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, F32, BlockSpec, Peer, Shape, Work
from workbench.numerics import compute_dtype

ACTIVATIONS = ("sigmoid", "silu")
"""The gate's activations, by the shape dimension ``act`` (0, 1)."""
EPS = 1e-5  # Kimi Linear's and Kimi K3's rms_norm_eps, which their KDA output norm takes


def reference(x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, eps: float, activation: str) -> torch.Tensor:
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation '{activation}' (one of {', '.join(ACTIVATIONS)})")
    ct = compute_dtype(x)
    xf, gf = x.to(ct), gate.to(ct)
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(ct)
    act = torch.sigmoid(gf) if activation == "sigmoid" else torch.nn.functional.silu(gf)
    return (normed * act).to(x.dtype)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [rows, N] ~ N(0, 1) with N // 32 outlier channels (at least one) of magnitude 8-40; gate [rows, N] ~ N(0, 16)
    with about one element in 16 four times wider (drawn, not at fixed places); weight [N] ~ 1 + N(0, 0.1); the
    activation by ``act``."""
    g = torch.Generator().manual_seed(seed)
    rows, n = shape["rows"], shape["N"]
    x = torch.randn(rows, n, generator=g)
    outliers = torch.randperm(n, generator=g)[: max(1, n // 32)]
    x[:, outliers] = x[:, outliers].sign() * (8 + 32 * torch.rand(rows, len(outliers), generator=g))
    gate = 4 * torch.randn(rows, n, generator=g)
    gate = torch.where(torch.rand(rows, n, generator=g) < 1 / 16, 4 * gate, gate)
    weight = 1 + 0.1 * torch.randn(n, generator=g)
    return {"x": x.to(device, dtype), "weight": weight.to(device, dtype), "gate": gate.to(device, dtype), "eps": EPS,
            "activation": ACTIVATIONS[shape["act"]]}


SHAPES = {
    "smoke": [{"rows": 4, "N": 64, "act": 0}, {"rows": 16, "N": 128, "act": 1}],
    # a single element, a single row, a head size that is no power of two (96, Qwen's 3 x 32 style), odd widths, a
    # width just past a power of two, odd row counts; each activation on odd sizes
    "edge": [
        {"rows": 1, "N": 1, "act": 1},
        {"rows": 1, "N": 123, "act": 0},
        {"rows": 33, "N": 96, "act": 1},
        {"rows": 7, "N": 1000, "act": 0},
        {"rows": 3, "N": 4097, "act": 1},
    ],
}


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """Forward: x and gate read, y written, rstd kept (float32 per row). Backward: dy, x and gate read, dx and d gate
    written, the weight read and its gradient written."""
    rows, n = s["rows"], s["N"]
    return Work(BF16 * (3 * rows * n + n) + F32 * rows), Work(BF16 * (5 * rows * n + 2 * n) + F32 * rows)


def fla_rms_norm_gated(x, weight, gate, eps, activation):
    """fla's fused gated RMSNorm (fla.modules.fused_norm_gate.rms_norm_gated, what FusedRMSNormGated calls; no bias,
    no residual), with the reference's signature."""
    from fla.modules.fused_norm_gate import rms_norm_gated

    return rms_norm_gated(x, gate, weight, None, activation, eps=eps)


def onboard(model: ModelConfig) -> list[Found]:
    """Every KDA layer's per-head output norm, rmsnorm(o) * sigmoid(gate): rows = tokens x KDA heads, N = the KDA
    head size."""
    if not model.kda_layers:
        return []
    return [Found("KDA's per-head output norm, rmsnorm(o) * sigmoid(gate)", model.kda_layers,
                  [{"rows": model.tokens * model.kda_heads, "N": model.kda_head_dim, "act": 0}], model.kda_fields)]


SPEC = BlockSpec(
    name="rmsnorm_gated",
    family="norm",
    summary="RMSNorm with weight, gated by sigmoid(gate) or silu(gate), float32 math, one downcast",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x", "weight", "gate"),
    outputs=("y",),
    shapes=SHAPES,
    work=work,
    peers=(Peer("fla rms_norm_gated", "fla", fla_rms_norm_gated),),
    onboard=onboard,
    replay="K",
)
