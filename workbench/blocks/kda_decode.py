"""kda_decode: one Kimi Delta Attention step for each sequence being served, against a state cache addressed by slot
(the serving form of kda: continuous batching in vLLM and SGLang keeps one recurrent state per request slot, as fla's
fused_recurrent_kda reads and writes it through ssm_state_indices).

For sequence n, per value head, with the state S = state_cache[slots[n]] ([K, V], float32):

    S = S * exp(g)[:, None]                  decay each key channel
    S = S + beta k (v - S^T k)^T             delta-rule correction
    o = S^T (q * scale)                      read after the write
    state_cache[slots[n]] = S                in place

kda's recurrence for one token. The cache is updated in place (``updated_in_place``): a request's state lives in its
slot from its prefill to its last token, and the slots of requests not in this batch are left as they are.

Layout: state_cache is indexed [SLOTS, HV, K, V] (K x V, the layout of kda's final_state) in any strides: stored
K x V (fla's fused_recurrent_kda default: the V values of a key row contiguous) or V x K, as vLLM keeps it
([slot, H, V, K], ``vllm/models/kimi_k3``'s fused_recurrent_kda), given as that storage's transposed view
``cache.transpose(-1, -2)``: the step reads and writes vLLM's cache in place, with no copy (a transpose at the
boundary would read and write every slot's state twice more each step). Shape dim ``vk`` 1 stores it V x K.

Shapes: q, k [N, H, K]; v [N, HV, V]; g [N, HV, K] (log decay, <= 0); beta [N, HV]; state_cache [SLOTS, HV, K, V]
(float32; float64 for float64 inputs; any strides); slots [N] int64, distinct, in [0, SLOTS). Outputs: o [N, HV, V]
in v.dtype, and state_cache itself. Grouped value heads as in kda (HV % H == 0). Forward only: serving has no backward.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, F32, I64, BlockSpec, Peer, Shape, Work
from workbench.blocks.kda import GATE_NORMALIZERS, state_dtype
from workbench.blocks.kda import reference as kda_reference


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float,
              state_cache: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """kda's recurrence for one token per sequence from the states in ``slots``. Returns (o [N, HV, V] in v.dtype,
    an updated copy of state_cache); the input cache is left alone."""
    o, states = kda_reference(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], scale, state_cache[slots])
    cache = state_cache.clone()
    cache[slots] = states.to(cache.dtype)
    return o[:, 0], cache


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """kda's distributions for one token of N sequences (q, k L2-normalised, g = logsigmoid(N(0, 1)) / normalizer by
    seed); every slot's state ~ N(0, 1) in the state dtype; slots a random choice of N distinct slots of SLOTS."""
    gen = torch.Generator().manual_seed(seed)
    n, slots, h, hv, dk, dv = (shape[d] for d in ("N", "SLOTS", "H", "HV", "K", "V"))
    if hv % h or n > slots:
        raise ValueError(f"kda_decode: HV={hv} must be a multiple of H={h} and N={n} at most SLOTS={slots}")
    q = F.normalize(torch.rand(n, h, dk, generator=gen), p=2, dim=-1)
    k = F.normalize(torch.rand(n, h, dk, generator=gen), p=2, dim=-1)
    v = torch.rand(n, hv, dv, generator=gen)
    g = F.logsigmoid(torch.randn(n, hv, dk, generator=gen)) / GATE_NORMALIZERS[seed % len(GATE_NORMALIZERS)]
    beta = torch.sigmoid(torch.randn(n, hv, generator=gen))
    cache = state_cache(slots, hv, dk, dv, shape.get("vk", 0), gen)
    chosen = torch.randperm(slots, generator=gen)[:n]
    return {"q": q.to(device, dtype), "k": k.to(device, dtype), "v": v.to(device, dtype), "g": g.to(device, dtype),
            "beta": beta.to(device, dtype), "scale": dk ** -0.5,
            "state_cache": cache.to(device, state_dtype(dtype)), "slots": chosen.to(device)}


