"""kda_short_conv_decode: KDA's short convolution for serving, one token per sequence against a conv-state cache
addressed by slot (the semantics of Tri Dao's ``causal_conv1d_update`` with ``conv_state_indices``, which vLLM
calls; transformers' Kimi Linear runs the same update on its own cache):

    state = conv_cache[slots[n]]                                  [D, L]: the last L inputs, oldest first
    c[d, i] = weight[d, i] + taps[n, d // P, i]                   (weight[d, i] where taps is None)
    pre[d] = sum_{i < W - 1} c[d, i] * state[d, L - (W - 1) + i] + c[d, W - 1] * x[n, d]
    y[n] = silu(pre)                                              (pre without SiLU)
    y[n] = (y[n] + x[n]) * residual_scale                         (a residual short convolution)
    conv_cache[slots[n]] = [state[:, 1:], x[n]]                    shifted by one token, in place

kda_short_conv's output, in its variant (``silu``, ``residual_scale``: Inkling2's (conv(x) + x) / sqrt(W + 1) too;
``taps``: Inkling2's dynamic convolution's per-token taps for the new token, [N, G, W], each shared by P = D / G
channels), for the newest token of a sequence whose earlier tokens are in the state. Math in float32 (float64 for
float64 inputs), y in x.dtype. Shape dims ``linear``, ``residual`` and ``G`` as kda_short_conv's.

Layout: conv_cache [SLOTS, D, L], channel-major with time last, as causal-conv1d's conv_state: any L >= W - 1 (vLLM
keeps W - 1, transformers' Kimi Linear keeps W); the convolution reads the last W - 1 columns and the whole state
shifts. The cache holds inputs in x's dtype.

Shapes: x [N, D]; weight [D, W]; conv_cache [SLOTS, D, L] in x.dtype; slots [N] int64, distinct, in [0, SLOTS);
taps [N, G, W] or None.
Outputs: y [N, D] in x.dtype, and conv_cache itself (``updated_in_place``). Forward only.
"""

from __future__ import annotations

import random

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, I64, BlockSpec, Shape, Work
from workbench.blocks.kda_short_conv import INKLING2, INKLING2_DYNAMIC, finish, variant
from workbench.blocks.kda_short_conv import onboard as prefill_onboard
from workbench.numerics import compute_dtype


def reference(x: torch.Tensor, weight: torch.Tensor, conv_cache: torch.Tensor, slots: torch.Tensor,
              silu: bool = True, residual_scale: float | None = None,
              taps: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The convolution's newest output per sequence from the states in ``slots``. Returns (y [N, D] in x.dtype, an
    updated copy of conv_cache); the input cache is left alone."""
    ct, (n, d), w = compute_dtype(x), x.shape, weight.shape[1]
    window = torch.cat([conv_cache[slots].to(ct), x.to(ct)[:, :, None]], dim=-1)  # [N, D, L + 1]
    coefficients = weight.to(ct).expand(n, d, w)
    if taps is not None:
        if taps.dim() != 3 or taps.shape[0] != n or taps.shape[2] != w or not taps.shape[1] or d % taps.shape[1]:
            raise ValueError(f"kda_short_conv_decode: taps {tuple(taps.shape)} is not [N, G, W] = [{n}, G, {w}] "
                             f"with G dividing D = {d}")
        coefficients = coefficients + taps.to(ct).repeat_interleave(d // taps.shape[1], dim=1)
    pre = (window[:, :, -w:] * coefficients).sum(-1)
    cache = conv_cache.clone()
    cache[slots] = window[:, :, 1:].to(cache.dtype)
    return finish(pre, x, silu, residual_scale), cache


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [N, D] ~ N(0, 1); weight [D, W] as kda_short_conv draws it (every 7th channel 4x stronger); every slot's L
    past inputs ~ N(0, 1); slots a random choice of N distinct slots of SLOTS; the variant's arguments; taps [N, G, W]
    ~ N(0, 1/W) where the shape's ``G`` is set, else None."""
    g = torch.Generator().manual_seed(seed)
    n, slots, d, w, length = (shape[k] for k in ("N", "SLOTS", "D", "W", "L"))
    if n > slots or length < w - 1:
        raise ValueError(f"kda_short_conv_decode: N={n} must be at most SLOTS={slots} and L={length} at least W - 1")
    x = torch.randn(n, d, generator=g)
    weight = torch.randn(d, w, generator=g) / w ** 0.5
    weight[::7] *= 4
    cache = torch.randn(slots, d, length, generator=g)
    chosen = torch.randperm(slots, generator=g)[:n]
    groups = shape.get("G", 0)
    taps = (torch.randn(n, groups, w, generator=g) / w ** 0.5).to(device, dtype) if groups else None
    return {"x": x.to(device, dtype), "weight": weight.to(device, dtype), "conv_cache": cache.to(device, dtype),
            "slots": chosen.to(device), **variant(shape), "taps": taps}


