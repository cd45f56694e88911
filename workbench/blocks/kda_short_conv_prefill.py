"""kda_short_conv_prefill: KDA's short convolution over packed sequences for serving, each continuing from its state
in the conv-state cache and leaving its last inputs there (the semantics of Tri Dao's ``causal_conv1d_fn`` with
``query_start_loc``, ``cache_indices`` and ``has_initial_state``, which vLLM calls in its prefill; the cache is
kda_short_conv_decode's):

    for sequence n, its tokens r = cu_seqlens[n] .. cu_seqlens[n + 1] - 1 (T_n of them, any T_n >= 0):
    past  = conv_cache[slots[n]] if has_state[n] else 0               [D, L]: the last L inputs, oldest first
    ext   = [past | x[r]^T]                                           [D, L + T_n]
    pre[d, t] = sum_{i < W} weight[d, i] * ext[d, L - (W - 1) + t + i]
    y[r] = silu(pre)^T
    conv_cache[slots[n]] = ext[:, T_n:]                               the last L columns, in place

kda_short_conv's output for a sequence whose earlier inputs are in the state (all zeros without one: a prompt from
its first token). A packed prefill of a prompt's prefix, then kda_short_conv_decode token by token, equals the
packed prefill of the whole prompt (tests/blocks/test_kda_short_conv_prefill.py); no sequence sees another's
inputs. Math in float32 (float64 for float64 inputs), y in x.dtype; the cache holds inputs in x's dtype.

Shapes: x [TOTAL, D] (S sequences end to end); weight [D, W]; conv_cache [SLOTS, D, L], L >= W - 1, channel-major
(causal-conv1d's conv_state); cu_seqlens [S + 1] int32; slots [S] int64, distinct; has_state [S] bool. Outputs:
y [TOTAL, D] in x.dtype, and conv_cache itself (``updated_in_place``). Forward only.
Inputs (make_inputs): kda_short_conv_decode's draws; the sequences a random split of TOTAL with an empty and a
one-token sequence among them (workbench.blocks._packed); about half of them with a state.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from workbench.blocks import _packed
from workbench.blocks._config import PREFILL_SEQUENCES, Found, ModelConfig
from workbench.blocks.base import BF16, I32, I64, BlockSpec, Shape, Work
from workbench.blocks.kda_short_conv import onboard as conv_onboard
from workbench.numerics import compute_dtype


def reference(x: torch.Tensor, weight: torch.Tensor, conv_cache: torch.Tensor, cu_seqlens: torch.Tensor,
              slots: torch.Tensor, has_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's convolution from its state. Returns (y [TOTAL, D] in x.dtype, an updated copy of
    conv_cache); the input cache is left alone."""
    ct, w, length = compute_dtype(x), weight.shape[1], conv_cache.shape[2]
    cache = conv_cache.clone()
    y = torch.empty(x.shape, dtype=ct, device=x.device)
    bounds = cu_seqlens.tolist()
    for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        slot = int(slots[n])
        past = conv_cache[slot].to(ct) if bool(has_state[n]) else x.new_zeros(x.shape[1], length, dtype=ct)
        ext = torch.cat([past, x[start:end].to(ct).T], dim=1)  # [D, L + T_n]
        window = ext[:, length - (w - 1):]
        pre = sum(weight[:, i:i + 1].to(ct) * window[:, i:i + end - start] for i in range(w))  # [D, T_n]
        y[start:end] = F.silu(pre).T
        cache[slot] = ext[:, end - start:].to(cache.dtype)
    return y.to(x.dtype), cache


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [TOTAL, D] ~ N(0, 1); weight [D, W] as kda_short_conv draws it; every slot's L inputs ~ N(0, 1); the S
    sequences' lengths a _packed.split of TOTAL, their slots S distinct ones of SLOTS, every other one (from a random
    first) with a state."""
    g = torch.Generator().manual_seed(seed)
    total, s, slots, d, w, length = (shape[k] for k in ("TOTAL", "S", "SLOTS", "D", "W", "L"))
    if s > slots or length < w - 1:
        raise ValueError(f"kda_short_conv_prefill: S={s} must be at most SLOTS={slots} and L={length} at least W - 1")
    x = torch.randn(total, d, generator=g)
    weight = torch.randn(d, w, generator=g) / w ** 0.5
    weight[::7] *= 4
    cache = torch.randn(slots, d, length, generator=g)
    chosen = torch.randperm(slots, generator=g)[:s]
    has_state = (torch.arange(s) + int(torch.randint(0, 2, (1,), generator=g))) % 2 == 1
    cu = _packed.offsets(_packed.split(total, s, g))
    return {"x": x.to(device, dtype), "weight": weight.to(device, dtype), "conv_cache": cache.to(device, dtype),
            "cu_seqlens": cu.to(device), "slots": chosen.to(device), "has_state": has_state.to(device)}


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """make_inputs' shapes and dtypes on the meta device."""
    total, s, slots, d, w, length = (shape[k] for k in ("TOTAL", "S", "SLOTS", "D", "W", "L"))
    meta = {"device": "meta"}
    return {"x": torch.empty(total, d, dtype=dtype, **meta), "weight": torch.empty(d, w, dtype=dtype, **meta),
            "conv_cache": torch.empty(slots, d, length, dtype=dtype, **meta),
            "cu_seqlens": torch.empty(s + 1, dtype=torch.int32, **meta),
            "slots": torch.empty(s, dtype=torch.int64, **meta), "has_state": torch.empty(s, dtype=torch.bool, **meta)}


