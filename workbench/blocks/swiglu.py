"""swiglu: the gated activation of SwiGLU feed-forward layers (Shazeer 2020), with the published clamped and alpha
variants.

    g = min(a, limit),   u = clamp(b, -limit, limit) + up_offset        (no clamp where limit is None)
    y = g * sigmoid(alpha * g) * u

    plain SwiGLU          limit None, alpha 1, up_offset 0: y = silu(a) * b           (Llama, DeepSeek-V3, Kimi)
    clamped SwiGLU        limit L (swiglu_limit), alpha 1, up_offset 0                (GLM-5-Next, DeepSeek-V4, HY-V4)
    clamped alpha SwiGLU  limit L, alpha (swiglu_alpha), up_offset 1                  (GPT-OSS, MiniMax-M3)

computed in float32 (float64 for float64 inputs) and cast to a.dtype once. A clamp passes the gradient where its
input is within the bounds, bounds included (torch.clamp's rule): elsewhere the input's gradient is 0.

Shapes: a, b [..., N] (a: gate projection, b: up projection), y [..., N]; limit, alpha, up_offset Python floats.
Gradients: a and b. Shape dims besides rows and N: ``limit`` (an integer, 0: none) and ``alpha_milli`` (the alpha
form's alpha in thousandths, with up_offset 1; 0: the silu form). Gate pre-activations are drawn wide (N(0, 4)) so the
tails of sigmoid, where float16 exp overflows, are exercised; where a shape clamps, up too (N(0, 4)), so that about
one element in 8 of each lies past a limit of 3.
"""

from __future__ import annotations

import random
from dataclasses import replace

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._rows import ROW_SUITES, gated_activation_found, gated_activation_work
from workbench.blocks.base import BlockSpec, Peer, Shape
from workbench.numerics import compute_dtype


def reference(a: torch.Tensor, b: torch.Tensor, limit: float | None = None, alpha: float = 1.0,
              up_offset: float = 0.0) -> torch.Tensor:
    ct = compute_dtype(a)
    g, u = a.to(ct), b.to(ct)
    if limit is not None:
        g, u = g.clamp(max=limit), u.clamp(min=-limit, max=limit)
    return (g * torch.sigmoid(alpha * g) * (u + up_offset)).to(a.dtype)


def variant(shape: Shape) -> dict:
    """The variant's constants from a shape's ``limit`` and ``alpha_milli`` (absent or 0: plain SwiGLU)."""
    alpha = shape.get("alpha_milli", 0) / 1000
    return {"limit": float(shape["limit"]) if shape.get("limit") else None, "alpha": alpha or 1.0,
            "up_offset": 1.0 if alpha else 0.0}


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """a [rows, N] ~ N(0, 4), b [rows, N] ~ N(0, 1) (N(0, 4) where the shape clamps); the variant's constants."""
    g = torch.Generator().manual_seed(seed)
    rows, n = shape["rows"], shape["N"]
    a = 2 * torch.randn(rows, n, generator=g)
    b = (2 if shape.get("limit") else 1) * torch.randn(rows, n, generator=g)
    return {"a": a.to(device, dtype), "b": b.to(device, dtype), **variant(shape)}


CLAMPED, ALPHA = {"limit": 3}, {"limit": 3, "alpha_milli": 1702}
"""The variants the suites draw: GLM-5-Next's clamp and GPT-OSS's alpha form, at a limit of 3 (their 7 and 10 act
only on trained models' activations: at 3, one element in 8 of the inputs drawn here lies past it)."""
SUITES = {"smoke": [*ROW_SUITES["smoke"], {"rows": 4, "N": 64, **CLAMPED}, {"rows": 5, "N": 100, **ALPHA}],
          "edge": [*ROW_SUITES["edge"], {"rows": 1, "N": 1, **CLAMPED}, {"rows": 7, "N": 1000, **CLAMPED},
                   {"rows": 3, "N": 4097, **ALPHA}]}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Two shapes within the suites' ranges: plain SwiGLU, and a variant with a limit of 1 to 10 (the alpha form's
    alpha 1 to 2, or the silu form)."""
    def size() -> dict:
        return {"rows": rng.randint(1, 33), "N": rng.randint(1, 4097)}
    return [size(), {**size(), "limit": rng.randint(1, 10), "alpha_milli": rng.choice([0, rng.randint(1000, 2000)])}]


def liger_swiglu(a, b, limit=None, alpha=1.0, up_offset=0.0):
    """Liger-Kernel's SiLU-mul, with the reference's signature (plain SwiGLU only: Liger has no clamp)."""
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    if (limit, alpha, up_offset) != (None, 1.0, 0.0):
        raise ValueError("Liger-Kernel's SiLU-mul computes plain SwiGLU only (no limit, alpha 1, no up offset)")
    return LigerSiLUMulFunction.apply(a, b)


def onboard(model: ModelConfig) -> list[Found]:
    """The shared experts' and the dense layers' activation when hidden_act is silu (or swish), with the config's
    swiglu_limit and swiglu_alpha (the alpha form, up + 1) as the shapes' ``limit`` and ``alpha_milli``; a limit that
    is no whole number, or an alpha finer than a thousandth, is marked ``differs`` (the shapes cannot hold it)."""
    limit, limit_field = model.field("mlp_swiglu_limit", "swiglu_limit")  # the probe's, where it ran an MLP
    alpha, alpha_field = model.field("swiglu_alpha")
    dims, differs = card_dims(limit, limit_field, alpha, alpha_field)
    what = (f" clamped at {limit}" if limit is not None else "") + \
        (f", alpha {alpha} and up + 1" if alpha is not None else "")
    found = gated_activation_found(model, "swiglu", "gated {act} activation" + what + " of the {where}",
                                   tuple(f for f in (limit_field, alpha_field) if f))
    return [replace(f, shapes=[{**shape, **dims} for shape in f.shapes], differs=differs) for f in found]


def card_dims(limit: float | None, limit_field: str | None, alpha: float | None, alpha_field: str | None
              ) -> tuple[dict, str]:
    """A config's swiglu_limit and swiglu_alpha as the shape dims ``limit`` and ``alpha_milli`` (``variant``'s
    inverse), and what the dims cannot hold ("" when nothing: a limit that is no positive whole number, an alpha
    finer than a thousandth)."""
    dims, differs = {}, []
    if limit is not None:
        dims["limit"] = round(limit)
        if dims["limit"] != limit or limit <= 0:
            differs.append(f"swiglu_limit {limit} ({limit_field}): the card holds positive whole limits only")
    if alpha is not None:
        dims["alpha_milli"] = round(alpha * 1000)
        if dims["alpha_milli"] != alpha * 1000 or alpha <= 0:
            differs.append(f"swiglu_alpha {alpha} ({alpha_field}): the card holds positive thousandths only")
    return dims, "; ".join(differs)


SPEC = BlockSpec(
    name="swiglu",
    family="activation",
    summary="silu(a) * b, float32 math; the clamped (swiglu_limit) and alpha (swiglu_alpha, up + 1) variants",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("a", "b"),
    outputs=("y",),
    shapes=SUITES,
    hidden_shapes=hidden_shapes,
    work=gated_activation_work,
    peers=(Peer("liger", "liger_kernel", liger_swiglu),),
    onboard=onboard,
    replay="shared_expert",
)
