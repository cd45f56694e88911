"""mla_prefill: absorbed MLA over packed prompts for serving, each continuing a sequence whose earlier tokens are in
the paged latent cache (a chunked prefill; a prompt from its first token has none cached), its new latents written
into the cache (FlashMLA's layout, mla_decode's: pages, a block table, per-sequence lengths; the form vLLM and SGLang
run a prefill chunk over a paged MLA cache in).

For sequence n, with L = seq_lens[n] tokens already cached and its T new tokens rows r = cu_seqlens[n] + t,
t = 0 .. T - 1 (any T >= 0):

    latent_cache[block_table[n, (L + t) // PAGE], (L + t) % PAGE] = [c_kv[r] | k_rope[r]]      in place
    key_j   = latent_cache[block_table[n, j // PAGE], j % PAGE]   [R + DR]    j = 0 .. L + T - 1
    o[r, h] = sum_{j <= L + t} softmax_j(scale * q[r, h] . key_j) key_j[:R]     (causal: a token sees the cached
                                                                                 ones, the new ones up to itself)

in float32 (float64 for float64 inputs), cast to q.dtype once; q the absorbed queries, o the latent outputs, as
mla_decode's (mla_decode is this step with one token per sequence; a prompt prefilled in chunks, or prefilled then
decoded token by token, equals it prefilled at once: tests/blocks/test_mla_prefill.py). Attention never crosses a
sequence. The input factory's traps are mla_decode's (rows nobody wrote hold 30.0; unused table entries point at a
spare page).

Shapes: q [TOTAL, H, R + DR]; c_kv [TOTAL, R]; k_rope [TOTAL, DR]; latent_cache [PAGES, PAGE, R + DR] in q's dtype;
block_table [S, MAXP] int32; seq_lens [S] int32 (tokens cached before the step); cu_seqlens [S + 1] int32, with
seq_lens[n] + T_n <= MAXP * PAGE. Outputs: o [TOTAL, H, R] in q.dtype, and latent_cache itself (updated in place).
Forward only: serving has no backward.
"""

from __future__ import annotations

import random

import torch

