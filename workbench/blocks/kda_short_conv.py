"""kda_short_conv: KDA's input path, the causal depthwise short convolution with SiLU that Kimi Linear and Kimi K3
run on q, k and v before the delta rule (fla's ``ShortConvolution(D, kernel_size=4, bias=False,
activation="silu")``, the semantics of Tri Dao's ``causal_conv1d_fn`` in the [B, T, D] layout), and the published
residual variants:

    pre[b, t, d] = sum_{i < W} weight[d, i] * x[b, t - (W - 1) + i, d]        (x = 0 before t = 0)
    a = silu(pre) = pre * sigmoid(pre)          (silu False: a = pre)
    y = a                                       (residual_scale None)
    y = (a + x) * residual_scale                (a residual short convolution)

    KDA (Kimi Linear, Kimi K3, Qwen3-Next)      silu, no residual
    Inkling's ShortConvolution                  no activation, residual_scale 1
    Inkling2's ShortConvolution                 no activation, residual_scale 1 / sqrt(W + 1)

computed in float32 (float64 for float64 inputs), cast to x.dtype once. Every channel has its own W taps; a token
sees itself and the W - 1 before it, never a later one.

Shapes: x [B, T, D] (D = heads x head dim of q, k or v: 96 x 128 in Kimi K3; the hidden size for Inkling2's
post-sublayer convolutions), weight [D, W] (W = 4: short_conv_kernel_size, Inkling2's conv_kernel_size),
y [B, T, D]. Gradients: x and weight, with r = residual_scale (1 where None):
    dpre = r * dy * s * (1 + pre * (1 - s)),  s = sigmoid(pre)                (r * dy without SiLU)
    dx[b, t, d] = sum_i weight[d, i] * dpre[b, t + (W - 1) - i, d]            (dpre = 0 past T)
                  + r * dy[b, t, d]                                          (with a residual)
    dweight[d, i] = sum_{b, t} dpre[b, t, d] * x[b, t - (W - 1) + i, d]
Shape dims besides B, T, D, W: ``linear`` (1: no activation) and ``residual`` (1: scale 1; 2: 1 / sqrt(W + 1)).
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def reference(x: torch.Tensor, weight: torch.Tensor, silu: bool = True,
              residual_scale: float | None = None) -> torch.Tensor:
    ct = compute_dtype(x)
    t, w = x.shape[1], weight.shape[1]
    padded = F.pad(x.to(ct), (0, 0, w - 1, 0))  # W - 1 zero tokens before the first
    pre = sum(weight[:, i].to(ct) * padded[:, i:i + t] for i in range(w))
    return finish(pre, x, silu, residual_scale)


def finish(pre: torch.Tensor, x: torch.Tensor, silu: bool, residual_scale: float | None) -> torch.Tensor:
    """The convolution ``pre`` (compute dtype) to the variant's output in x.dtype: SiLU, then the scaled residual."""
    y = F.silu(pre) if silu else pre
    if residual_scale is not None:
        y = (y + x.to(pre.dtype)) * residual_scale
    return y.to(x.dtype)


def variant(shape: Shape) -> dict:
    """The variant's arguments from a shape's ``linear`` and ``residual`` dims (absent or 0: KDA's silu(conv(x)))."""
    residual = shape.get("residual", 0)
    if residual not in (0, 1, 2):
        raise ValueError(f"kda_short_conv: residual {residual} is none of 0 (none), 1 (scale 1), 2 (1/sqrt(W + 1))")
    return {"silu": not shape.get("linear"),
            "residual_scale": (None, 1.0, (shape["W"] + 1) ** -0.5)[residual]}


INKLING2 = {"linear": 1, "residual": 2}
"""Inkling2's residual short convolution, (conv(x) + x) / sqrt(W + 1) without activation, as shape dims."""


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [B, T, D] ~ N(0, 1); weight [D, W] ~ N(0, 1/W) with every 7th channel 4x stronger (SiLU's tails); the
    variant's arguments."""
    g = torch.Generator().manual_seed(seed)
    b, t, d, w = shape["B"], shape["T"], shape["D"], shape["W"]
    x = torch.randn(b, t, d, generator=g)
    weight = torch.randn(d, w, generator=g) / w ** 0.5
    weight[::7] *= 4
    return {"x": x.to(device, dtype), "weight": weight.to(device, dtype), **variant(shape)}


SHAPES = {
    "smoke": [{"B": 1, "T": 16, "D": 32, "W": 4}, {"B": 2, "T": 33, "D": 64, "W": 4},
              {"B": 2, "T": 19, "D": 48, "W": 4, **INKLING2}],
    # one token, fewer tokens than taps, one channel, odd channels, narrower and wider kernels; the residual
    # variants (Inkling2's, Inkling's unscaled one, and SiLU with a residual)
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
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Two shapes: KDA's form, and a variant drawn from the six (SiLU or not, no, unit or 1/sqrt(W + 1) residual)."""
    def size() -> dict:
        return {"B": rng.randint(1, 3), "T": rng.randint(2, 70), "D": rng.randint(2, 130), "W": 4}
    return [size(), {**size(), "linear": rng.randint(0, 1), "residual": rng.randint(0, 2)}]


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """X [B, T, D], weight [D, W] -> y [B, T, D]."""
    e, dw = s["B"] * s["T"] * s["D"], s["D"] * s["W"]
    return Work(BF16 * (2 * e + dw), vector_flops=2 * e * s["W"]), \
        Work(BF16 * (3 * e + 2 * dw), vector_flops=4 * e * s["W"])


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
            "(Inkling2's (conv(x) + x) / sqrt(W + 1)); float32 math",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x", "weight"),
    outputs=("y",),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    onboard=onboard,
    replay="K",
)
