"""kda_short_conv: KDA's input path, the causal depthwise short convolution with SiLU that Kimi Linear and Kimi K3
run on q, k and v before the delta rule (fla's ``ShortConvolution(D, kernel_size=4, bias=False,
activation="silu")``, the semantics of Tri Dao's ``causal_conv1d_fn`` in the [B, T, D] layout), and the published
residual variants and Inkling2's dynamic one (per-token taps):

    pre[b, t, d] = sum_{i < W} (weight[d, i] + taps[b, t, d // P, i]) * x[b, t - (W - 1) + i, d]
                                                (x = 0 before t = 0; no taps term where taps is None)
    a = silu(pre) = pre * sigmoid(pre)          (silu False: a = pre)
    y = a                                       (residual_scale None)
    y = (a + x) * residual_scale                (a residual short convolution)

    KDA (Kimi Linear, Kimi K3, Qwen3-Next)      silu, no residual
    Inkling's ShortConvolution                  no activation, residual_scale 1
    Inkling2's ShortConvolution                 no activation, residual_scale 1 / sqrt(W + 1)
    Inkling2's DynamicShortConvolution          taps, no activation, residual_scale 1 / sqrt(2 W + 1)

Inkling2's dynamic taps are projected from the layer's input per token and shared by the P = D / G channels of a
key or value head: ``taps`` [B, T, G, W] indexed as ``weight``, oldest input first (the module's ``weight_proj``
output and ``static_weight`` are indexed by backward distance: tap i here is its W - 1 - i).

computed in float32 (float64 for float64 inputs), cast to x.dtype once. Every channel has its own W taps; a token
sees itself and the W - 1 before it, never a later one.

Shapes: x [B, T, D] (D = heads x head dim of q, k or v: 96 x 128 in Kimi K3; the hidden size for Inkling2's
post-sublayer convolutions, its KV heads x head dim for the dynamic ones), weight [D, W] (W = 4:
short_conv_kernel_size, Inkling2's conv_kernel_size), taps [B, T, G, W] or None (G divides D), y [B, T, D].
Gradients: x, weight and taps, with r = residual_scale (1 where None), c(t, d, i) = weight[d, i] + taps[b, t, d // P,
i] (the tap of output t):
    dpre = r * dy * s * (1 + pre * (1 - s)),  s = sigmoid(pre)                (r * dy without SiLU)
    dx[b, t, d] = sum_i c(t + (W - 1) - i, d, i) * dpre[b, t + (W - 1) - i, d]   (dpre = 0 past T)
                  + r * dy[b, t, d]                                          (with a residual)
    dweight[d, i] = sum_{b, t} dpre[b, t, d] * x[b, t - (W - 1) + i, d]
    dtaps[b, t, g, i] = sum_{d // P = g} dpre[b, t, d] * x[b, t - (W - 1) + i, d]
Shape dims besides B, T, D, W: ``linear`` (1: no activation), ``residual`` (1: scale 1; 2: 1 / sqrt(W + 1);
3: 1 / sqrt(2 W + 1)) and ``G`` (groups of dynamic taps; absent or 0: none).
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def reference(x: torch.Tensor, weight: torch.Tensor, silu: bool = True, residual_scale: float | None = None,
              taps: torch.Tensor | None = None) -> torch.Tensor:
    ct = compute_dtype(x)
    t, d, w = *x.shape[1:], weight.shape[1]
    padded = F.pad(x.to(ct), (0, 0, w - 1, 0))  # W - 1 zero tokens before the first
    pre = sum(weight[:, i].to(ct) * padded[:, i:i + t] for i in range(w))
    if taps is not None:
        check_taps(x, weight, taps)
        per_channel = taps.to(ct).repeat_interleave(d // taps.shape[2], dim=2)  # [B, T, D, W]
        pre = pre + sum(per_channel[..., i] * padded[:, i:i + t] for i in range(w))
    return finish(pre, x, silu, residual_scale)


def check_taps(x: torch.Tensor, weight: torch.Tensor, taps: torch.Tensor) -> None:
    """A clear ValueError unless taps is [B, T, G, W] with G dividing D (x [B, T, D], weight [D, W])."""
    (b, t, d), w = x.shape, weight.shape[1]
    if taps.dim() != 4 or tuple(taps.shape[:2]) != (b, t) or taps.shape[3] != w or not taps.shape[2] or \
            d % taps.shape[2]:
        raise ValueError(f"kda_short_conv: taps {tuple(taps.shape)} is not [B, T, G, W] = [{b}, {t}, G, {w}] with G "
                         f"dividing D = {d}")


def finish(pre: torch.Tensor, x: torch.Tensor, silu: bool, residual_scale: float | None) -> torch.Tensor:
    """The convolution ``pre`` (compute dtype) to the variant's output in x.dtype: SiLU, then the scaled residual."""
    y = F.silu(pre) if silu else pre
    if residual_scale is not None:
        y = (y + x.to(pre.dtype)) * residual_scale
    return y.to(x.dtype)


def variant(shape: Shape) -> dict:
    """The variant's arguments from a shape's ``linear`` and ``residual`` dims (absent or 0: KDA's silu(conv(x)))."""
    residual = shape.get("residual", 0)
    if residual not in (0, 1, 2, 3):
        raise ValueError(f"kda_short_conv: residual {residual} is none of 0 (none), 1 (scale 1), 2 (1/sqrt(W + 1)), "
                         f"3 (1/sqrt(2 W + 1))")
    return {"silu": not shape.get("linear"),
            "residual_scale": (None, 1.0, (shape["W"] + 1) ** -0.5, (2 * shape["W"] + 1) ** -0.5)[residual]}


