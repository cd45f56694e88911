"""dsa_indexer_prefill: DSA's lightning indexer over packed prompts for serving, each token scoring its sequence's
keys (a cached prefix in the paged index-key cache, then the new tokens up to itself) and selecting its top-k, the new
index keys written into the cache (dsa_indexer_decode's step with many tokens per sequence; dsa_indexer's prefill
over a chunk that continues a sequence).

For sequence n, with L = seq_lens[n] index keys cached and its T new tokens rows r = cu_seqlens[n] + t:

    index_cache[block_table[n, (L + t) // PAGE], (L + t) % PAGE] = k_idx[r]                      in place
    key_s        = the sequence's index key at position s (cached below L, new from L on)
    scores[r, s] = sum_j w[r, j] * relu(q_idx[r, j] . key_s)   for s <= L + t;   -inf for L + t < s < MAXP * PAGE
    indices[r]   = the TOPK positions of largest score, descending, ties to the smaller position, then -1 padding

in float32 (float64 for float64 inputs). A prompt prefilled in chunks, or prefilled then decoded token by token with
dsa_indexer_decode, equals it prefilled at once, and a prompt from its first token is dsa_indexer's prefill of it
(tests/blocks/test_dsa_indexer_prefill.py). Verification of the indices: dsa_indexer's comparator, each row's keys
ending at its last finite truth score (L + t).

Shapes: q_idx [TOTAL, HI, DI]; k_idx [TOTAL, DI]; w [TOTAL, HI]; index_cache [PAGES, PAGE, DI] in q_idx's dtype;
block_table [S, MAXP] int32; seq_lens [S] int32; cu_seqlens [S + 1] int32; topk an int. Outputs: scores [TOTAL,
MAXP * PAGE] float32 (float64 for float64 inputs), indices [TOTAL, TOPK] int32 (dsa_prefill's), index_cache (updated
in place). Forward only.
Inputs (make_inputs): mla_prefill's layout; each sequence's L + T tokens drawn as dsa_indexer draws one sequence (on
its 1/16 grid: every head dot product exact; random, or ``tie_free: 1``), the first L keys cached, the last T the
new tokens' queries, weights and keys.
"""

from __future__ import annotations

import random

import torch

