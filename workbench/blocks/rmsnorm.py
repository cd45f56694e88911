"""rmsnorm: root-mean-square normalization with a learned weight (DeepSeek / Kimi convention).

    y = weight * x / sqrt(mean(x^2, -1) + eps)

computed in float32 (float64 for float64 inputs) and cast to x.dtype once, at the end.

Shapes: x [..., N], weight [N], y [..., N]. Gradients: x and weight.
Inputs carry "massive activations" (a few channels of magnitude 50-120, as real hidden states do), so a kernel that
accumulates x^2 in float16 overflows on wide rows, as it would on a real model.
"""

from __future__ import annotations

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._rows import ROW_SUITES
from workbench.blocks.base import BF16, F32, BlockSpec, Peer, Shape, Work
from workbench.numerics import compute_dtype


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    ct = compute_dtype(x)
    xf = x.to(ct)
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (y * weight.to(ct)).to(x.dtype)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [rows, N] ~ N(0, 1) with N // 64 outlier channels (at least one) of magnitude 50-120;
    weight [N] ~ 1 + N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    rows, n = shape["rows"], shape["N"]
    x = torch.randn(rows, n, generator=g)
    outliers = torch.randperm(n, generator=g)[: max(1, n // 64)]
    x[:, outliers] = x[:, outliers].sign() * (50 + 70 * torch.rand(rows, len(outliers), generator=g))
    weight = 1 + 0.1 * torch.randn(n, generator=g)
    return {"x": x.to(device, dtype), "weight": weight.to(device, dtype), "eps": 1e-6}


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    rows, n = s["rows"], s["N"]
    return Work(BF16 * (2 * rows * n + n) + F32 * rows), Work(BF16 * (3 * rows * n + 2 * n) + F32 * rows)


def liger_rmsnorm(x, weight, eps):
    """Liger-Kernel's RMSNorm, with the reference's signature."""
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    return LigerRMSNormFunction.apply(x, weight, eps)


def onboard(model: ModelConfig) -> list[Found]:
    """Every layer's pre-norms and the final norm at the hidden size, and the norms at other widths: MLA's q and kv
    latents, the latent MoE's combined routed output (latent_moe_use_norm: before the up projection). KDA's per-head
    output norm is gated (rmsnorm_gated)."""
    widths: list[tuple[int, str | None]] = [(model.hidden, model.hidden_field)]
    for name in ("q_lora_rank", "kv_lora_rank", "routed_expert_hidden_size"):
        value, field = model.integer(name)
        if value and (name != "routed_expert_hidden_size" or model.field("latent_moe_use_norm")[0]):
            widths.append((value, field))
    return [Found("pre-norms, final norm, the latent norms", model.layers,
                  [{"rows": model.tokens, "N": w} for w, _ in dict.fromkeys(widths)], [f for _, f in widths])]


SPEC = BlockSpec(
    name="rmsnorm",
    family="norm",
    summary="RMSNorm with weight, float32 math, one downcast",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x", "weight"),
    outputs=("y",),
    shapes=ROW_SUITES,
    host_ops=("aten.sum",),  # the weight gradient: a deterministic sum of per-program partials
    work=work,
    peers=(Peer("liger", "liger_kernel", liger_rmsnorm),),
    onboard=onboard,
    replay="layer",
)
