"""moe_grouped_gemm: the routed experts' gated MLPs over contiguous row groups (Megatron-LM GroupedMLP; vLLM
fused_moe without the routing), with SwiGLU or Kimi K3's SiTU as the activation.

For each expert e, on its rows r in [offsets[e], offsets[e+1]) of the expert-major activations x:

    a = x[r] @ w1[e]^T,   b = x[r] @ w3[e]^T            # gate and up projections, [rows_e, F]
    y[r] = act(a, b) @ w2[e]^T                           # down projection, [rows_e, D]
    act = silu(a) * b                                                     (activation "swiglu")
    act = swiglu(a, b, limit, alpha, up_offset)        (activation "swiglu" with the swiglu block's clamped or alpha
                                                        variant: GLM-5-Next's, DeepSeek-V4's, HY-V4's experts clamp)
    act = beta tanh(a / beta) sigmoid(a) * linear_beta tanh(b / linear_beta)   (activation "situ": the situ block's)

computed in float32 (float64 for float64 inputs) and cast to x.dtype once. Rows past offsets[E] (the tail of
dropped slots from moe_permute) are not any expert's: y is 0 there and so is their gradient.

Shapes: x [M, D] (M = N*k rows, expert-major), offsets [E + 1] int64 (offsets[0] = 0, non-decreasing,
offsets[E] <= M), w1 and w3 [E, F, D], w2 [E, D, F], y [M, D]; activation "swiglu" or "situ", beta and
linear_beta SiTU's soft caps (4.0 and 25.0 in Kimi K3; unused by SwiGLU), limit (None: no clamp), alpha and
up_offset SwiGLU's variant (the shape dims ``limit`` and ``alpha_milli``, as the swiglu block's; SiTU takes none).
Gradients: x, w1, w3, w2.
Routing comes from workbench.blocks._moe.routing_ids: Zipf-skewed group sizes with empty experts, optionally one
hot expert (with k = 1 every row is in one group) and capacity drops (a tail of rows outside every group).
Magnitudes: vLLM's tests draw x and the weights as randn / 10, which at their hidden sizes (up to a few thousand)
makes the projections O(0.1-1); at our interpreter sizes (D, F of 16-64) the same scaling would leave y near 1e-3,
where the tolerance's absolute floor hides real errors. So the draws keep that intent at any size: x ~ N(0, 1),
w1, w3 ~ N(0, 1/D), w2 ~ N(0, 1/F) (a, b and y all O(1), far from float16 overflow). SiTU shapes (``act: 1``) draw
w1 ~ N(0, 9/D) and w3 ~ N(0, 225/D), so that a reaches past the gate's cap (|a| > 4 for about 18% of entries) and
b past the up cap (|b| > 25 for about 10%), where SiTU leaves SwiGLU and its gradients flatten. Clamped shapes draw
w1, w3 ~ N(0, 9/D), so that about one a in 6 and one b in 3 lie past a limit of 3.
"""

from __future__ import annotations

import math
import random

import torch

from workbench.blocks import situ, swiglu
from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._moe import draw_routing_shape, permutation, routing_ids
from workbench.blocks._rows import GATED_ACTIVATIONS
from workbench.blocks.base import BF16, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype

ACTIVATIONS = ("swiglu", "situ")
"""The experts' activations, by the shape dimension ``act`` (0, 1)."""


