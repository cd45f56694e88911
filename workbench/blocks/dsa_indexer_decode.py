"""dsa_indexer_decode: one lightning-indexer decode step per sequence being served, over a paged cache of index keys
(DeepSeek Sparse Attention's serving form of dsa_indexer: its selection feeds dsa_decode's ``indices``).

For sequence n, with L = seq_lens[n] tokens already cached and this step's index key k_idx[n]:

    index_cache[block_table[n, L // PAGE], L % PAGE] = k_idx[n]                      in place, rounded to its dtype
    key_s        = index_cache[block_table[n, s // PAGE], s % PAGE]   [DI]    s = 0 .. L (this step's token last)
    scores[n, s] = sum_j w[n, j] * relu(q_idx[n, j] . key_s)   for s <= L;   -inf for L < s < MAXP * PAGE
    indices[n]   = the TOPK positions of largest score, by descending score, ties to the smaller position, then -1
                   padding where L + 1 < TOPK

in float32 (float64 for float64 inputs), like dsa_indexer's scores. A sequence decoded token by token through this
step equals dsa_indexer's prefill of it: step L's scores over 0..L are the prefill's row L, its selection the
prefill's row L's (tests/blocks/test_dsa_indexer_decode.py). The cache layout, the block table and the lengths are
mla_decode's (index keys in place of latents); so are the input factory's traps (rows nobody wrote hold 30.0; unused
table entries point at a spare page).

Shapes: q_idx [N, HI, DI]; k_idx [N, DI]; w [N, HI]; index_cache [PAGES, PAGE, DI] in q_idx's dtype; block_table
[N, MAXP] int32; seq_lens [N] int32 with seq_lens[n] < MAXP * PAGE; topk an int. Outputs: scores [N, MAXP * PAGE]
float32 (float64 for float64 inputs), indices [N, TOPK] int32 (dsa_decode's), and index_cache itself (updated in
place). Forward only: serving has no backward.
Inputs (make_inputs): each sequence's L + 1 tokens drawn as dsa_indexer draws one sequence (on its 1/16 grid, so
every head dot product is exact; random, or ``tie_free: 1``), its last token's query, weights and key this step's, the
others' keys cached in mla_decode's layout. Verification of the indices: dsa_indexer's comparator, each row's
causal keys ending at its last finite truth score (L).
"""

from __future__ import annotations

import random

import torch