INKLING2 = {"linear": 1, "residual": 2}
"""Inkling2's residual short convolution, (conv(x) + x) / sqrt(W + 1) without activation, as shape dims."""
INKLING2_DYNAMIC = {"linear": 1, "residual": 3}
"""Inkling2's dynamic short convolution, (conv(x) + x) / sqrt(2 W + 1) with per-token taps (a shape's ``G`` groups)
and no activation, as shape dims."""


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [B, T, D] ~ N(0, 1); weight [D, W] ~ N(0, 1/W) with every 7th channel 4x stronger (SiLU's tails); the
    variant's arguments; taps [B, T, G, W] ~ N(0, 1/W) where the shape's ``G`` is set, else None."""
    g = torch.Generator().manual_seed(seed)
    b, t, d, w, groups = shape["B"], shape["T"], shape["D"], shape["W"], shape.get("G", 0)
    x = torch.randn(b, t, d, generator=g)
    weight = torch.randn(d, w, generator=g) / w ** 0.5
    weight[::7] *= 4
    taps = (torch.randn(b, t, groups, w, generator=g) / w ** 0.5).to(device, dtype) if groups else None
    return {"x": x.to(device, dtype), "weight": weight.to(device, dtype), **variant(shape), "taps": taps}


SHAPES = {
    "smoke": [{"B": 1, "T": 16, "D": 32, "W": 4}, {"B": 2, "T": 33, "D": 64, "W": 4},
              {"B": 2, "T": 19, "D": 48, "W": 4, **INKLING2}, {"B": 2, "T": 21, "D": 64, "W": 4, "G": 4,
                                                               **INKLING2_DYNAMIC}],
    # one token, fewer tokens than taps, one channel, odd channels, narrower and wider kernels; the residual
    # variants (Inkling2's, Inkling's unscaled one, and SiLU with a residual); dynamic taps (one group, a group a
    # channel, fewer tokens than taps, groups over odd channels, with SiLU and no residual)
    "edge": [
        {"B": 1, "T": 1, "D": 8, "W": 4},
        {"B": 2, "T": 3, "D": 16, "W": 4},
        {"B": 1, "T": 20, "D": 1, "W": 4},
        {"B": 3, "T": 17, "D": 123, "W": 4},
        {"B": 1, "T": 9, "D": 40, "W": 2},
        {"B": 2, "T": 12, "D": 24, "W": 3},
        {"B": 2, "T": 2, "D": 70, "W": 4, **INKLING2},
        {"B": 1, "T": 11, "D": 9, "W": 3, "linear": 1, "residual": 1},
        {"B": 2, "T": 7, "D": 33, "W": 4, "residual": 2},
        {"B": 1, "T": 9, "D": 16, "W": 4, "G": 1, **INKLING2_DYNAMIC},
        {"B": 2, "T": 5, "D": 12, "W": 4, "G": 12, **INKLING2_DYNAMIC},
        {"B": 2, "T": 2, "D": 40, "W": 4, "G": 2, **INKLING2_DYNAMIC},
        {"B": 1, "T": 13, "D": 45, "W": 3, "G": 3},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Three shapes: KDA's form, a variant drawn from the six (SiLU or not, no, unit or 1/sqrt(W + 1) residual), and
    Inkling2's dynamic form with 1 to 4 groups of 1 to 40 channels."""
    def size() -> dict:
        return {"B": rng.randint(1, 3), "T": rng.randint(2, 70), "D": rng.randint(2, 130), "W": 4}
    groups = rng.randint(1, 4)
    return [size(), {**size(), "linear": rng.randint(0, 1), "residual": rng.randint(0, 2)},
            {**size(), "D": groups * rng.randint(1, 40), "G": groups, **INKLING2_DYNAMIC}]


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """X [B, T, D], weight [D, W] (taps [B, T, G, W]) -> y [B, T, D]."""
    e, dw = s["B"] * s["T"] * s["D"], s["D"] * s["W"]
    taps = s["B"] * s["T"] * s.get("G", 0) * s["W"]
    dyn = 2 if taps else 1  # the per-token taps add their product to each tap's
    return Work(BF16 * (2 * e + dw + taps), vector_flops=2 * dyn * e * s["W"]), \
        Work(BF16 * (3 * e + 2 * dw + 2 * taps), vector_flops=4 * dyn * e * s["W"])


def onboard(model: ModelConfig) -> list[Found]:
    """The KDA layers' convolution: linear_attn_config.short_conv_kernel_size, else the transformers class's value
    where its KDA module convolves (Kimi Linear's linear_conv_kernel_dim, 4 by default); none without either."""
    if not model.kda_layers:
        return []
    width, width_field = model.linear.get("short_conv_kernel_size"), f"{model.linear_field}.short_conv_kernel_size"
    if not width:
        width, width_field = model.class_value("linear_conv_kernel_dim", "kda_short_conv")
    if not width:
        return []
    return [Found("KDA's causal depthwise short convolution (with SiLU) on q, k and v", model.kda_layers,
                  [{"B": 1, "T": model.tokens, "D": model.kda_heads * model.kda_head_dim, "W": width}], [width_field])]


SPEC = BlockSpec(
    name="kda_short_conv",
    family="linear_attention",
    summary="causal depthwise conv1d (W taps per channel) + SiLU on KDA's q, k, v; the residual variants "
            "(Inkling2's (conv(x) + x) / sqrt(W + 1)) and the dynamic one (per-token taps); float32 math",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x", "weight", "taps"),
    outputs=("y",),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    onboard=onboard,
    replay="K",
)
