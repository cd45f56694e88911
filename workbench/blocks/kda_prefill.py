"""kda_prefill: Kimi Delta Attention over packed prompts for serving, each from its state in the state cache (by
slot; zeros where it has none) and leaving its final state there (fla's fused_recurrent_kda with ``cu_seqlens`` and
``ssm_state_indices``, the form vLLM's prefill of a chunk calls; kda_decode's cache).

For sequence n, its tokens r = cu_seqlens[n] .. cu_seqlens[n + 1] - 1 (any number, none included), per value head:

    S = state_cache[slots[n]] if has_state[n] else 0        [K, V], float32
    for each token:  S = S * exp(g)[:, None];  S = S + beta k (v - S^T k)^T;  o = S^T (q * scale)
    state_cache[slots[n]] = S                               in place

kda's recurrence (its reference, token by token) over each sequence from its state. A prompt prefilled in chunks,
or prefilled then decoded token by token with kda_decode, equals it prefilled at once, and a prompt from no state is
kda's prefill of it, outputs and final state (tests/blocks/test_kda_prefill.py); no sequence sees another's tokens.

Shapes: q, k [TOTAL, H, K]; v [TOTAL, HV, V]; g [TOTAL, HV, K] (log decay, <= 0); beta [TOTAL, HV]; state_cache
[SLOTS, HV, K, V] (float32; float64 for float64 inputs; any strides: kda_decode's layouts, vLLM's V x K among them);
cu_seqlens [S + 1] int32; slots [S] int64, distinct;
has_state [S] bool. Outputs: o [TOTAL, HV, V] in v.dtype, and state_cache itself. Grouped value heads as in kda
(HV % H == 0). Forward only: serving has no backward.
Inputs (make_inputs): kda_decode's distributions for TOTAL tokens; the sequences a _packed.split of TOTAL (an empty
and a one-token sequence among them), every other one (from a random first) with a state.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from workbench.blocks import _packed, kda_decode
from workbench.blocks._config import PREFILL_SEQUENCES, Found, ModelConfig
from workbench.blocks.base import BF16, F32, I32, I64, BlockSpec, Peer, Shape, Work
from workbench.blocks.kda import GATE_NORMALIZERS, state_dtype
from workbench.blocks.kda import reference as kda_reference


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float,
              state_cache: torch.Tensor, cu_seqlens: torch.Tensor, slots: torch.Tensor, has_state: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """kda's recurrence over each sequence from its state. Returns (o [TOTAL, HV, V] in v.dtype, an updated copy of
    state_cache); the input cache is left alone."""
    cache = state_cache.clone()
    o = torch.empty(q.shape[0], v.shape[1], v.shape[2], dtype=v.dtype, device=v.device)
    bounds = cu_seqlens.tolist()
    for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        slot = int(slots[n])
        state = state_cache[slot][None] if bool(has_state[n]) else torch.zeros_like(state_cache[slot])[None]
        rows = slice(start, end)
        out, final = kda_reference(q[None, rows], k[None, rows], v[None, rows], g[None, rows], beta[None, rows],
                                   scale, state)
        o[rows] = out[0]
        cache[slot] = final[0].to(cache.dtype)
    return o, cache


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    gen = torch.Generator().manual_seed(seed)
    total, s, slots, h, hv, dk, dv = (shape[d] for d in ("TOTAL", "S", "SLOTS", "H", "HV", "K", "V"))
    if hv % h or s > slots:
        raise ValueError(f"kda_prefill: HV={hv} must be a multiple of H={h} and S={s} at most SLOTS={slots}")
    q = F.normalize(torch.rand(total, h, dk, generator=gen), p=2, dim=-1)
    k = F.normalize(torch.rand(total, h, dk, generator=gen), p=2, dim=-1)
    v = torch.rand(total, hv, dv, generator=gen)
    g = F.logsigmoid(torch.randn(total, hv, dk, generator=gen)) / GATE_NORMALIZERS[seed % len(GATE_NORMALIZERS)]
    beta = torch.sigmoid(torch.randn(total, hv, generator=gen))
    cache = kda_decode.state_cache(slots, hv, dk, dv, shape.get("vk", 0), gen)
    chosen = torch.randperm(slots, generator=gen)[:s]
    has_state = (torch.arange(s) + int(torch.randint(0, 2, (1,), generator=gen))) % 2 == 1
    cu = _packed.offsets(_packed.split(total, s, gen))
    return {"q": q.to(device, dtype), "k": k.to(device, dtype), "v": v.to(device, dtype), "g": g.to(device, dtype),
            "beta": beta.to(device, dtype), "scale": dk ** -0.5,
            "state_cache": cache.to(device, state_dtype(dtype)), "cu_seqlens": cu.to(device),
            "slots": chosen.to(device), "has_state": has_state.to(device)}


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """make_inputs' shapes and dtypes on the meta device."""
    total, s, slots, h, hv, dk, dv = (shape[d] for d in ("TOTAL", "S", "SLOTS", "H", "HV", "K", "V"))
    meta = {"device": "meta"}
    vk = shape.get("vk", 0)
    cache = torch.empty(slots, hv, *((dv, dk) if vk else (dk, dv)), dtype=state_dtype(dtype), **meta)
    return {"q": torch.empty(total, h, dk, dtype=dtype, **meta), "k": torch.empty(total, h, dk, dtype=dtype, **meta),
            "v": torch.empty(total, hv, dv, dtype=dtype, **meta), "g": torch.empty(total, hv, dk, dtype=dtype, **meta),
            "beta": torch.empty(total, hv, dtype=dtype, **meta), "scale": dk ** -0.5,
            "state_cache": cache.transpose(-1, -2) if vk else cache,
            "cu_seqlens": torch.empty(s + 1, dtype=torch.int32, **meta),
            "slots": torch.empty(s, dtype=torch.int64, **meta), "has_state": torch.empty(s, dtype=torch.bool, **meta)}