def reference(x: torch.Tensor, offsets: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor,
              activation: str, beta: float, linear_beta: float, limit: float | None = None, alpha: float = 1.0,
              up_offset: float = 0.0) -> torch.Tensor:
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation '{activation}' (one of {', '.join(ACTIVATIONS)})")
    if activation == "situ" and (limit, alpha, up_offset) != (None, 1.0, 0.0):
        raise ValueError("limit, alpha and up_offset are SwiGLU's variants: SiTU takes none")
    ct = compute_dtype(x)
    bounds = offsets.tolist()
    parts = []
    for e in range(w1.shape[0]):
        xe = x[bounds[e]:bounds[e + 1]].to(ct)
        a, b = xe @ w1[e].to(ct).T, xe @ w3[e].to(ct).T
        h = swiglu.reference(a, b, limit, alpha, up_offset) if activation == "swiglu" else \
            situ.reference(torch.cat([a, b], dim=-1), beta, linear_beta)
        parts.append(h @ w2[e].to(ct).T)
    parts.append(x[bounds[-1]:].to(ct) * 0)  # tail rows of dropped slots: no expert, zero output and gradient
    return torch.cat(parts).to(x.dtype)


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """make_inputs' shapes and dtypes on the meta device (its routing is data-dependent)."""
    n, k, d, f, e = shape["N"], shape["k"], shape["D"], shape["F"], shape["E"]
    meta = {"device": "meta"}
    return {"x": torch.empty(n * k, d, dtype=dtype, **meta), "offsets": torch.empty(e + 1, dtype=torch.int64, **meta),
            "w1": torch.empty(e, f, d, dtype=dtype, **meta), "w3": torch.empty(e, f, d, dtype=dtype, **meta),
            "w2": torch.empty(e, d, f, dtype=dtype, **meta), **_activation(shape)}


def _activation(shape: Shape) -> dict:
    return {"activation": ACTIVATIONS[shape.get("act", 0)], "beta": situ.BETA, "linear_beta": situ.LINEAR_BETA,
            **swiglu.variant(shape)}


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [N*k, D] ~ N(0, 1) (the tail rows too: a kernel must not touch them); offsets of routing_ids(N, E, k);
    w1, w3 [E, F, D] ~ N(0, 1/D) (SiTU: 9/D and 225/D); w2 [E, D, F] ~ N(0, 1/F); the activation by ``act``."""
    g = torch.Generator().manual_seed(seed)
    n, k, d, f, e = shape["N"], shape["k"], shape["D"], shape["F"], shape["E"]
    ids = routing_ids(n, e, k, g, hot=bool(shape["hot"]), drop=bool(shape["drop"]))
    offsets = permutation(ids, e)["offsets"]
    x = torch.randn(n * k, d, generator=g)
    reach = (3.0, 15.0) if shape.get("act", 0) else (3.0, 3.0) if shape.get("limit") else (1.0, 1.0)
    w1 = reach[0] * torch.randn(e, f, d, generator=g) / math.sqrt(d)
    w3 = reach[1] * torch.randn(e, f, d, generator=g) / math.sqrt(d)
    w2 = torch.randn(e, d, f, generator=g) / math.sqrt(f)
    return {"x": x.to(device, dtype), "offsets": offsets.to(device), "w1": w1.to(device, dtype),
            "w3": w3.to(device, dtype), "w2": w2.to(device, dtype), **_activation(shape)}


SHAPES = {
    "smoke": [
        {"N": 16, "k": 2, "D": 32, "F": 64, "E": 4, "hot": 0, "drop": 0, "act": 0},
        {"N": 12, "k": 4, "D": 64, "F": 32, "E": 8, "hot": 0, "drop": 0, "act": 1},
        {"N": 8, "k": 2, "D": 16, "F": 32, "E": 4, "hot": 0, "drop": 0, "act": 0, "limit": 3},
    ],
    # no rows, one row, every row in one group (k = 1), Zipf groups with drops on odd sizes, mostly empty experts;
    # SiTU on the odd sizes with drops and on the one hot expert; the alpha variant (GPT-OSS's) on the last
    "edge": [
        {"N": 0, "k": 2, "D": 16, "F": 32, "E": 4, "hot": 0, "drop": 0, "act": 0},
        {"N": 1, "k": 1, "D": 16, "F": 16, "E": 4, "hot": 0, "drop": 0, "act": 1},
        {"N": 24, "k": 1, "D": 24, "F": 40, "E": 8, "hot": 1, "drop": 0, "act": 1},
        {"N": 21, "k": 3, "D": 40, "F": 24, "E": 6, "hot": 0, "drop": 1, "act": 1},
        {"N": 3, "k": 2, "D": 16, "F": 48, "E": 12, "hot": 1, "drop": 1, "act": 0, "limit": 3, "alpha_milli": 1702},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Three draws: routing sizes (k <= E <= 8, N <= 24), D and F in [16, 64], hot, drop and the activation each
    on or off; SwiGLU clamped at 1 to 10 half the time (the alpha form half of those)."""
    def variant(act: int) -> dict:
        if act or rng.random() < 0.5:
            return {"act": act}
        return {"act": 0, "limit": rng.randint(1, 10), "alpha_milli": rng.choice([0, rng.randint(1000, 2000)])}
    return [{"N": s["N"], "k": s["k"], "D": rng.randint(16, 64), "F": rng.randint(16, 64), "E": s["E"],
             "hot": rng.randint(0, 1), "drop": rng.randint(0, 1), **variant(rng.randint(0, 1))}
            for s in (draw_routing_shape(rng, n_max=24, e_max=8) for _ in range(3))]


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """Rows x [N k, D]; per expert w1, w3 [F, D], w2 [D, F]; the experts all routed to."""
    rows, d, f, e = s["N"] * s["k"], s["D"], s["F"], s["E"]
    weights = 3 * e * f * d
    flops = 6 * rows * d * f
    return Work(BF16 * (2 * rows * d + weights), flops), Work(BF16 * (3 * rows * d + 2 * weights), 2 * flops)