def state_cache(slots: int, hv: int, dk: int, dv: int, vk: int, gen: torch.Generator) -> torch.Tensor:
    """A state cache [SLOTS, HV, K, V] ~ N(0, 1): stored K x V, or with ``vk`` V x K (vLLM's layout) and returned as
    its transposed view."""
    if vk:
        return torch.randn(slots, hv, dv, dk, generator=gen).transpose(-1, -2)
    return torch.randn(slots, hv, dk, dv, generator=gen)


SHAPES = {
    "smoke": [
        {"N": 2, "SLOTS": 4, "H": 1, "HV": 2, "K": 16, "V": 16},
        {"N": 4, "SLOTS": 4, "H": 2, "HV": 2, "K": 32, "V": 32, "vk": 1},  # vLLM's V x K cache
    ],
    # one sequence in one slot; a batch in a larger cache with GVA 1:2 and odd head dims (both layouts); V over
    # several V tiles; head dims of one
    "edge": [
        {"N": 1, "SLOTS": 1, "H": 1, "HV": 1, "K": 16, "V": 16},
        {"N": 3, "SLOTS": 8, "H": 2, "HV": 4, "K": 24, "V": 20},
        {"N": 3, "SLOTS": 8, "H": 2, "HV": 4, "K": 24, "V": 20, "vk": 1},
        {"N": 5, "SLOTS": 7, "H": 1, "HV": 1, "K": 16, "V": 80},
        {"N": 2, "SLOTS": 3, "H": 1, "HV": 3, "K": 1, "V": 1},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Two shapes drawn at verification time: any batch up to 9 in a cache up to twice as large, head dims 1-40,
    GVA ratios 1-2, the cache stored K x V or V x K."""
    shapes = []
    for _ in range(2):
        h, n = rng.randint(1, 2), rng.randint(1, 9)
        shapes.append({"N": n, "SLOTS": rng.randint(n, 2 * n), "H": h, "HV": h * rng.randint(1, 2),
                       "K": rng.randint(1, 40), "V": rng.randint(1, 40), "vk": rng.randint(0, 1)})
    return shapes


def work(s: Shape) -> tuple[Work, Work]:
    """Per sequence and value head: the [K, V] float32 state read and written back (the step's traffic), q, k, v, g,
    beta in, o out; about 7 flops per state element (the decay, S^T k, the rank-one update, S^T q). No backward."""
    n, hv, k, v = s["N"], s["HV"], s["K"], s["V"]
    state = 2 * F32 * n * hv * k * v
    moved = state + BF16 * (2 * n * s["H"] * k + n * hv * (k + 2 * v + 1)) + I64 * n
    return Work(moved, vector_flops=7 * n * hv * k * v), Work(0.0)


def fla_fused_recurrent_kda(q, k, v, g, beta, scale, state_cache, slots):
    """fla's fused_recurrent_kda forward as vLLM calls it at decode (one token per sequence, the state cache
    updated in place through ssm_state_indices), with the reference's signature."""
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    offsets = torch.arange(q.shape[0] + 1, device=q.device)
    o, _ = fused_recurrent_kda_fwd(q[None], k[None], v[None], g[None], beta[None], initial_state=state_cache,
                                   scale=scale, inplace_final_state=True, cu_seqlens=offsets,
                                   ssm_state_indices=slots)
    return o[0], state_cache


def onboard(model: ModelConfig) -> list[Found]:
    """Every KDA layer serves its decode through this step: the model suite's decode batch against a cache of as many
    slots, stored V x K as vLLM keeps it."""
    if not model.kda_layers:
        return []
    heads, dim = model.kda_heads, model.kda_head_dim
    batch = model.decode_batch
    return [Found("KDA's recurrent decode step over the state cache (serving; vLLM's V x K layout)",
                  model.kda_layers, [{"N": batch, "SLOTS": batch, "H": heads, "HV": heads, "K": dim, "V": dim,
                                      "vk": 1}], model.kda_fields)]


SPEC = BlockSpec(
    name="kda_decode",
    family="linear_attention",
    summary="KDA's recurrent step for serving: one token per sequence, the state cache (K x V or vLLM's V x K) read "
            "and updated in place by slot",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=(),
    outputs=("o", "state_cache"),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    peers=(Peer("fla fused_recurrent_kda", "fla", fla_fused_recurrent_kda),),
    onboard=onboard,
    updated_in_place=("state_cache",),
)