from workbench.blocks import _packed, dsa_indexer, dsa_indexer_decode, mla_decode, mla_prefill
from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._dsa import topk_upto
from workbench.blocks.base import BF16, F32, I32, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def reference(q_idx: torch.Tensor, k_idx: torch.Tensor, w: torch.Tensor, index_cache: torch.Tensor,
              block_table: torch.Tensor, seq_lens: torch.Tensor, cu_seqlens: torch.Tensor, topk: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The new keys written into an updated copy of the cache, then each token's scores over its sequence's keys up
    to itself and their top-k. Returns (scores, indices, the updated copy); the input cache is left alone."""
    ct = compute_dtype(q_idx)
    cache = index_cache.clone()
    page = cache.shape[1]
    scores = torch.full((q_idx.shape[0], block_table.shape[1] * page), float("-inf"), dtype=ct, device=q_idx.device)
    limits = torch.zeros(q_idx.shape[0], dtype=torch.int64, device=q_idx.device)
    bounds = cu_seqlens.tolist()
    for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        length = int(seq_lens[n])
        fresh = torch.arange(length, length + end - start, device=q_idx.device)
        cache[block_table[n, fresh // page].long(), fresh % page] = k_idx[start:end].to(cache.dtype)
        positions = torch.arange(length + end - start, device=q_idx.device)
        keys = cache[block_table[n, positions // page].long(), positions % page].to(ct)  # [L + T, DI]
        dots = torch.einsum("thd,sd->ths", q_idx[start:end].to(ct), keys)  # [T, HI, L + T]
        rows = (w[start:end].to(ct).unsqueeze(-1) * torch.relu(dots)).sum(dim=1)  # [T, L + T]
        seen = positions[None, :] <= fresh[:, None]
        scores[start:end, :length + end - start] = rows.masked_fill(~seen, float("-inf"))
        limits[start:end] = fresh
    return scores, topk_upto(scores, limits, topk).to(torch.int32), cache


def abstract_outputs(q_idx, k_idx, w, index_cache, block_table, seq_lens, cu_seqlens, topk):
    """The outputs' shapes and dtypes (the library op's fake implementation)."""
    total, width = q_idx.shape[0], block_table.shape[1] * index_cache.shape[1]
    return (q_idx.new_empty(total, width, dtype=compute_dtype(q_idx)),
            q_idx.new_empty(total, topk, dtype=torch.int32), index_cache)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    g = torch.Generator().manual_seed(seed)
    hi, di, page = shape["HI"], shape["DI"], shape["PAGE"]
    new, lengths, table, pages = mla_prefill.layout(shape, seed, g)
    drawn = [dsa_indexer.draw_inputs(1, length + t, hi, di, shape.get("tie_free", 0), g)
             for length, t in zip(lengths, new, strict=True)]
    q, k, w = (torch.cat([x[i][0, length:] for x, length in zip(drawn, lengths, strict=True)]) for i in range(3))
    cached = torch.cat([x[1][0, :length] for x, length in zip(drawn, lengths, strict=True)])
    cache = mla_decode.paged_cache(lengths, table, pages, page, cached)
    return {"q_idx": q.to(device, dtype), "k_idx": k.to(device, dtype), "w": w.to(device, dtype),
            "index_cache": cache.to(device, dtype),
            "block_table": torch.tensor(table, dtype=torch.int32).reshape(shape["S"], shape["MAXP"]).to(device),
            "seq_lens": torch.tensor(lengths, dtype=torch.int32).to(device),
            "cu_seqlens": _packed.offsets(new).to(device), "topk": int(shape["TOPK"])}


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """The inputs as meta tensors (a pool of S * MAXP + 1 pages, as make_inputs lays out)."""
    total, s, hi, di, page, maxp = (shape[d] for d in ("TOTAL", "S", "HI", "DI", "PAGE", "MAXP"))
    meta = {"device": "meta"}
    return {"q_idx": torch.empty(total, hi, di, dtype=dtype, **meta), "k_idx": torch.empty(total, di, dtype=dtype,
                                                                                          **meta),
            "w": torch.empty(total, hi, dtype=dtype, **meta),
            "index_cache": torch.empty(s * maxp + 1, page, di, dtype=dtype, **meta),
            "block_table": torch.empty(s, maxp, dtype=torch.int32, **meta),
            "seq_lens": torch.empty(s, dtype=torch.int32, **meta),
            "cu_seqlens": torch.empty(s + 1, dtype=torch.int32, **meta), "topk": int(shape["TOPK"])}


SHAPES = {
    "smoke": [
        {"TOTAL": 20, "S": 3, "HI": 4, "DI": 32, "PAGE": 16, "MAXP": 3, "TOPK": 16, "tie_free": 0},
        {"TOTAL": 24, "S": 4, "HI": 2, "DI": 16, "PAGE": 8, "MAXP": 4, "TOPK": 8, "tie_free": 1},
    ],
    # one token selecting more than it has; one token among empty sequences; pages of one row, odd heads and width,
    # tie-free; a selection of one; a prompt filling its pages, more heads than a head tile
    "edge": [
        {"TOTAL": 1, "S": 1, "HI": 1, "DI": 16, "PAGE": 16, "MAXP": 1, "TOPK": 32, "tie_free": 0},
        {"TOTAL": 1, "S": 3, "HI": 2, "DI": 16, "PAGE": 4, "MAXP": 2, "TOPK": 4, "tie_free": 0},
        {"TOTAL": 17, "S": 3, "HI": 3, "DI": 24, "PAGE": 1, "MAXP": 24, "TOPK": 20, "tie_free": 1},
        {"TOTAL": 9, "S": 2, "HI": 7, "DI": 20, "PAGE": 4, "MAXP": 5, "TOPK": 1, "tie_free": 0},
        {"TOTAL": 32, "S": 1, "HI": 20, "DI": 16, "PAGE": 16, "MAXP": 2, "TOPK": 33, "tie_free": 1},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """mla_prefill's two layouts, one with random and one with tie-free inputs: 1-20 index heads of width 16-32, a
    selection of 1-48 positions."""
    return [{"TOTAL": s["TOTAL"], "S": s["S"], "HI": rng.randint(1, 20), "DI": rng.randint(16, 32),
             "PAGE": s["PAGE"], "MAXP": s["MAXP"], "TOPK": rng.randint(1, 48), "tie_free": tie_free}
            for s, tie_free in zip(mla_prefill.hidden_shapes(rng), (0, 1), strict=True)]


def work(s: Shape) -> tuple[Work, Work]:
    """Every new token scores its sequence's keys (the pages full, as mla_prefill counts them, less the new tokens;
    and half the new ones on average): the keys read once per token for all HI heads, the float32 score row and the
    int32 selection out, the new keys written; 2 HI DI flops per (token, key) (the selection not counted)."""
    total, n, hi, di = s["TOTAL"], s["S"], s["HI"], s["DI"]
    width = s["MAXP"] * s["PAGE"]
    keys = max(0, n * width - total) / max(n, 1) + total / max(n, 1) / 2
    moved = BF16 * (total * keys * di + total * hi * (di + 1) + total * di) + F32 * total * width \
        + I32 * (total * s["TOPK"] + n * (s["MAXP"] + 2) + 1)
    return Work(moved, 2 * total * keys * hi * di), Work(0.0)


def onboard(model: ModelConfig) -> list[Found]:
    """Every DSA layer's indexer prefills through this step: dsa_indexer_decode's heads, width and top-k at
    mla_prefill's packing."""
    packed = [found.shapes[0] for found in mla_prefill.onboard(model)]
    return [Found(f"lightning indexer over packed prompts from the paged index-key cache (serving prefill, top "
                  f"{entry.shapes[0]['TOPK']})", entry.layers,
                  [{**{k: packed[0][k] for k in ("TOTAL", "S", "PAGE", "MAXP")},
                    **{k: entry.shapes[0][k] for k in ("HI", "DI", "TOPK", "tie_free")}}], entry.fields)
            for entry in dsa_indexer_decode.onboard(model) if packed]


SPEC = BlockSpec(
    name="dsa_indexer_prefill",
    family="attention",
    summary="DSA lightning indexer prefill for serving: packed prompts (cu_seqlens), each token's index scores over "
            "its sequence's keys in a paged cache and the new ones, their top-k, the new keys written in place",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=(),
    outputs=("scores", "indices", "index_cache"),
    shapes=SHAPES,
    comparators={"forward:indices": dsa_indexer.compare_indices},
    hidden_shapes=hidden_shapes,
    abstract_inputs=abstract_inputs,
    abstract_outputs=abstract_outputs,
    work=work,
    onboard=onboard,
    updated_in_place=("index_cache",),
)
