"""dsa_sparse_attention: attention of each query over its selected keys only (DeepSeek Sparse Attention, DeepSeek-V3.2;
the gated DSA of Kimi, whose output passes a sigmoid gate as in Qwen's gated attention).

    for query t of batch b, head h (kv head g = h // (H / HKV)), S = {s = indices[b,t,i] : s >= 0}:
    o[b,t,h]   = sum_{s in S} softmax_s(scale * q[b,t,h] . k[b,s,g]) v[b,s,g]        (0 when S is empty)
    out[b,t,h] = o[b,t,h] * sigmoid(gate[b,t,h])                                  (gate given)
    out[b,t,h] = o[b,t,h]                                                          (gate None)

The selection is shared by all query heads (MQA/GQA: H % HKV == 0; DSA in MLA mode has HKV = 1). Entries of a row are
distinct key positions (as the indexer's top-k gives), in any order, with -1 padding anywhere (the indexer pads at the
end); a row with no valid entry outputs 0. The attention does not re-apply causality: it trusts the selection.

Shapes: q [B,T,H,D], k [B,T,HKV,D], v [B,T,HKV,DV], indices [B,T,topk] int64, gate [B,T,H,DV] or None, scale a
float; out [B,T,H,DV]. The values may be narrower (or wider) than the keys: MLA's decompressed heads score with
nope + rope = 192 dims and carry 128 values (K3's), its absorbed MQA form scores with [c_kv | k_rope] = 576 and
carries c_kv = 512 (DeepSeek-V3.2's serving form).
Gradients: q, k, v and gate (when given); none for indices. Computed in float32 (float64 for float64 inputs), cast to
q.dtype once at the end.
Inputs (make_inputs): q, k, v ~ N(0, 1), scale = D^-0.5, gate pre-activations ~ N(0, 1.5^2) (both sigmoid tails);
indices from the causal top-k of random scores with a recency bias (the usual DSA pattern: recent keys are chosen
more often), so early rows are padded; and B*T // 16 rows emptied entirely (all -1) to exercise the zero-output rule.
Shapes with ``gated: 1`` pass a gate, ``gated: 0`` pass None; shape dim ``DV`` (default D) is the value width.
"""

from __future__ import annotations