SHAPES = {
    "smoke": [{"N": 2, "SLOTS": 4, "D": 32, "W": 4, "L": 3}, {"N": 4, "SLOTS": 6, "D": 64, "W": 4, "L": 4},
              {"N": 3, "SLOTS": 3, "D": 48, "W": 4, "L": 4, **INKLING2},
              {"N": 2, "SLOTS": 3, "D": 64, "W": 4, "L": 4, "G": 4, **INKLING2_DYNAMIC}],
    # one sequence; one channel; odd channels in a larger cache; a two-tap kernel with a longer state; the residual
    # variants (Inkling's unscaled one, SiLU with a residual); dynamic taps (a group a channel; one group, with SiLU)
    "edge": [
        {"N": 1, "SLOTS": 1, "D": 8, "W": 4, "L": 3},
        {"N": 3, "SLOTS": 5, "D": 1, "W": 4, "L": 4},
        {"N": 5, "SLOTS": 9, "D": 123, "W": 4, "L": 3},
        {"N": 2, "SLOTS": 2, "D": 40, "W": 2, "L": 5},
        {"N": 2, "SLOTS": 3, "D": 19, "W": 3, "L": 2, "linear": 1, "residual": 1},
        {"N": 1, "SLOTS": 2, "D": 70, "W": 4, "L": 3, "residual": 2},
        {"N": 3, "SLOTS": 4, "D": 12, "W": 4, "L": 3, "G": 12, **INKLING2_DYNAMIC},
        {"N": 2, "SLOTS": 2, "D": 45, "W": 3, "L": 3, "G": 1},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Three shapes drawn at verification time: batches up to 9 in caches up to twice as large, 1-200 channels, the
    state W - 1 or W long; KDA's form, a variant drawn from the six, and Inkling2's dynamic form (1 to 4 groups)."""
    shapes = []
    for _ in range(3):
        n = rng.randint(1, 9)
        shapes.append({"N": n, "SLOTS": rng.randint(n, 2 * n), "D": rng.randint(1, 200), "W": 4,
                       "L": rng.choice([3, 4])})
    shapes[1].update(linear=rng.randint(0, 1), residual=rng.randint(0, 2))
    groups = rng.randint(1, 4)
    shapes[2].update(D=groups * rng.randint(1, 50), G=groups, **INKLING2_DYNAMIC)
    return shapes


def work(s: Shape) -> tuple[Work, Work]:
    """Per sequence: the [D, L] state read and written back, x in, y out, the [D, W] taps (and its [G, W] own); 2 W
    flops per channel (3 W with its own taps). No backward."""
    n, d, groups = s["N"], s["D"], s.get("G", 0)
    moved = BF16 * (2 * n * d * s["L"] + 2 * n * d + d * s["W"] + n * groups * s["W"]) + I64 * n
    return Work(moved, vector_flops=(3 if groups else 2) * n * d * s["W"]), Work(0.0)


def onboard(model: ModelConfig) -> list[Found]:
    """Every KDA layer with a short convolution (kda_short_conv in the card) decodes through this update, at the
    model suite's decode batch with causal-conv1d's state of W - 1 inputs."""
    batch = model.decode_batch
    return [Found("KDA's short convolution decode update over the conv-state cache (serving)", prefill.layers,
                  [{"N": batch, "SLOTS": batch, "D": shape["D"], "W": shape["W"], "L": shape["W"] - 1}],
                  prefill.fields)
            for prefill in prefill_onboard(model) for shape in prefill.shapes]


SPEC = BlockSpec(
    name="kda_short_conv_decode",
    family="linear_attention",
    summary="KDA's short convolution (and its residual and dynamic variants) for serving: one token per sequence, "
            "the conv-state cache shifted in place by slot",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=(),
    outputs=("y", "conv_cache"),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    onboard=onboard,
    updated_in_place=("conv_cache",),
)
