"""kda_prologue: what a KDA (or gated DeltaNet) layer computes between its projections and the delta rule, per
token: q and k l2-normalised per head, and beta squashed by a sigmoid (fla's ``use_qk_l2norm_in_kernel`` and
``use_beta_sigmoid_in_kernel`` of chunk_kda, which run them as separate launches before the chunk kernels; here one
launch forward and one backward).

    q_n[b,t,h] = q[b,t,h] / sqrt(sum_k q[b,t,h,k]^2 + eps)      (fla's l2norm, transformers' torch path: eps 1e-6)
    k_n[b,t,h] = k[b,t,h] / sqrt(sum_k k[b,t,h,k]^2 + eps)
    beta[b,t,v] = sigmoid(beta_logits[b,t,v])

Shapes: q, k [B, T, H, K], beta_logits [B, T, HV]; outputs q_n, k_n [B, T, H, K] and beta [B, T, HV] in the inputs'
dtypes, computed in float32 (float64 for float64 inputs), one rounding each. Gradients: q, k, beta_logits,
    dx = r (dy - y (y . dy)) with r = (sum x^2 + eps)^-1/2, y = x r;   d beta_logits = d beta * s (1 - s).
transformers' layers take the sigmoid in the projection's dtype and the l2norm in float32 (Kimi Linear) or in the
activations' dtype (Qwen3-Next): the same in float32, one rounding fewer in bfloat16.

Inputs (make_inputs): q, k ~ N(0, 1) (the short convolution's SiLU outputs are O(1)), a few rows scaled by 1e-3 (the
eps matters there) and one row of zeros per tensor (its output 0, its gradient dy / sqrt(eps)); beta_logits ~ N(0, 2^2)
(both sigmoid tails).
"""

from __future__ import annotations

import random

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype

EPS = 1e-6
"""The l2norm's eps in fla and in transformers' KDA and gated DeltaNet layers."""


def l2norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, in the compute dtype."""
    x = x.to(compute_dtype(x))
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def reference(q: torch.Tensor, k: torch.Tensor, beta_logits: torch.Tensor, eps: float
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    beta = torch.sigmoid(beta_logits.to(compute_dtype(beta_logits)))
    return l2norm(q, eps).to(q.dtype), l2norm(k, eps).to(k.dtype), beta.to(beta_logits.dtype)


# --- inputs ----------------------------------------------------------------------------------------------------


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """q, k [B,T,H,K] ~ N(0, 1) with small rows and a zero row, beta_logits [B,T,HV] ~ N(0, 4), in ``dtype``; eps."""
    g = torch.Generator().manual_seed(seed)
    B, T, H, K, HV = shape["B"], shape["T"], shape["H"], shape["K"], shape["HV"]
    tensors = {}
    for name in ("q", "k"):
        x = torch.randn(B * T * H, K, generator=g)
        rows = x.shape[0]
        x[torch.randperm(rows, generator=g)[:max(1, rows // 8)]] *= 1e-3  # rows where eps is not negligible
        x[torch.randint(rows, (1,), generator=g)] = 0.0
        tensors[name] = x.view(B, T, H, K)
    tensors["beta_logits"] = 2.0 * torch.randn(B, T, HV, generator=g)
    return {**{n: x.to(device, dtype) for n, x in tensors.items()}, "eps": EPS}


# --- shapes ----------------------------------------------------------------------------------------------------

SHAPES = {
    "smoke": [
        {"B": 1, "T": 64, "H": 4, "K": 64, "HV": 4},
        {"B": 2, "T": 33, "H": 2, "K": 128, "HV": 4},
    ],
    # one token; an odd width and head count; more value heads than key heads (Qwen3-Next's GVA); a wide head
    "edge": [
        {"B": 1, "T": 1, "H": 1, "K": 16, "HV": 1},
        {"B": 2, "T": 17, "H": 3, "K": 40, "HV": 3},
        {"B": 1, "T": 29, "H": 2, "K": 32, "HV": 8},
        {"B": 1, "T": 9, "H": 1, "K": 256, "HV": 2},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    H = rng.randint(1, 4)
    return [{"B": rng.randint(1, 2), "T": rng.randint(1, 80), "H": H, "K": rng.choice([16, 24, 64, 128, 130]),
             "HV": H * rng.randint(1, 3)}]


# --- work (the cost model) ---------------------------------------------------------------------------------


def work(s: Shape) -> tuple[Work, Work]:
    """Read q, k, beta_logits and write their three outputs; the backward reads them again with three gradients."""
    qk = 2 * s["B"] * s["T"] * s["H"] * s["K"]
    beta = s["B"] * s["T"] * s["HV"]
    return Work(BF16 * 2 * (qk + beta), 3 * qk + 4 * beta), Work(BF16 * 3 * (qk + beta), 6 * qk + 3 * beta)


def onboard(model: ModelConfig) -> list[Found]:
    """Every KDA layer's q/k l2norm and beta sigmoid (one value head per key head in KDA)."""
    if not model.kda_layers:
        return []
    return [Found("KDA's prologue: q and k l2-normalised per head, beta's sigmoid", model.kda_layers,
                  [{"B": 1, "T": model.tokens, "H": model.kda_heads, "K": model.kda_head_dim, "HV": model.kda_heads}],
                  model.kda_fields[:2])]


SPEC = BlockSpec(
    name="kda_prologue",
    family="linear_attention",
    summary="KDA's prologue: q and k l2-normalised per head and beta's sigmoid, one launch",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("q", "k", "beta_logits"),
    outputs=("q_n", "k_n", "beta"),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    onboard=onboard,
    replay="K",
)