import random

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._dsa import causal_topk
from workbench.blocks.base import BF16, I64, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, gate: torch.Tensor | None,
              scale: float) -> torch.Tensor:
    ct = compute_dtype(q)
    B, T, H, D = q.shape
    HKV = k.shape[2]
    qg = q.to(ct).view(B, T, HKV, H // HKV, D)  # query heads grouped by the kv head they share
    valid = indices >= 0  # [B, T, topk]
    rows = torch.arange(B, device=q.device)[:, None, None]
    k_sel = k.to(ct)[rows, indices.clamp(min=0)]  # [B, T, topk, HKV, D]: each query's selected keys
    v_sel = v.to(ct)[rows, indices.clamp(min=0)]
    logits = torch.einsum("btgjd,btigd->btgji", qg, k_sel) * scale  # [B, T, HKV, G, topk]
    logits = logits.masked_fill(~valid[:, :, None, None, :], float("-inf"))
    nonempty = valid.any(dim=-1)[:, :, None, None, None]
    logits = torch.where(nonempty, logits, torch.zeros_like(logits))  # keep softmax finite on empty rows
    probs = torch.softmax(logits, dim=-1) * nonempty  # empty rows attend to nothing: output 0
    out = torch.einsum("btgji,btigd->btgjd", probs, v_sel).reshape(B, T, H, v.shape[-1])
    if gate is not None:
        out = out * torch.sigmoid(gate.to(ct))
    return out.to(q.dtype)


# --- inputs ----------------------------------------------------------------------------------------------------

RECENCY = 0.05
"""Score penalty per token of distance when drawing the selection: nearer keys are selected more often."""


def make_indices(B: int, T: int, topk: int, g: torch.Generator) -> torch.Tensor:
    """[B, T, topk] int64: causal top-k of N(0, 1) - RECENCY * (t - s) scores, then B*T // 16 random rows emptied."""
    t = torch.arange(T)
    scores = torch.randn(B, T, T, generator=g) - RECENCY * (t[:, None] - t[None, :]).clamp(min=0)
    indices = causal_topk(scores, topk)
    empty = torch.randperm(B * T, generator=g)[: (B * T) // 16]
    indices.view(B * T, topk)[empty] = -1
    return indices


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """q [B,T,H,D], k [B,T,HKV,D], v [B,T,HKV,DV], gate [B,T,H,DV] (or None when ``gated`` is 0) in ``dtype``;
    indices [B,T,topk] int64; scale = D^-0.5."""
    g = torch.Generator().manual_seed(seed)
    B, T, H, HKV, D, topk = (shape[n] for n in ("B", "T", "H", "HKV", "D", "topk"))
    DV = shape.get("DV", D)
    q = torch.randn(B, T, H, D, generator=g)
    k = torch.randn(B, T, HKV, D, generator=g)
    v = torch.randn(B, T, HKV, DV, generator=g)
    gate = 1.5 * torch.randn(B, T, H, DV, generator=g)
    indices = make_indices(B, T, topk, g)
    return {"q": q.to(device, dtype), "k": k.to(device, dtype), "v": v.to(device, dtype),
            "indices": indices.to(device), "gate": gate.to(device, dtype) if shape.get("gated", 1) else None,
            "scale": D ** -0.5}


# --- shapes ----------------------------------------------------------------------------------------------------

SHAPES = {
    "smoke": [
        {"B": 1, "T": 32, "H": 2, "HKV": 1, "D": 16, "topk": 8, "gated": 1},
        {"B": 2, "T": 48, "H": 4, "HKV": 2, "D": 32, "topk": 16, "gated": 0},
        {"B": 1, "T": 24, "H": 4, "HKV": 1, "D": 24, "DV": 16, "topk": 8, "gated": 1},  # MLA: values narrower
    ],
    # one token (topk > T); MQA with a tail T; MHA (G = 1) with odd H and a non-power-of-two D; topk past every
    # row's causal keys with GQA; topk just past a power of two
    "edge": [
        {"B": 1, "T": 1, "H": 1, "HKV": 1, "D": 16, "topk": 4, "gated": 1},
        {"B": 2, "T": 77, "H": 4, "HKV": 1, "D": 32, "topk": 20, "gated": 1},
        {"B": 1, "T": 80, "H": 3, "HKV": 3, "D": 24, "topk": 33, "gated": 0},
        {"B": 1, "T": 45, "H": 4, "HKV": 2, "D": 16, "topk": 64, "gated": 1},
        {"B": 2, "T": 19, "H": 3, "HKV": 1, "D": 20, "topk": 17, "gated": 0},
        {"B": 1, "T": 33, "H": 2, "HKV": 1, "D": 18, "DV": 16, "topk": 12, "gated": 0},  # absorbed MLA: D = DV + 2
        {"B": 1, "T": 21, "H": 2, "HKV": 2, "D": 16, "DV": 40, "topk": 9, "gated": 1},  # values wider than keys
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """A gated and an ungated shape within the suites' ranges, H a multiple of HKV, topk from 1 to past T, the
    values as wide as the keys or not."""
    shapes = []
    for gated in (1, 0):
        T, HKV = rng.randint(1, 80), rng.randint(1, 2)
        shapes.append({"B": rng.randint(1, 2), "T": T, "H": HKV * rng.randint(1, 4 // HKV), "HKV": HKV,
                       "D": rng.randint(16, 32), "DV": rng.randint(16, 32), "topk": rng.randint(1, T + 16),
                       "gated": gated})
    return shapes


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """Each query attends to its topk selected keys (keys D wide, values DV)."""
    b, t, h, hkv, d, k = s["B"], s["T"], s["H"], s["HKV"], s["D"], s["topk"]
    dv = s.get("DV", d)
    inputs = BF16 * (b * t * h * (d + dv * s.get("gated", 0)) + b * t * hkv * (d + dv)) + I64 * b * t * k
    outputs = BF16 * b * t * h * dv
    flops = 2 * b * t * k * h * (d + dv)
    return Work(inputs + outputs, flops), Work(2 * inputs + outputs, int(2.5 * flops))


def onboard(model: ModelConfig) -> list[Found]:
    """The full-attention layers of a config with index_topk; over an MLA latent (kv_lora_rank) the absorbed MQA
    form: keys [c_kv | k_rope], values c_kv."""
    if not model.full_layers:
        return []
    topk, topk_field = model.integer("index_topk")
    if not topk:
        return []
    rank, rank_field = model.integer("kv_lora_rank")
    latent = (rank or 0) + (model.integer("qk_rope_head_dim")[0] or 0)
    shape = {"B": 1, "T": model.tokens, "H": model.heads, "HKV": 1, "D": latent or model.head_dim, "topk": topk,
             "gated": 0}
    if rank:
        shape["DV"] = rank
    return [Found("sparse attention over the selected keys", model.full_layers, [shape],
                  [topk_field, rank_field, model.heads_field])]


SPEC = BlockSpec(
    name="dsa_sparse_attention",
    family="attention",
    summary="DSA sparse attention over per-query selected keys (GQA/MQA), optional sigmoid output gate",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("q", "k", "v", "gate"),
    outputs=("out",),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    onboard=onboard,
    replay="D",
)
