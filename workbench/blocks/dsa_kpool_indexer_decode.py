"""dsa_kpool_indexer_decode: one decode step of the lightning indexer over k-pools per sequence being served
(GLM-5-Next's ``Glm5NextTextIndexer`` with a cache: the serving form of dsa_kpool_indexer), over a paged cache of
the index keys and the pools' gate scores; its selection feeds dsa_decode's ``indices``.

For sequence n, with L = seq_lens[n] tokens already cached and this step's key k_idx[n] and gate score gate[n]:

    index_cache[block_table[n, L // PAGE], L % PAGE] = [k_idx[n] | gate[n]]              in place, in its dtype
    key_s, gate_s = the cached row of position s = 0 .. L (this step's last)
    K[p]          = sum_j softmax_j(gate_{pP+j} + ape[j]) * key_{pP+j}      each complete pool p < (L + 1) // P
    scores[n, p]  = sum_h w[n,h] * relu(q_idx[n,h] . K[p])  for complete pools; -inf up to (MAXP * PAGE) // P
    pools[n]      = the top SK = topk // P complete pools, by descending score, ties to the smaller pool, -1 padded
    indices[n]    = the pools' keys, then (``tail``) the incomplete pool's keys (L + 1) - (L + 1) % P .. L, -1
                    padded to W = topk (+ P - 1 with the tail): dsa_kpool_indexer's row L, in cache positions

in float32 (float64 for float64 inputs), as dsa_kpool_indexer computes the prefill. transformers' indexer caches the
same rows (its packed states [key | gate | valid]) and pools them again at every step; a sequence decoded token by
token through this step equals dsa_kpool_indexer's prefill of it (tests/blocks/test_dsa_kpool_indexer_decode.py).
The cache layout, block table and lengths are mla_decode's, rows 2 DI wide; so are the input factory's traps.

Shapes: q_idx [N,HI,DI], k_idx [N,DI], w [N,HI], gate [N,DI], ape [P,DI]; index_cache [PAGES,PAGE,2 DI] in q_idx's
dtype; block_table [N,MAXP] int32; seq_lens [N] int32 (< MAXP * PAGE); topk an int, tail a bool. Outputs: scores
[N,(MAXP * PAGE) // P] float32 (float64 for float64 inputs), pools [N,topk // P] int32, indices [N,W] int32
(dsa_decode's), and index_cache itself (updated in place). Forward only: serving has no backward.
Inputs (make_inputs): each sequence's L + 1 tokens as dsa_kpool_indexer draws one sequence, its last token's query,
weights, key and gate this step's. Verification: the pools by dsa_indexer's comparator (each row's complete pools
end at its last finite truth score), the indices by dsa_kpool_indexer's (each row's query at its length).
"""

from __future__ import annotations

import random

import torch