def abstract_outputs(x, offsets, w1, w3, w2, activation, beta, linear_beta, limit=None, alpha=1.0, up_offset=0.0):
    """y [M, D] in x's dtype (one row per row of x): the library op's fake implementation."""
    return x.new_empty(x.shape[0], w2.shape[1])


def onboard(model: ModelConfig) -> list[Found]:
    """Every MoE layer's routed experts, at their width (expert_width under latent MoE) and FFN size, with the
    config's hidden_act, at a training step's tokens and a decode step's (most experts then get no row or one); an
    activation the grouped GEMM does not compute is marked ``differs``; SwiGLU's swiglu_limit and swiglu_alpha are
    the shapes' ``limit`` and ``alpha_milli`` (as the swiglu block's)."""
    if not model.routed:
        return []
    act, act_field = model.field("hidden_act")
    activation = GATED_ACTIVATIONS.get(str(act).lower()) if act else "swiglu"
    known = activation in ACTIVATIONS
    differs = "" if known else f"the catalog's grouped GEMM computes {' or '.join(ACTIVATIONS)}; the config's " \
                               f"experts use {act} ({act_field})"
    limit, limit_field = model.field("swiglu_limit")
    alpha, alpha_field = model.field("swiglu_alpha")
    variant, unheld = swiglu.card_dims(limit, limit_field, alpha, alpha_field)
    if unheld and activation == "swiglu":
        differs = unheld
    shape = {"k": model.active, "D": model.expert_width or model.hidden, "F": model.expert_ffn, "E": model.experts,
             "hot": 0, "drop": 0, "act": ACTIVATIONS.index(activation) if known else 0,
             **(variant if activation == "swiglu" else {})}
    return [Found(f"per-expert gated FFN ({act or 'silu'}) over contiguous row groups", model.moe_layers,
                  [{"N": n, **shape} for n in model.step_tokens],
                  [model.experts_field, model.active_field, model.expert_ffn_field, model.expert_width_field,
                   act_field, limit_field if limit else None, alpha_field if alpha else None], differs=differs)]


SPEC = BlockSpec(
    name="moe_grouped_gemm",
    family="moe",
    summary="per-expert gated MLP (gate/up, SwiGLU (clamped, alpha) or SiTU, down) over expert-major row groups",
    reference=reference,
    make_inputs=make_inputs,
    abstract_inputs=abstract_inputs,
    grad_inputs=("x", "w1", "w3", "w2"),
    outputs=("y",),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    abstract_outputs=abstract_outputs,
    onboard=onboard,
    replay="moe",
)