from workbench.blocks import _packed, mla_decode
from workbench.blocks._config import DECODE_CONTEXT, PREFILL_SEQUENCES, Found, ModelConfig
from workbench.blocks.base import BF16, I32, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def reference(q: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor, latent_cache: torch.Tensor,
              block_table: torch.Tensor, seq_lens: torch.Tensor, cu_seqlens: torch.Tensor,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The new latents written into an updated copy of the cache, then each sequence's causal MQA over its cached and
    new latents. Returns (o [TOTAL, H, R] in q.dtype, the updated copy); the input cache is left alone."""
    ct = compute_dtype(q)
    cache = latent_cache.clone()
    page, r = cache.shape[1], c_kv.shape[-1]
    new = torch.cat([c_kv, k_rope], dim=-1).to(cache.dtype)
    o = torch.empty(q.shape[0], q.shape[1], r, dtype=ct, device=q.device)
    bounds = cu_seqlens.tolist()
    for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        length, t = int(seq_lens[n]), end - start
        if not t:
            continue
        fresh = torch.arange(length, length + t, device=q.device)
        cache[block_table[n, fresh // page].long(), fresh % page] = new[start:end]
        positions = torch.arange(length + t, device=q.device)
        keys = cache[block_table[n, positions // page].long(), positions % page].to(ct)  # [L + T, R + DR]
        scores = torch.einsum("thd,jd->thj", q[start:end].to(ct), keys) * scale  # [T, H, L + T]
        seen = positions[None, :] <= fresh[:, None]  # [T, L + T]: the cached keys and the new ones up to itself
        p = torch.softmax(scores.masked_fill(~seen[:, None, :], float("-inf")), dim=-1)
        o[start:end] = p @ keys[:, :r]
    return o.to(q.dtype), cache


def abstract_outputs(q, c_kv, k_rope, latent_cache, block_table, seq_lens, cu_seqlens, scale):
    """o's shape and dtype (the library op's fake implementation)."""
    return q.new_empty(q.shape[0], q.shape[1], c_kv.shape[-1]), latent_cache


def layout(shape: Shape, seed: int, g: torch.Generator) -> tuple[list[int], list[int], list[list[int]], int]:
    """(new tokens per sequence, cached tokens per sequence, block_table rows, PAGES) of a shape: the new tokens a
    _packed.split of TOTAL (``g`` draws it), each sequence a cached prefix of random length that leaves room for
    them (for seed 0 the first none: a prompt from its first token), pages through mla_decode.pages_for."""
    rng = random.Random(seed)
    total, s, page, maxp = (shape[d] for d in ("TOTAL", "S", "PAGE", "MAXP"))
    if total > maxp * page:
        raise ValueError(f"TOTAL={total} new tokens do not fit a sequence of MAXP * PAGE = {maxp * page} rows")
    new = _packed.split(total, s, g)
    lengths = [rng.randint(0, maxp * page - t) for t in new]
    if seed == 0:
        lengths[0] = 0
    table, pages = mla_decode.pages_for([length + t for length, t in zip(lengths, new, strict=True)], maxp, page, rng)
    return new, lengths, table, pages


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """q, the new latents and the cached ones ~ N(0, 1), scale as mla_decode's; the sequences as ``layout`` lays them
    out (an empty and a one-token sequence among them)."""
    g = torch.Generator().manual_seed(seed)
    total, s, h, r, dr, page, maxp = (shape[d] for d in ("TOTAL", "S", "H", "R", "DR", "PAGE", "MAXP"))
    new, lengths, table, pages = layout(shape, seed, g)
    cache = mla_decode.paged_cache(lengths, table, pages, page, torch.randn(sum(lengths), r + dr, generator=g))
    return {"q": torch.randn(total, h, r + dr, generator=g).to(device, dtype),
            "c_kv": torch.randn(total, r, generator=g).to(device, dtype),
            "k_rope": torch.randn(total, dr, generator=g).to(device, dtype),
            "latent_cache": cache.to(device, dtype),
            "block_table": torch.tensor(table, dtype=torch.int32).reshape(s, maxp).to(device),
            "seq_lens": torch.tensor(lengths, dtype=torch.int32).to(device),
            "cu_seqlens": _packed.offsets(new).to(device), "scale": (r / 4 + dr) ** -0.5}


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """The inputs as meta tensors (a pool of S * MAXP + 1 pages, as make_inputs lays out)."""
    total, s, h, r, dr, page, maxp = (shape[d] for d in ("TOTAL", "S", "H", "R", "DR", "PAGE", "MAXP"))
    meta = {"device": "meta"}
    return {"q": torch.empty(total, h, r + dr, dtype=dtype, **meta),
            "c_kv": torch.empty(total, r, dtype=dtype, **meta), "k_rope": torch.empty(total, dr, dtype=dtype, **meta),
            "latent_cache": torch.empty(s * maxp + 1, page, r + dr, dtype=dtype, **meta),
            "block_table": torch.empty(s, maxp, dtype=torch.int32, **meta),
            "seq_lens": torch.empty(s, dtype=torch.int32, **meta),
            "cu_seqlens": torch.empty(s + 1, dtype=torch.int32, **meta), "scale": (r / 4 + dr) ** -0.5}


SHAPES = {
    "smoke": [
        {"TOTAL": 20, "S": 3, "H": 4, "R": 32, "DR": 16, "PAGE": 16, "MAXP": 3},
        {"TOTAL": 24, "S": 4, "H": 16, "R": 64, "DR": 16, "PAGE": 8, "MAXP": 4},
    ],
    # one token of one sequence; one token among empty sequences; more heads than a head tile, odd widths, pages of
    # one row; a rope part of one; a prompt filling its pages. (A step of no tokens at all launches nothing and
    # returns the cache untouched: the verifier, which wants a launch behind every non-empty output, is not given it.)
    "edge": [
        {"TOTAL": 1, "S": 1, "H": 1, "R": 16, "DR": 16, "PAGE": 16, "MAXP": 1},
        {"TOTAL": 1, "S": 3, "H": 2, "R": 16, "DR": 8, "PAGE": 4, "MAXP": 2},
        {"TOTAL": 17, "S": 3, "H": 20, "R": 40, "DR": 8, "PAGE": 1, "MAXP": 24},
        {"TOTAL": 9, "S": 2, "H": 3, "R": 24, "DR": 1, "PAGE": 4, "MAXP": 5},
        {"TOTAL": 32, "S": 1, "H": 2, "R": 16, "DR": 16, "PAGE": 16, "MAXP": 2},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Two shapes drawn at verification time: 1-4 sequences of 1-24 new tokens in all, heads 1-24, latent widths
    1-72 and 1-24, pages of 1-32 rows, room for every prompt."""
    shapes = []
    for _ in range(2):
        total, page = rng.randint(1, 24), rng.choice([1, 4, 8, 16, 32])
        shapes.append({"TOTAL": total, "S": rng.randint(1, 4), "H": rng.randint(1, 24), "R": rng.randint(1, 72),
                       "DR": rng.randint(1, 24), "PAGE": page, "MAXP": -(-total // page) + rng.randint(0, 2)})
    return shapes


def work(s: Shape) -> tuple[Work, Work]:
    """Every new token against its sequence's keys: the cached prefix (its pages full, MAXP * PAGE rows a
    sequence, less the new tokens) and the new tokens before it (half of them on average); the latents read once per
    token for all H heads; q in, o out, the new latents written. 2 H (R + DR) + 2 H R flops per (token, key). No
    backward."""
    total, n, h, r, dr = s["TOTAL"], s["S"], s["H"], s["R"], s["DR"]
    cached = max(0, n * s["MAXP"] * s["PAGE"] - total)
    pairs = total * (cached / max(n, 1) + total / max(n, 1) / 2)
    moved = BF16 * ((cached + total) * (r + dr) + total * h * (2 * r + dr) + total * (r + dr)) \
        + I32 * (n * (s["MAXP"] + 2) + 1)
    return Work(moved, 2 * pairs * h * (2 * r + dr)), Work(0.0)


def onboard(model: ModelConfig) -> list[Found]:
    """Every MLA layer prefills through this step: the model suite's tokens per step packed from PREFILL_SEQUENCES
    prompts (the card's assumed prefill_sequences), their sequences room for DECODE_CONTEXT cached tokens and the
    whole step, in pages of 64 (mla_decode's)."""
    rows = DECODE_CONTEXT + model.tokens
    return [Found("absorbed MLA over packed prompts from the paged latent cache (serving prefill)",
                  entry.layers, [{"TOTAL": model.tokens, "S": PREFILL_SEQUENCES, **{
                      k: entry.shapes[0][k] for k in ("H", "R", "DR", "PAGE")}, "MAXP": -(-rows // mla_decode.PAGE)}],
                  entry.fields)
            for entry in mla_decode.onboard(model)]


SPEC = BlockSpec(
    name="mla_prefill",
    family="attention",
    summary="absorbed MLA prefill for serving: packed prompts (cu_seqlens), each continuing its sequence in the paged "
            "latent cache (FlashMLA's layout), causal, the new latents written in place",
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
