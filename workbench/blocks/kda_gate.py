"""kda_gate: KDA's decay (forget) gate, in its two published forms, a log decay per key channel, from the gate
projection f of each token (low rank in Kimi K3 and Kimi Linear: f = f_b_proj(f_a_proj(x)), rank head_dim; K3's
``use_full_rank_gate`` makes the output gate full rank, not this one: vLLM ``kimi_k3/amd/kda.py``).

Bounded (``lower_bound`` a number; Kimi K3's ``gate_lower_bound`` -5.0, GLM-5-Next's ``Glm5NextTextForgetGate``, the
"safe gate" of fla's KDA):

    z = exp(A_log[h]) * (f[b, t, h, k] + dt_bias[h, k])
    g = lower_bound * sigmoid(z)                               g in (lower_bound, 0)

Softplus (``lower_bound`` None; Kimi Linear's ``KimiLinearForgetGate``, fla's default KDA gate), unbounded:

    x = f[b, t, h, k] + dt_bias[h, k]
    g = -exp(A_log[h]) * softplus(x),   softplus(x) = x where x > 20, else log(1 + exp(x))  (transformers' form)

computed in float32 (float64 for float64 inputs) and returned in float32 whatever the input dtype, as the delta
rule consumes it (``kda``'s g). With a bound no token can decay a channel by more than exp(lower_bound) per step.

Shapes: f [B, T, H, K] (the gate projection of each token), A_log [H], dt_bias [H, K], g [B, T, H, K]. Gradients:
f, A_log and dt_bias, d dt_bias[h, k] = sum_{b,t} df[b, t, h, k], and
    bounded:  u = dg * lower_bound * s * (1 - s), s = sigmoid(z):  df = u * exp(A_log[h]),  d A_log[h] = sum u * z
    softplus: df = -dg * exp(A_log[h]) * (1 where x > 20, else sigmoid(x)),  d A_log[h] = sum_{b,t,k} dg * g
"""

from __future__ import annotations

import random

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, F32, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype

LOWER_BOUND = -5.0  # Kimi K3's gate_lower_bound
SOFTPLUS_THRESHOLD = 20.0  # softplus(x) = x above it, as KimiLinearForgetGate computes it
FORMS = {0: LOWER_BOUND, 1: None}
"""Shape dim ``form``: 0 the bounded gate (lower bound -5), 1 the unbounded softplus gate."""


def reference(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None
              ) -> torch.Tensor:
    ct = compute_dtype(f)
    x = f.to(ct) + dt_bias.to(ct)
    decay = A_log.to(ct).exp()[:, None]
    if lower_bound is None:
        return -decay * torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log(1.0 + torch.exp(x)))
    return lower_bound * torch.sigmoid(decay * x)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """f ~ N(0, 4); A_log = log U(1, 16) per head (fla's initialisation); dt_bias ~ N(0, 1): z reaches both
    saturated ends of the sigmoid; in the softplus form a third of the tokens are shifted by +20 so that both
    branches of the threshold run."""
    g = torch.Generator().manual_seed(seed)
    b, t, h, k = shape["B"], shape["T"], shape["H"], shape["K"]
    f = 2 * torch.randn(b, t, h, k, generator=g)
    a_log = torch.log(1 + 15 * torch.rand(h, generator=g))
    dt_bias = torch.randn(h, k, generator=g)
    lower_bound = FORMS[shape.get("form", 0)]
    if lower_bound is None:
        f[:, ::3] += SOFTPLUS_THRESHOLD
    return {"f": f.to(device, dtype), "A_log": a_log.to(device, dtype), "dt_bias": dt_bias.to(device, dtype),
            "lower_bound": lower_bound}


SHAPES = {
    "smoke": [{"B": 1, "T": 16, "H": 2, "K": 32}, {"B": 2, "T": 9, "H": 3, "K": 16, "form": 1}],
    # one token, one channel, a head dim that is no power of two (Kimi Linear's 72), many heads of few tokens
    "edge": [
        {"B": 1, "T": 1, "H": 1, "K": 8},
        {"B": 1, "T": 5, "H": 2, "K": 1},
        {"B": 2, "T": 7, "H": 2, "K": 72},
        {"B": 1, "T": 3, "H": 9, "K": 20},
        {"B": 1, "T": 1, "H": 1, "K": 8, "form": 1},
        {"B": 2, "T": 7, "H": 2, "K": 72, "form": 1},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    return [{"B": rng.randint(1, 2), "T": rng.randint(1, 40), "H": rng.randint(1, 4), "K": rng.randint(2, 80),
             "form": rng.choice(list(FORMS))} for _ in range(2)]


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """F [B, T, H, K] bf16 -> g float32."""
    e = s["B"] * s["T"] * s["H"] * s["K"]
    return Work((BF16 + F32) * e), Work((2 * BF16 + F32) * e)


def onboard(model: ModelConfig) -> list[Found]:
    """Every KDA layer's forget gate: bounded with linear_attn_config.gate_lower_bound, else Kimi Linear's softplus
    form (``form`` 1)."""
    if not model.kda_layers:
        return []
    linear, at = model.linear, model.linear_field
    bound = linear.get("gate_lower_bound")
    fields = [f"{at}.gate_lower_bound"] if bound is not None else []
    shape = {"B": 1, "T": model.tokens, "H": model.kda_heads, "K": model.kda_head_dim}
    low_rank = f"from its low-rank projection f = f_b_proj(f_a_proj(x)) (rank {model.kda_head_dim})"
    if bound is None:
        return [Found(f"KDA's decay gate, -exp(A_log) softplus(f + dt_bias) (no lower bound), {low_rank}",
                      model.kda_layers, [{**shape, "form": 1}], fields or model.kda_fields[:1])]
    return [Found(f"KDA's decay gate, lower bound {bound}, {low_rank}", model.kda_layers, [shape], fields)]


SPEC = BlockSpec(
    name="kda_gate",
    family="linear_attention",
    summary="KDA's decay gate, bounded lower_bound * sigmoid(exp(A_log) (f + dt_bias)) or unbounded "
            "-exp(A_log) softplus(f + dt_bias), float32 out",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("f", "A_log", "dt_bias"),
    outputs=("g",),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    onboard=onboard,
    replay="K",
)
