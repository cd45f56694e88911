"""dsa_decode: one DSA decode step per sequence being served, the sparse MQA over a paged latent cache at the
positions the indexer selected (DeepSeek Sparse Attention in its absorbed serving form: FlashMLA's sparse decode over
the paged cache, fed the lightning indexer's top-k; mla_decode is the dense form of the same step).

For sequence n, with L = seq_lens[n] tokens already cached and this step's latent (c_kv[n] | k_rope[n]):

    latent_cache[block_table[n, L // PAGE], L % PAGE] = [c_kv[n] | k_rope[n]]        in place, rounded to its dtype
    S       = {s = indices[n, i] : 0 <= s <= L}         the selected positions (L: this step's token), -1 padding
    key_s   = latent_cache[block_table[n, s // PAGE], s % PAGE]   [R + DR];   value_s = key_s[:R]
    o[n, h] = sum_{s in S} softmax_s(scale * q[n, h] . key_s) value_s          (0 when S is empty)

in float32, cast to q.dtype once. Entries of a row are distinct positions in any order (the indexer's top-k over the
causal keys, this step's token among the candidates); the step does not re-apply causality: it trusts the selection.
A sequence decoded token by token through this step with each token's selection equals dsa_sparse_attention's
absorbed form over the whole sequence (keys [c_kv | k_rope], values c_kv, one kv head) with the same selections
(tests/blocks/test_dsa_decode.py). The cache layout, the block table and the lengths are mla_decode's; so are the
input factory's traps (rows nobody wrote hold 30.0; unused table entries point at a spare page).

Shapes: q [N, H, R + DR]; c_kv [N, R]; k_rope [N, DR]; latent_cache [PAGES, PAGE, R + DR] in q's dtype; block_table
[N, MAXP] int32; seq_lens [N] int32 with seq_lens[n] < MAXP * PAGE; indices [N, TOPK] int32. Outputs: o [N, H, R] in
q.dtype, and latent_cache itself (updated in place). Forward only: serving has no backward. Kimi's gated DSA applies
its sigmoid gate after W_uv, outside this step.
Inputs (make_inputs): mla_decode's, and each row's selection the top TOPK of random scores with a recency bias over
positions 0..L (this step's token among them), -1 padded where L + 1 < TOPK, one row in eight emptied.
"""

from __future__ import annotations

import random

import torch

from workbench.blocks import mla_decode
from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, I32, BlockSpec, Shape, Work
from workbench.blocks.dsa_sparse_attention import RECENCY
from workbench.blocks.dsa_sparse_attention import onboard as dsa_onboard
from workbench.numerics import compute_dtype