from workbench.blocks import dsa_decode, dsa_indexer, mla_decode
from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._dsa import topk_upto
from workbench.blocks.base import BF16, F32, I32, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def reference(q_idx: torch.Tensor, k_idx: torch.Tensor, w: torch.Tensor, index_cache: torch.Tensor,
              block_table: torch.Tensor, seq_lens: torch.Tensor, topk: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This step's key written into an updated copy of the cache, then each sequence's scores over its L + 1 cached
    keys and their top-k. Returns (scores, indices, the updated copy); the input cache is left alone."""
    ct = compute_dtype(q_idx)
    cache = index_cache.clone()
    page = cache.shape[1]
    scores = torch.full((q_idx.shape[0], block_table.shape[1] * page), float("-inf"), dtype=ct, device=q_idx.device)
    for n, length in enumerate(seq_lens.tolist()):
        cache[block_table[n, length // page].long(), length % page] = k_idx[n]
        positions = torch.arange(length + 1, device=q_idx.device)
        keys = cache[block_table[n, positions // page].long(), positions % page].to(ct)  # [L + 1, DI]
        dots = torch.einsum("hd,sd->hs", q_idx[n].to(ct), keys)  # [HI, L + 1]: every index head against every key
        scores[n, :length + 1] = (w[n].to(ct).unsqueeze(-1) * torch.relu(dots)).sum(dim=0)
    return scores, topk_upto(scores, seq_lens, topk).to(torch.int32), cache


def abstract_outputs(q_idx, k_idx, w, index_cache, block_table, seq_lens, topk):
    """The outputs' shapes and dtypes without reading the lengths (the library op's fake implementation)."""
    n, width = q_idx.shape[0], block_table.shape[1] * index_cache.shape[1]
    return (q_idx.new_empty(n, width, dtype=compute_dtype(q_idx)), q_idx.new_empty(n, topk, dtype=torch.int32),
            index_cache)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """q_idx [N, HI, DI], k_idx [N, DI], w [N, HI], index_cache [PAGES, PAGE, DI] in ``dtype``, mla_decode's block
    table and lengths, topk an int (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    hi, di, page = shape["HI"], shape["DI"], shape["PAGE"]
    lengths, table, pages = mla_decode.layout(shape, seed)
    drawn = [dsa_indexer.draw_inputs(1, length + 1, hi, di, shape.get("tie_free", 0), g) for length in lengths]
    q, k, w = (torch.stack([x[i][0, -1] for x in drawn]) for i in range(3))  # each sequence's last token
    cache = mla_decode.paged_cache(lengths, table, pages, page, torch.cat([x[1][0, :-1] for x in drawn]))
    return {"q_idx": q.to(device, dtype), "k_idx": k.to(device, dtype), "w": w.to(device, dtype),
            "index_cache": cache.to(device, dtype),
            "block_table": torch.tensor(table, dtype=torch.int32).reshape(shape["N"], shape["MAXP"]).to(device),
            "seq_lens": torch.tensor(lengths, dtype=torch.int32).to(device), "topk": int(shape["TOPK"])}


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """The inputs as meta tensors (the model suite: a pool of N * MAXP + 1 pages, as make_inputs lays out)."""
    n, hi, di, page, maxp = (shape[d] for d in ("N", "HI", "DI", "PAGE", "MAXP"))
    meta = {"device": "meta"}
    return {"q_idx": torch.empty(n, hi, di, dtype=dtype, **meta), "k_idx": torch.empty(n, di, dtype=dtype, **meta),
            "w": torch.empty(n, hi, dtype=dtype, **meta),
            "index_cache": torch.empty(n * maxp + 1, page, di, dtype=dtype, **meta),
            "block_table": torch.empty(n, maxp, dtype=torch.int32, **meta),
            "seq_lens": torch.empty(n, dtype=torch.int32, **meta), "topk": int(shape["TOPK"])}


SHAPES = {
    "smoke": [
        {"N": 2, "HI": 4, "DI": 32, "PAGE": 16, "MAXP": 3, "TOPK": 16, "tie_free": 0},
        {"N": 3, "HI": 2, "DI": 16, "PAGE": 8, "MAXP": 4, "TOPK": 8, "tie_free": 1},
    ],
    # one sequence in one page selecting more than it holds; pages of one row, odd heads and width, tie-free; a
    # selection of one over many heads; topk just past a power of two over pages wider than a key block; more heads
    # than a head tile
    "edge": [
        {"N": 1, "HI": 1, "DI": 16, "PAGE": 16, "MAXP": 1, "TOPK": 32, "tie_free": 0},
        {"N": 5, "HI": 3, "DI": 24, "PAGE": 1, "MAXP": 40, "TOPK": 20, "tie_free": 1},
        {"N": 2, "HI": 7, "DI": 20, "PAGE": 4, "MAXP": 5, "TOPK": 1, "tie_free": 0},
        {"N": 2, "HI": 4, "DI": 32, "PAGE": 128, "MAXP": 1, "TOPK": 33, "tie_free": 0},
        {"N": 3, "HI": 20, "DI": 16, "PAGE": 8, "MAXP": 6, "TOPK": 40, "tie_free": 1},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """mla_decode's two drawn layouts, one with random and one with tie-free inputs: 1-20 index heads of width
    16-32, a selection of 1-48 positions."""
    return [{"N": s["N"], "HI": rng.randint(1, 20), "DI": rng.randint(16, 32), "PAGE": s["PAGE"], "MAXP": s["MAXP"],
             "TOPK": rng.randint(1, 48), "tie_free": tie_free}
            for s, tie_free in zip(mla_decode.hidden_shapes(rng), (0, 1), strict=True)]


def work(s: Shape) -> tuple[Work, Work]:
    """Every sequence's pages full (MAXP * PAGE keys, as mla_decode counts): the index keys read once for all HI
    heads, the queries and weights in, the float32 scores and int32 selection out, this step's key written; 2 HI DI
    flops per cached key (the selection's comparisons not counted). No backward."""
    n, hi, di = s["N"], s["HI"], s["DI"]
    keys = n * s["MAXP"] * s["PAGE"]
    moved = BF16 * (keys * di + n * hi * (di + 1) + n * di) + F32 * keys + I32 * n * (s["MAXP"] + 1 + s["TOPK"])
    return Work(moved, 2 * keys * hi * di), Work(0.0)


def onboard(model: ModelConfig) -> list[Found]:
    """Every DSA layer over an MLA latent (dsa_decode's rule finds them) selects its decode step's keys through this
    step: dsa_decode's batch and pages (mla_decode's), the lightning indexer's heads, head size and top-k."""
    return [Found(f"lightning indexer decode over the paged index-key cache (serving, top {shape['topk']})",
                  entry.layers, [{"N": paged["N"], "HI": shape["HI"], "DI": shape["DI"], "PAGE": paged["PAGE"],
                                  "MAXP": paged["MAXP"], "TOPK": shape["topk"], "tie_free": 0}],
                  indexer.fields)
            for entry in dsa_decode.onboard(model) for paged in entry.shapes[:1]
            for indexer in dsa_indexer.onboard(model) for shape in indexer.shapes[:1]]


SPEC = BlockSpec(
    name="dsa_indexer_decode",
    family="attention",
    summary="DSA lightning indexer decode for serving: one token per sequence, relu-weighted index scores over a "
            "paged cache of index keys and their top-k, this step's key written in place",
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