from workbench.blocks import dsa_decode, dsa_indexer, dsa_kpool_indexer, mla_decode
from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._dsa import topk_upto
from workbench.blocks.base import BF16, F32, I32, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def reference(q_idx: torch.Tensor, k_idx: torch.Tensor, w: torch.Tensor, gate: torch.Tensor, ape: torch.Tensor,
              index_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, topk: int, tail: bool
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """This step's row written into an updated copy of the cache, then each sequence's pools over its L + 1 cached
    rows. Returns (scores, pools, indices, the updated copy); the input cache is left alone."""
    ct = compute_dtype(q_idx)
    cache = index_cache.clone()
    (pool, di), page = ape.shape, cache.shape[1]
    scores = torch.full((q_idx.shape[0], block_table.shape[1] * page // pool), float("-inf"), dtype=ct,
                        device=q_idx.device)
    for n, length in enumerate(seq_lens.tolist()):
        cache[block_table[n, length // page].long(), length % page] = torch.cat([k_idx[n], gate[n]])
        positions = torch.arange(length + 1, device=q_idx.device)
        rows = cache[block_table[n, positions // page].long(), positions % page][None]  # [1, L + 1, 2 DI]
        pooled = dsa_kpool_indexer.pooled_keys(rows[..., :di], rows[..., di:], ape)[0]  # [(L + 1) // P, DI]
        dots = torch.einsum("hd,pd->hp", q_idx[n].to(ct), pooled)
        scores[n, :pooled.shape[0]] = (w[n].to(ct).unsqueeze(-1) * torch.relu(dots)).sum(dim=0)
    last_pool = (seq_lens.long() + 1) // pool - 1
    pools = topk_upto(scores, last_pool, topk // pool)
    width = topk + (pool - 1 if tail else 0)
    indices = dsa_kpool_indexer.expand(pools, seq_lens.long(), pool, width, tail)
    return scores, pools.to(torch.int32), indices.to(torch.int32), cache


def abstract_outputs(q_idx, k_idx, w, gate, ape, index_cache, block_table, seq_lens, topk, tail):
    """The outputs' shapes and dtypes without reading the lengths (the library op's fake implementation)."""
    n, pool = q_idx.shape[0], ape.shape[0]
    width = topk + (pool - 1 if tail else 0)
    return (q_idx.new_empty(n, block_table.shape[1] * index_cache.shape[1] // pool, dtype=compute_dtype(q_idx)),
            q_idx.new_empty(n, topk // pool, dtype=torch.int32), q_idx.new_empty(n, width, dtype=torch.int32),
            index_cache)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """q_idx [N,HI,DI], k_idx, gate [N,DI], w [N,HI], ape [P,DI], index_cache [PAGES,PAGE,2 DI] in ``dtype``,
    mla_decode's block table and lengths, topk and tail from the shape (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    hi, di, page = shape["HI"], shape["DI"], shape["PAGE"]
    lengths, table, pages = mla_decode.layout(shape, seed)
    drawn = [(*dsa_indexer.draw_inputs(1, length + 1, hi, di, 0, g), torch.randn(1, length + 1, di, generator=g))
             for length in lengths]
    q, k, w, gate = (torch.stack([x[i][0, -1] for x in drawn]) for i in range(4))  # each sequence's last token
    rows = torch.cat([torch.cat([x[1][0, :-1], x[3][0, :-1]], dim=-1) for x in drawn])
    cache = mla_decode.paged_cache(lengths, table, pages, page, rows)
    tensors = {"q_idx": q, "k_idx": k, "w": w, "gate": gate, "ape": 0.5 * torch.randn(shape["P"], di, generator=g),
               "index_cache": cache}
    return {**{name: x.to(device, dtype) for name, x in tensors.items()},
            "block_table": torch.tensor(table, dtype=torch.int32).reshape(shape["N"], shape["MAXP"]).to(device),
            "seq_lens": torch.tensor(lengths, dtype=torch.int32).to(device), "topk": int(shape["TOPK"]),
            "tail": bool(shape["tail"])}


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """The inputs as meta tensors (the model suite: a pool of N * MAXP + 1 pages, as make_inputs lays out)."""
    n, hi, di, page, maxp = (shape[d] for d in ("N", "HI", "DI", "PAGE", "MAXP"))
    meta = {"device": "meta", "dtype": dtype}
    return {"q_idx": torch.empty(n, hi, di, **meta), "k_idx": torch.empty(n, di, **meta),
            "w": torch.empty(n, hi, **meta), "gate": torch.empty(n, di, **meta),
            "ape": torch.empty(shape["P"], di, **meta), "index_cache": torch.empty(n * maxp + 1, page, 2 * di, **meta),
            "block_table": torch.empty(n, maxp, dtype=torch.int32, device="meta"),
            "seq_lens": torch.empty(n, dtype=torch.int32, device="meta"), "topk": int(shape["TOPK"]),
            "tail": bool(shape["tail"])}


SHAPES = {
    "smoke": [
        {"N": 2, "HI": 4, "DI": 32, "P": 4, "PAGE": 16, "MAXP": 3, "TOPK": 16, "tail": 1},
        {"N": 3, "HI": 2, "DI": 16, "P": 8, "PAGE": 8, "MAXP": 4, "TOPK": 16, "tail": 0},
    ],
    # one sequence in one page, fewer keys than a pool for the empty one; pools wider than pages (a pool over
    # several pages) with odd heads and width; a pool of one key (dsa_indexer_decode's selection); more pools wanted
    # than a sequence ever completes, topk not a multiple of P; more heads than a head tile
    "edge": [
        {"N": 1, "HI": 1, "DI": 16, "P": 4, "PAGE": 16, "MAXP": 1, "TOPK": 32, "tail": 1},
        {"N": 4, "HI": 3, "DI": 24, "P": 8, "PAGE": 2, "MAXP": 20, "TOPK": 24, "tail": 1},
        {"N": 2, "HI": 5, "DI": 20, "P": 1, "PAGE": 4, "MAXP": 5, "TOPK": 6, "tail": 1},
        {"N": 2, "HI": 2, "DI": 16, "P": 16, "PAGE": 8, "MAXP": 6, "TOPK": 130, "tail": 1},
        {"N": 3, "HI": 20, "DI": 16, "P": 4, "PAGE": 8, "MAXP": 6, "TOPK": 13, "tail": 0},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """mla_decode's two drawn layouts with and without the tail: 1-20 index heads of width 16-32, pools of 1-16
    keys, a selection from P - 1 to past the longest sequence."""
    shapes = []
    for s, tail in zip(mla_decode.hidden_shapes(rng), (0, 1), strict=True):
        pool = rng.choice([1, 2, 4, 8, 16])
        shapes.append({"N": s["N"], "HI": rng.randint(1, 20), "DI": rng.randint(16, 32), "P": pool,
                       "PAGE": s["PAGE"], "MAXP": s["MAXP"],
                       "TOPK": rng.randint(max(1, pool - 1), s["MAXP"] * s["PAGE"] + 16), "tail": tail})
    return shapes


def work(s: Shape) -> tuple[Work, Work]:
    """Every sequence's pages full (MAXP * PAGE keys, as mla_decode counts): the cached keys and gate scores read
    once (pooled: an exp and two multiply-adds per channel), the pooled keys scored by every head (2 HI DI flops a
    pool), the queries in, the float32 scores and int32 selection out, this step's row written. No backward."""
    n, hi, di, pool = s["N"], s["HI"], s["DI"], s["P"]
    keys = n * s["MAXP"] * s["PAGE"]
    width = s["TOPK"] + (pool - 1 if s["tail"] else 0)
    moved = BF16 * (2 * keys * di + n * hi * (di + 1) + 2 * n * di + pool * di) + F32 * keys // pool + \
        I32 * n * (s["MAXP"] + 1 + s["TOPK"] // pool + width)
    return Work(moved, 5 * keys * di + 2 * (keys // pool) * hi * di), Work(0.0)


def onboard(model: ModelConfig) -> list[Found]:
    """Every DSA layer over an MLA latent whose indexer scores k-pools (dsa_decode's and dsa_kpool_indexer's rules
    find them) selects its decode step's keys through this step: dsa_decode's batch and pages (mla_decode's), the
    indexer's heads, head size, pool, top-k and tail."""
    return [Found(f"lightning indexer decode over k-pools of the paged index cache (serving, top {shape['topk']} "
                  "keys)", entry.layers,
                  [{"N": paged["N"], "HI": shape["HI"], "DI": shape["DI"], "P": shape["P"], "PAGE": paged["PAGE"],
                    "MAXP": paged["MAXP"], "TOPK": shape["topk"], "tail": shape["tail"]}], indexer.fields)
            for entry in dsa_decode.onboard(model) for paged in entry.shapes[:1]
            for indexer in dsa_kpool_indexer.onboard(model) for shape in indexer.shapes[:1]]


SPEC = BlockSpec(
    name="dsa_kpool_indexer_decode",
    family="attention",
    summary="DSA lightning indexer decode over k-pools for serving: one token per sequence, the paged cache's "
            "complete pools pooled and scored, the top pools expanded into their keys with the tail, this step's "
            "key and gate score written in place",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=(),
    outputs=("scores", "pools", "indices", "index_cache"),
    shapes=SHAPES,
    comparators={"forward:pools": dsa_indexer.compare_indices,
                 "forward:indices": dsa_kpool_indexer.compare_expanded},
    hidden_shapes=hidden_shapes,
    abstract_inputs=abstract_inputs,
    abstract_outputs=abstract_outputs,
    work=work,
    onboard=onboard,
    supersedes=("dsa_indexer_decode",),
    updated_in_place=("index_cache",),
)