def reference(q: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor, latent_cache: torch.Tensor,
              block_table: torch.Tensor, seq_lens: torch.Tensor, indices: torch.Tensor,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """This step's latent written into an updated copy of the cache, then each sequence's MQA over its selected
    latents. Returns (o [N, H, R] in q.dtype, the updated copy); the input cache is left alone."""
    ct = compute_dtype(q)
    cache = latent_cache.clone()
    page, r = cache.shape[1], c_kv.shape[-1]
    new = torch.cat([c_kv, k_rope], dim=-1).to(cache.dtype)
    o = torch.zeros(q.shape[0], q.shape[1], r, dtype=ct, device=q.device)
    for n, length in enumerate(seq_lens.tolist()):
        cache[block_table[n, length // page].long(), length % page] = new[n]
        chosen = indices[n][(indices[n] >= 0) & (indices[n] <= length)].long()
        if chosen.numel():
            keys = cache[block_table[n, chosen // page].long(), chosen % page].to(ct)  # [S, R + DR]
            p = torch.softmax(q[n].to(ct) @ keys.T * scale, dim=-1)  # [H, S]
            o[n] = p @ keys[:, :r]
    return o.to(q.dtype), cache


def abstract_outputs(q, c_kv, k_rope, latent_cache, block_table, seq_lens, indices, scale):
    """o's shape and dtype without reading the lengths (the library op's fake implementation)."""
    return q.new_empty(q.shape[0], q.shape[1], c_kv.shape[-1]), latent_cache


def selection(lengths: list[int], topk: int, seed: int) -> list[list[int]]:
    """Each row's top ``topk`` of N(0, 1) - RECENCY * (L - s) scores over s = 0..L, -1 padded, shuffled (any order);
    one row in eight (rounded down) emptied."""
    rng = random.Random(seed + 1)
    rows = []
    for length in lengths:
        scores = sorted(((rng.gauss(0, 1) - RECENCY * (length - s), s) for s in range(length + 1)), reverse=True)
        row = [s for _, s in scores[:topk]] + [-1] * max(0, topk - length - 1)
        rng.shuffle(row)
        rows.append(row)
    for i in rng.sample(range(len(rows)), len(rows) // 8):
        rows[i] = [-1] * topk
    return rows


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    inputs = mla_decode.make_inputs(shape, dtype, seed, device)
    rows = selection(inputs["seq_lens"].tolist(), shape["TOPK"], seed)
    indices = torch.tensor(rows, dtype=torch.int32).reshape(shape["N"], shape["TOPK"]).to(device)
    return {**{k: v for k, v in inputs.items() if k != "scale"}, "indices": indices, "scale": inputs["scale"]}


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """mla_decode's meta inputs and a [N, TOPK] int32 selection."""
    inputs = mla_decode.abstract_inputs(shape, dtype)
    indices = torch.empty(shape["N"], shape["TOPK"], dtype=torch.int32, device="meta")
    return {**{k: v for k, v in inputs.items() if k != "scale"}, "indices": indices, "scale": inputs["scale"]}


SHAPES = {
    "smoke": [
        {"N": 2, "H": 4, "R": 32, "DR": 16, "PAGE": 16, "MAXP": 3, "TOPK": 16},
        {"N": 3, "H": 16, "R": 64, "DR": 16, "PAGE": 8, "MAXP": 4, "TOPK": 8},
    ],
    # one sequence in one page selecting more than it holds; more heads than a head tile, pages of one row; a
    # selection of one; a wide selection over few tokens
    "edge": [
        {"N": 1, "H": 1, "R": 16, "DR": 16, "PAGE": 16, "MAXP": 1, "TOPK": 32},
        {"N": 9, "H": 20, "R": 40, "DR": 8, "PAGE": 1, "MAXP": 24, "TOPK": 12},
        {"N": 2, "H": 3, "R": 24, "DR": 1, "PAGE": 4, "MAXP": 5, "TOPK": 1},
        {"N": 2, "H": 2, "R": 16, "DR": 16, "PAGE": 8, "MAXP": 2, "TOPK": 40},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Two shapes drawn at verification time: mla_decode's, with a selection of 1-48 positions."""
    return [{**shape, "TOPK": rng.randint(1, 48)} for shape in mla_decode.hidden_shapes(rng)]


def work(s: Shape) -> tuple[Work, Work]:
    """Every sequence selects TOPK cached latents (gathered rows, read once for all H heads), q in, o out, this step's
    row written; 2 H (R + DR) + 2 H R flops per selected token. No backward."""
    n, h, r, dr, topk = s["N"], s["H"], s["R"], s["DR"], s["TOPK"]
    moved = BF16 * (n * topk * (r + dr) + n * h * (2 * r + dr) + n * (r + dr)) + I32 * n * (s["MAXP"] + topk + 1)
    return Work(moved, 2 * n * topk * h * (2 * r + dr)), Work(0.0)


def onboard(model: ModelConfig) -> list[Found]:
    """Every DSA layer over an MLA latent (dsa_sparse_attention's rule finds them) serves its decode through this
    step: the model suite's decode batch, each sequence holding DECODE_CONTEXT tokens in pages of 64, selecting the
    layer's top-k."""
    paged = [found.shapes[0] for found in mla_decode.onboard(model)]
    return [Found(f"DSA decode over the paged latent cache (serving, top {entry.shapes[0]['topk']})", entry.layers,
                  [{**paged[0], "TOPK": entry.shapes[0]["topk"]}], entry.fields)
            for entry in dsa_onboard(model) if paged and "DV" in entry.shapes[0]]  # DV: over a latent (absorbed)


SPEC = BlockSpec(
    name="dsa_decode",
    family="attention",
    summary="DSA decode for serving: one token per sequence, a sparse MQA over the selected latents of a paged cache "
            "(FlashMLA's layout), this step's latent written in place",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=(),
    outputs=("o", "latent_cache"),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    abstract_inputs=abstract_inputs,
    abstract_outputs=abstract_outputs,
    work=work,
    onboard=onboard,
    updated_in_place=("latent_cache",),
)
