"""dsa_prefill: DSA's sparse MQA over packed prompts for serving, each continuing its sequence in the paged latent
cache (a chunked prefill), at the positions the lightning indexer selected for each token (dsa_decode's step with
many tokens per sequence; mla_prefill's dense form).

For sequence n, with L = seq_lens[n] tokens already cached and its T new tokens rows r = cu_seqlens[n] + t:

    latent_cache[block_table[n, (L + t) // PAGE], (L + t) % PAGE] = [c_kv[r] | k_rope[r]]      in place
    S_r     = {s = indices[r, i] : 0 <= s <= L + t}              the token's selection (-1 padding), causal
    o[r, h] = sum_{s in S_r} softmax_s(scale * q[r, h] . key_s) key_s[:R]          (0 when S_r is empty)

with key_s the latent at position s of the sequence (cached or new), in float32 (float64 for float64 inputs), cast to
q.dtype once. A selection entry past the token is not attended (the indexer's top-k never names one; the step does
not trust it to). A prompt prefilled in chunks, or prefilled then decoded token by token with dsa_decode, with each
token's selection, equals it prefilled at once (tests/blocks/test_dsa_prefill.py).

Shapes: mla_prefill's, and indices [TOTAL, TOPK] int32 (positions of the token's sequence). Outputs: o [TOTAL, H, R]
in q.dtype, and latent_cache itself (updated in place). Forward only.
Inputs (make_inputs): mla_prefill's, and each token's selection dsa_decode's (the top TOPK of random scores with a
recency bias over its positions 0 .. L + t, -1 padded, one row in eight emptied).
"""

from __future__ import annotations

import random

import torch

from workbench.blocks import dsa_decode, mla_prefill
from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, I32, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def reference(q: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor, latent_cache: torch.Tensor,
              block_table: torch.Tensor, seq_lens: torch.Tensor, cu_seqlens: torch.Tensor, indices: torch.Tensor,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The new latents written into an updated copy of the cache, then each token's MQA over its selected latents.
    Returns (o [TOTAL, H, R] in q.dtype, the updated copy); the input cache is left alone."""
    ct = compute_dtype(q)
    cache = latent_cache.clone()
    page, r = cache.shape[1], c_kv.shape[-1]
    new = torch.cat([c_kv, k_rope], dim=-1).to(cache.dtype)
    o = torch.zeros(q.shape[0], q.shape[1], r, dtype=ct, device=q.device)
    bounds = cu_seqlens.tolist()
    for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        length = int(seq_lens[n])
        fresh = torch.arange(length, length + end - start, device=q.device)
        cache[block_table[n, fresh // page].long(), fresh % page] = new[start:end]
        for t, row in enumerate(range(start, end)):
            chosen = indices[row][(indices[row] >= 0) & (indices[row] <= length + t)].long()
            if chosen.numel():
                keys = cache[block_table[n, chosen // page].long(), chosen % page].to(ct)  # [S, R + DR]
                p = torch.softmax(q[row].to(ct) @ keys.T * scale, dim=-1)  # [H, S]
                o[row] = p @ keys[:, :r]
    return o.to(q.dtype), cache


def abstract_outputs(q, c_kv, k_rope, latent_cache, block_table, seq_lens, cu_seqlens, indices, scale):
    """o's shape and dtype (the library op's fake implementation)."""
    return q.new_empty(q.shape[0], q.shape[1], c_kv.shape[-1]), latent_cache


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    inputs = mla_prefill.make_inputs(shape, dtype, seed, device)
    bounds, lengths = inputs["cu_seqlens"].tolist(), inputs["seq_lens"].tolist()
    last = [lengths[n] + t for n in range(len(lengths)) for t in range(bounds[n + 1] - bounds[n])]
    rows = dsa_decode.selection(last, shape["TOPK"], seed)
    indices = torch.tensor(rows, dtype=torch.int32).reshape(shape["TOTAL"], shape["TOPK"]).to(device)
    return {**{k: v for k, v in inputs.items() if k != "scale"}, "indices": indices, "scale": inputs["scale"]}


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """mla_prefill's meta inputs and a [TOTAL, TOPK] int32 selection."""
    inputs = mla_prefill.abstract_inputs(shape, dtype)
    indices = torch.empty(shape["TOTAL"], shape["TOPK"], dtype=torch.int32, device="meta")
    return {**{k: v for k, v in inputs.items() if k != "scale"}, "indices": indices, "scale": inputs["scale"]}


SHAPES = {suite: [{**s, "TOPK": topk} for s, topk in zip(shapes, topks, strict=True)]
          for (suite, shapes), topks in zip(mla_prefill.SHAPES.items(), ([16, 8], [32, 4, 12, 1, 40]), strict=True)}
"""mla_prefill's suites, each shape with a selection: wider than its tokens, narrower, a selection of one."""


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """mla_prefill's two draws, with a selection of 1-48 positions."""
    return [{**shape, "TOPK": rng.randint(1, 48)} for shape in mla_prefill.hidden_shapes(rng)]


def work(s: Shape) -> tuple[Work, Work]:
    """Every new token selects TOPK latents (gathered rows, read once for all H heads), q in, o out, the new rows
    written; 2 H (R + DR) + 2 H R flops per selected key. No backward."""
    total, h, r, dr, topk = s["TOTAL"], s["H"], s["R"], s["DR"], s["TOPK"]
    moved = BF16 * (total * topk * (r + dr) + total * h * (2 * r + dr) + total * (r + dr)) \
        + I32 * (total * topk + s["S"] * (s["MAXP"] + 2) + 1)
    return Work(moved, 2 * total * topk * h * (2 * r + dr)), Work(0.0)


def onboard(model: ModelConfig) -> list[Found]:
    """Every DSA layer over an MLA latent (dsa_decode's rule finds them) prefills through this step, at mla_prefill's
    packing with the layer's top-k."""
    packed = [found.shapes[0] for found in mla_prefill.onboard(model)]
    return [Found(f"DSA over packed prompts from the paged latent cache (serving prefill, top "
                  f"{entry.shapes[0]['TOPK']})", entry.layers, [{**packed[0], "TOPK": entry.shapes[0]["TOPK"]}],
                  entry.fields)
            for entry in dsa_decode.onboard(model) if packed]


SPEC = BlockSpec(
    name="dsa_prefill",
    family="attention",
    summary="DSA prefill for serving: packed prompts (cu_seqlens), each token a sparse MQA over the latents it "
            "selected of its sequence in the paged cache, the new latents written in place",
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
