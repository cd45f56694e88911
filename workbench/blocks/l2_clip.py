"""l2_clip: Inkling2's L2 clips of its attention's queries, keys and relative states (its ``Inkling2ScaledL2Clip``
and ``Inkling2L2Clip`` modules), with the full layers' logarithmic scaling of the queries and relative states folded
in, per head vector:

    u[b,t,h] = x[b,t,h] * scale[h]                             (no scale: u = x; Inkling2L2Clip, the keys)
    y[b,t,h] = u * min(1, threshold / (||u||_2 + 1e-6)) * tau[b,t]        (no tau: 1; the sliding layers, the keys)

A vector longer than ``threshold`` is scaled down to it, a shorter one is kept. Inkling2's full layers multiply the
clipped queries and relative states by tau = 1 + log_scaling_alpha * log(max((position + 1) / log_scaling_n_floor,
1)) in float32: here in the same launch, one rounding fewer in bfloat16 (the same in float32).

Shapes: x [B, T, H, D]; scale [H, D] or None; tau [B, T] or None; y [B, T, H, D] in x.dtype, float32 math (float64
for float64 inputs). Real sizes (Inkling2, the class defaults): queries 48 heads x 128 (threshold sqrt(512)), keys
8 x 128, relative states 48 x 16 (threshold 8). Gradients: x, scale and tau, with g = dy * tau, c = threshold /
(||u|| + 1e-6):
    du = g                                                   where c >= 1 (kept)
    du = c g - threshold / (||u|| + 1e-6)^2 * (u . g) / ||u|| * u      where c < 1 (clipped)
    dx = du * scale;  dscale[h] = sum_{b,t} du * x;  dtau[b,t] = sum_{h,d} dy * u * min(1, c)
Shape dims besides B, T, H, D: ``scale`` and ``tau`` (1: given). Inputs (make_inputs): rows of N(0, 1) scaled
log-uniformly over [1/4, 4] times the threshold's sqrt(D) (about half of them clipped) and one zero row; scale ~
U(0.5, 1.5); tau ~ U(1, 1.5).
"""

from __future__ import annotations

import math
import random

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.attention import SLIDING_KINDS
from workbench.blocks.base import BF16, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype

EPS = 1e-6
"""What Inkling2's clips add to the norm before dividing."""


def reference(x: torch.Tensor, scale: torch.Tensor | None, tau: torch.Tensor | None, threshold: float) -> torch.Tensor:
    ct = compute_dtype(x)
    u = x.to(ct) * scale.to(ct) if scale is not None else x.to(ct)
    y = u * (threshold / (torch.linalg.vector_norm(u, dim=-1, keepdim=True) + EPS)).clamp(max=1.0)
    if tau is not None:
        y = y * tau.to(ct)[..., None, None]
    return y.to(x.dtype)


# --- inputs ----------------------------------------------------------------------------------------------------


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [B,T,H,D] rows around the threshold sqrt(D) (half clipped) and a zero row; scale [H,D] ~ U(0.5, 1.5) and
    tau [B,T] ~ U(1, 1.5) where the shape's dims ask for them."""
    g = torch.Generator().manual_seed(seed)
    b, t, h, d = shape["B"], shape["T"], shape["H"], shape["D"]
    spread = torch.exp(math.log(4.0) * (2 * torch.rand(b, t, h, 1, generator=g) - 1))
    x = torch.randn(b, t, h, d, generator=g) * spread
    x.view(-1, d)[torch.randint(b * t * h, (1,), generator=g)] = 0.0
    scale = 0.5 + torch.rand(h, d, generator=g) if shape.get("scale") else None
    tau = 1.0 + 0.5 * torch.rand(b, t, generator=g) if shape.get("tau") else None
    return {"x": x.to(device, dtype), "scale": None if scale is None else scale.to(device, dtype),
            "tau": None if tau is None else tau.to(device, dtype), "threshold": float(d) ** 0.5}


# --- shapes ----------------------------------------------------------------------------------------------------

SHAPES = {
    # the full layers' scaled and log-scaled queries, the relative states (16 wide), the keys
    "smoke": [
        {"B": 1, "T": 16, "H": 4, "D": 64, "scale": 1, "tau": 1},
        {"B": 2, "T": 9, "H": 3, "D": 16, "scale": 1, "tau": 1},
        {"B": 2, "T": 12, "H": 2, "D": 128},
    ],
    # one token; one head; an odd width; wider than a power of two; a scale without tau (the sliding layers), tau
    # without a scale
    "edge": [
        {"B": 1, "T": 1, "H": 2, "D": 32, "scale": 1, "tau": 1},
        {"B": 3, "T": 5, "H": 1, "D": 24, "scale": 1},
        {"B": 1, "T": 7, "H": 5, "D": 130, "tau": 1},
        {"B": 2, "T": 3, "H": 3, "D": 9},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    return [{"B": rng.randint(1, 2), "T": rng.randint(1, 40), "H": rng.randint(1, 6),
             "D": rng.choice([8, 16, 24, 64, 100, 128]), "scale": rng.randint(0, 1), "tau": rng.randint(0, 1)}]


# --- work (the cost model) ---------------------------------------------------------------------------------


def work(s: Shape) -> tuple[Work, Work]:
    """Read x (and scale, tau), write y; the backward reads x and dy and writes dx (and the partials of dscale)."""
    e = s["B"] * s["T"] * s["H"] * s["D"]
    extra = s.get("scale", 0) * s["H"] * s["D"] + s.get("tau", 0) * s["B"] * s["T"]
    return Work(BF16 * (2 * e + extra), vector_flops=6 * e), Work(BF16 * (3 * e + 2 * extra), vector_flops=12 * e)


def onboard(model: ModelConfig) -> list[Found]:
    """Inkling2's attention layers (qk_l2_clip_threshold): the queries (scaled; log-scaled on the full layers),
    the keys, and the relative states (scaled, d_rel wide; log-scaled on the full layers), one shape each at the
    full layers' sizes (the sliding layers' queries at their own heads where the config gives them)."""
    threshold, field = model.field("qk_l2_clip_threshold")
    if threshold is None or not model.full_layers:
        return []
    heads, kv_heads = model.heads, model.integer("num_key_value_heads")[0] or model.heads
    head_dim = model.integer("head_dim")[0] or model.hidden // heads
    d_rel, rel_field = model.integer("d_rel")
    types, types_field = model.field("layer_types")
    sliding = sum(kind in SLIDING_KINDS for kind in (types if isinstance(types, list) else []))
    base = {"B": 1, "T": model.tokens}
    shapes = [{**base, "H": heads, "D": head_dim, "scale": 1, "tau": 1}, {**base, "H": kv_heads, "D": head_dim}]
    if d_rel:
        shapes.append({**base, "H": heads, "D": d_rel, "scale": 1, "tau": 1})
    return [Found(f"L2 clips of the attention's queries, keys{' and relative states' if d_rel else ''} (log scaling "
                  f"folded in on the full layers; {sliding} sliding layers without it)", model.full_layers, shapes,
                  [field, model.heads_field, rel_field, types_field])]


SPEC = BlockSpec(
    name="l2_clip",
    family="attention",
    summary="Inkling2's L2 clips of q, k and the relative states per head (a learnt scale, the full layers' log "
            "scaling folded in), one launch each way",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x", "scale", "tau"),
    outputs=("y",),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    onboard=onboard,
)