def abstract_outputs(x, weight, conv_cache, cu_seqlens, slots, has_state):
    """y [TOTAL, D] in x's dtype and the cache (the library op's fake implementation)."""
    return x.new_empty(x.shape), conv_cache


SHAPES = {
    "smoke": [{"TOTAL": 24, "S": 3, "SLOTS": 4, "D": 32, "W": 4, "L": 3},
              {"TOTAL": 50, "S": 5, "SLOTS": 6, "D": 64, "W": 4, "L": 4}],
    # one sequence of one token; no tokens at all; sequences shorter than the state; odd channels and a longer
    # state; a two-tap kernel; a long sequence past several token tiles
    "edge": [
        {"TOTAL": 1, "S": 1, "SLOTS": 1, "D": 8, "W": 4, "L": 3},
        {"TOTAL": 0, "S": 2, "SLOTS": 3, "D": 16, "W": 4, "L": 3},
        {"TOTAL": 5, "S": 4, "SLOTS": 4, "D": 24, "W": 4, "L": 3},
        {"TOTAL": 37, "S": 3, "SLOTS": 5, "D": 123, "W": 4, "L": 4},
        {"TOTAL": 19, "S": 3, "SLOTS": 3, "D": 40, "W": 2, "L": 5},
        {"TOTAL": 300, "S": 3, "SLOTS": 3, "D": 16, "W": 4, "L": 3},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Two shapes drawn at verification time: 1-6 sequences of 0-120 tokens in all, caches up to twice as large,
    1-200 channels, the state W - 1 or W long."""
    shapes = []
    for _ in range(2):
        s = rng.randint(1, 6)
        shapes.append({"TOTAL": rng.randint(0, 120), "S": s, "SLOTS": rng.randint(s, 2 * s), "D": rng.randint(1, 200),
                       "W": 4, "L": rng.choice([3, 4])})
    return shapes


def work(s: Shape) -> tuple[Work, Work]:
    """x in and y out, each sequence's [D, L] state read and written back, the [D, W] taps; 2 W flops per channel
    and token. No backward."""
    total, n, d = s["TOTAL"], s["S"], s["D"]
    moved = BF16 * (2 * total * d + 2 * n * d * s["L"] + d * s["W"]) + I32 * (n + 1) + I64 * n + n
    return Work(moved, vector_flops=2 * total * d * s["W"]), Work(0.0)


def onboard(model: ModelConfig) -> list[Found]:
    """Every KDA layer with a short convolution prefills through this step: the model suite's tokens per step packed
    from PREFILL_SEQUENCES prompts (the card's assumed prefill_sequences), each with a slot of a cache as large as
    the decode batch, causal-conv1d's state of W - 1 inputs."""
    sequences = min(PREFILL_SEQUENCES, model.decode_batch)
    return [Found("KDA's short convolution over packed prompts from the conv-state cache (serving prefill)",
                  found.layers,
                  [{"TOTAL": model.tokens, "S": sequences, "SLOTS": model.decode_batch, "D": shape["D"],
                    "W": shape["W"], "L": shape["W"] - 1}], found.fields)
            for found in conv_onboard(model) for shape in found.shapes]


SPEC = BlockSpec(
    name="kda_short_conv_prefill",
    family="linear_attention",
    summary="KDA's short convolution for serving prefill: packed sequences (cu_seqlens), each from its state in the "
            "conv-state cache, the last inputs written back in place",
    reference=reference,
    make_inputs=make_inputs,
    abstract_inputs=abstract_inputs,
    abstract_outputs=abstract_outputs,
    grad_inputs=(),
    outputs=("y", "conv_cache"),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    onboard=onboard,
    updated_in_place=("conv_cache",),
)
