"""kda_short_conv: KDA's input path, the causal depthwise short convolution with SiLU that Kimi Linear and Kimi K3
run on q, k and v before the delta rule (fla's ``ShortConvolution(D, kernel_size=4, bias=False,
activation="silu")``, the semantics of Tri Dao's ``causal_conv1d_fn`` in the [B, T, D] layout):

    pre[b, t, d] = sum_{i < W} weight[d, i] * x[b, t - (W - 1) + i, d]        (x = 0 before t = 0)
    y = silu(pre) = pre * sigmoid(pre)

computed in float32 (float64 for float64 inputs), cast to x.dtype once. Every channel has its own W taps; a token
sees itself and the W - 1 before it, never a later one.

Shapes: x [B, T, D] (D = heads x head dim of q, k or v: 96 x 128 in Kimi K3), weight [D, W] (W = 4:
short_conv_kernel_size), y [B, T, D]. Gradients: x and weight:
    dpre = dy * s * (1 + pre * (1 - s)),  s = sigmoid(pre)
    dx[b, t, d] = sum_i weight[d, i] * dpre[b, t + (W - 1) - i, d]            (dpre = 0 past T)
    dweight[d, i] = sum_{b, t} dpre[b, t, d] * x[b, t - (W - 1) + i, d]
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    ct = compute_dtype(x)
    t, w = x.shape[1], weight.shape[1]
    padded = F.pad(x.to(ct), (0, 0, w - 1, 0))  # W - 1 zero tokens before the first
    pre = sum(weight[:, i].to(ct) * padded[:, i:i + t] for i in range(w))
    return F.silu(pre).to(x.dtype)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [B, T, D] ~ N(0, 1); weight [D, W] ~ N(0, 1/W) with every 7th channel 4x stronger (SiLU's tails)."""
    g = torch.Generator().manual_seed(seed)
    b, t, d, w = shape["B"], shape["T"], shape["D"], shape["W"]
    x = torch.randn(b, t, d, generator=g)
    weight = torch.randn(d, w, generator=g) / w ** 0.5
    weight[::7] *= 4
    return {"x": x.to(device, dtype), "weight": weight.to(device, dtype)}


SHAPES = {
    "smoke": [{"B": 1, "T": 16, "D": 32, "W": 4}, {"B": 2, "T": 33, "D": 64, "W": 4}],
    # one token, fewer tokens than taps, one channel, odd channels, narrower and wider kernels
    "edge": [
        {"B": 1, "T": 1, "D": 8, "W": 4},
        {"B": 2, "T": 3, "D": 16, "W": 4},
        {"B": 1, "T": 20, "D": 1, "W": 4},
        {"B": 3, "T": 17, "D": 123, "W": 4},
        {"B": 1, "T": 9, "D": 40, "W": 2},
        {"B": 2, "T": 12, "D": 24, "W": 3},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    return [{"B": rng.randint(1, 3), "T": rng.randint(2, 70), "D": rng.randint(2, 130), "W": 4} for _ in range(2)]


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
    summary="causal depthwise conv1d (W taps per channel) + SiLU on KDA's q, k, v; float32 math",
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