def abstract_outputs(q, k, v, g, beta, scale, state_cache, cu_seqlens, slots, has_state):
    """o [TOTAL, HV, V] in v's dtype and the cache (the library op's fake implementation)."""
    return v.new_empty(v.shape), state_cache


SHAPES = {
    "smoke": [
        {"TOTAL": 12, "S": 3, "SLOTS": 4, "H": 1, "HV": 2, "K": 16, "V": 16},
        {"TOTAL": 20, "S": 4, "SLOTS": 4, "H": 2, "HV": 2, "K": 32, "V": 32, "vk": 1},  # vLLM's V x K cache
    ],
    # one token in one slot; a batch in a larger cache with GVA 1:2 and odd head dims (both layouts); V over several
    # V tiles and a long prompt; head dims of one
    "edge": [
        {"TOTAL": 1, "S": 1, "SLOTS": 1, "H": 1, "HV": 1, "K": 16, "V": 16},
        {"TOTAL": 9, "S": 3, "SLOTS": 8, "H": 2, "HV": 4, "K": 24, "V": 20},
        {"TOTAL": 9, "S": 3, "SLOTS": 8, "H": 2, "HV": 4, "K": 24, "V": 20, "vk": 1},
        {"TOTAL": 40, "S": 2, "SLOTS": 3, "H": 1, "HV": 1, "K": 16, "V": 80},
        {"TOTAL": 5, "S": 3, "SLOTS": 3, "H": 1, "HV": 3, "K": 1, "V": 1},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Two shapes drawn at verification time: 1-24 tokens in 1-5 sequences, a cache up to twice as large, head dims
    1-40, GVA ratios 1-2."""
    shapes = []
    for _ in range(2):
        h, s = rng.randint(1, 2), rng.randint(1, 5)
        shapes.append({"TOTAL": rng.randint(1, 24), "S": s, "SLOTS": rng.randint(s, 2 * s), "H": h,
                       "HV": h * rng.randint(1, 2), "K": rng.randint(1, 40), "V": rng.randint(1, 40),
                       "vk": rng.randint(0, 1)})
    return shapes


def work(s: Shape) -> tuple[Work, Work]:
    """Per sequence and value head the [K, V] float32 state read once and written once; per token q, k, v, g, beta
    in and o out; about 7 flops per state element and token. No backward."""
    total, n, hv, k, v = s["TOTAL"], s["S"], s["HV"], s["K"], s["V"]
    moved = 2 * F32 * n * hv * k * v + BF16 * (2 * total * s["H"] * k + total * hv * (k + 2 * v + 1)) \
        + I32 * (n + 1) + I64 * n + n
    return Work(moved, vector_flops=7 * total * hv * k * v), Work(0.0)


def fla_fused_recurrent_kda(q, k, v, g, beta, scale, state_cache, cu_seqlens, slots, has_state):
    """fla's fused_recurrent_kda forward as a serving engine calls it over packed prompts (cu_seqlens, the states
    read and written in place through ssm_state_indices), with the reference's signature; the slots of sequences
    without a state are zeroed first (fla reads every sequence's initial state)."""
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    state_cache[slots[~has_state]] = 0
    o, _ = fused_recurrent_kda_fwd(q[None], k[None], v[None], g[None], beta[None], initial_state=state_cache,
                                   scale=scale, inplace_final_state=True, cu_seqlens=cu_seqlens.long(),
                                   ssm_state_indices=slots)
    return o[0], state_cache


def onboard(model: ModelConfig) -> list[Found]:
    """Every KDA layer prefills through this step: the model suite's tokens per step packed from PREFILL_SEQUENCES
    prompts (the card's assumed prefill_sequences), against kda_decode's cache of decode-batch slots."""
    return [Found("KDA over packed prompts from the state cache (serving prefill, the recurrent form; vLLM's V x K "
                  "layout)", found.layers,
                  [{"TOTAL": model.tokens, "S": min(PREFILL_SEQUENCES, shape["SLOTS"]),
                    **{k: shape[k] for k in ("SLOTS", "H", "HV", "K", "V", "vk")}}], found.fields)
            for found in kda_decode.onboard(model) for shape in found.shapes[:1]]


SPEC = BlockSpec(
    name="kda_prefill",
    family="linear_attention",
    summary="KDA for serving prefill: packed prompts (cu_seqlens), each from its K x V state in the cache by slot, "
            "the final state written back in place",
    reference=reference,
    make_inputs=make_inputs,
    abstract_inputs=abstract_inputs,
    abstract_outputs=abstract_outputs,
    grad_inputs=(),
    outputs=("o", "state_cache"),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    peers=(Peer("fla fused_recurrent_kda", "fla", fla_fused_recurrent_kda),),
    onboard=onboard,
    updated_in_place=("state_cache",),
)
