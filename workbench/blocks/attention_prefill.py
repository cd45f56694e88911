"""attention_prefill: softmax attention over packed prompts for serving, each continuing a sequence whose earlier
tokens' keys and values are in a paged KV cache (a chunked prefill; a prompt from its first token has none cached),
its new keys and values written into the cache: the serving form of ``attention`` (FlashAttention's
``flash_attn_varlen_func`` with a block table, vLLM's FlashAttention backend; the same conventions as mla_prefill:
pages, a block table, per-sequence lengths, ``cu_seqlens``).

For sequence n, with L = seq_lens[n] tokens already cached and its T new tokens rows r = cu_seqlens[n] + t:

    k_cache[block_table[n, (L + t) // PAGE], (L + t) % PAGE] = k[r]     (and v_cache = v[r])     in place
    out[r] = attention(q[r], keys and values 0 .. L + t of sequence n)   the training form's variants: grouped KV
                                                                         heads, a window, per-head sinks, soft cap

that is, ``attention.reference`` of the sequence's T queries over its L + T keys (the queries are the last of the
keys); attention never crosses a sequence. In float32 (float64 for float64 inputs), cast to q.dtype once. A prompt
prefilled in chunks, or prefilled then decoded token by token (attention_decode), equals the training form over the
whole sequence (tests/blocks/test_attention_prefill.py).

Layout (FlashAttention's paged KV cache, vLLM's key and value halves): k_cache and v_cache [PAGES, PAGE, HKV, D] at
any strides both share, each row's D contiguous (``heads_outer``: each page head-major in memory, vLLM's HND); a
sequence's token j lives in page block_table[n, j // PAGE] at row j % PAGE. Rows nobody wrote hold
30.0 and unused table entries point at a spare page of them (mla_decode's traps), so a kernel that reads past a
length or through an unused entry is far off.

Shapes: q [TOTAL, H, D]; k, v [TOTAL, HKV, D]; k_cache, v_cache [PAGES, PAGE, HKV, D] in q's dtype; block_table
[S, MAXP] int32; seq_lens [S] int32; cu_seqlens [S + 1] int32 with seq_lens[n] + T_n <= MAXP * PAGE; sinks [H] or
None; scale; window (0: none); softcap (0: none). Outputs: out [TOTAL, H, D] in q.dtype, and both caches (updated
in place). Forward only: serving has no backward.
"""

from __future__ import annotations

import random

import torch

from workbench.blocks import _packed, mla_decode
from workbench.blocks._config import DECODE_CONTEXT, PREFILL_SEQUENCES, Found, ModelConfig
from workbench.blocks.attention import onboard as attention_onboard
from workbench.blocks.attention import reference as attention
from workbench.blocks.attention import seen_pairs, serving_variant
from workbench.blocks.base import BF16, I32, BlockSpec, Shape, Work
from workbench.blocks.mla_prefill import layout
from workbench.numerics import compute_dtype

PAGE = 16  # vLLM's default KV-cache block size


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              block_table: torch.Tensor, seq_lens: torch.Tensor, cu_seqlens: torch.Tensor, sinks: torch.Tensor | None,
              scale: float, window: int, softcap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The new keys and values written into updated copies of the caches, then each sequence's queries through the
    training form over its cached and new keys. Returns (out [TOTAL, H, D] in q.dtype, the updated copies)."""
    keys, values = k_cache.clone(), v_cache.clone()
    page = keys.shape[1]
    out = torch.empty(q.shape, dtype=compute_dtype(q), device=q.device)
    bounds = cu_seqlens.tolist()
    for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        length, t = int(seq_lens[n]), end - start
        if not t:
            continue
        fresh = torch.arange(length, length + t, device=q.device)
        where = (block_table[n, fresh // page].long(), fresh % page)
        keys[where], values[where] = k[start:end].to(keys.dtype), v[start:end].to(values.dtype)
        positions = torch.arange(length + t, device=q.device)
        rows = (block_table[n, positions // page].long(), positions % page)
        out[start:end] = attention(q[None, start:end].to(out.dtype), keys[rows][None].to(out.dtype),
                                   values[rows][None].to(out.dtype), sinks, scale, window, softcap)[0]
    return out.to(q.dtype), keys, values


def abstract_outputs(q, k, v, k_cache, v_cache, block_table, seq_lens, cu_seqlens, sinks, scale, window, softcap):
    """out's shape and dtype (the library op's fake implementation)."""
    return q.new_empty(q.shape), k_cache, v_cache


def paged_kv(lengths: list[int], table: list[list[int]], pages: int, shape: Shape, g: torch.Generator
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """k_cache and v_cache [pages, PAGE, HKV, D] float32: each sequence's cached keys and values ~ N(0, 1) where the
    table puts them, mla_decode.UNWRITTEN everywhere else; with ``heads_outer`` in the shape, each page head-major in
    memory ([pages, HKV, PAGE, D], vLLM's HND layout) seen as [pages, PAGE, HKV, D]."""
    page, hkv, d = shape["PAGE"], shape["HKV"], shape["D"]
    caches = (mla_decode.paged_cache(lengths, table, pages, page, torch.randn(sum(lengths), hkv * d, generator=g))
              .view(pages, page, hkv, d) for _ in range(2))
    if shape.get("heads_outer", 0):
        return tuple(cache.transpose(1, 2).contiguous().transpose(1, 2) for cache in caches)
    return tuple(caches)


def variants(shape: Shape, dtype: torch.dtype, g: torch.Generator, device: str) -> dict:
    """sinks [H] ~ N(1, 1) (None unless the shape has them), scale D^-0.5, window and softcap: the training form's."""
    sinks = torch.randn(shape["H"], generator=g) + 1.0
    return {"sinks": sinks.to(device, dtype) if shape.get("sinks", 0) else None, "scale": shape["D"] ** -0.5,
            "window": int(shape.get("window", 0)), "softcap": float(shape.get("softcap", 0))}


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """q, the new keys and values and the cached ones ~ N(0, 1); the sequences as mla_prefill lays them out (an
    empty and a one-token sequence among them; for seed 0 the first from its first token)."""
    g = torch.Generator().manual_seed(seed)
    total, s, h, hkv, d, maxp = (shape[n] for n in ("TOTAL", "S", "H", "HKV", "D", "MAXP"))
    new, lengths, table, pages = layout(shape, seed, g)
    caches = paged_kv(lengths, table, pages, shape, g)
    q, k, v = (torch.randn(total, heads, d, generator=g).to(device, dtype) for heads in (h, hkv, hkv))
    return {"q": q, "k": k, "v": v, "k_cache": caches[0].to(device, dtype), "v_cache": caches[1].to(device, dtype),
            "block_table": torch.tensor(table, dtype=torch.int32).reshape(s, maxp).to(device),
            "seq_lens": torch.tensor(lengths, dtype=torch.int32).to(device),
            "cu_seqlens": _packed.offsets(new).to(device), **variants(shape, dtype, g, device)}


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """The inputs as meta tensors (a pool of S * MAXP + 1 pages, as make_inputs lays out)."""
    total, s, h, hkv, d, page, maxp = (shape[n] for n in ("TOTAL", "S", "H", "HKV", "D", "PAGE", "MAXP"))
    meta = {"device": "meta", "dtype": dtype}
    cache = (s * maxp + 1, page, hkv, d)
    return {"q": torch.empty(total, h, d, **meta), "k": torch.empty(total, hkv, d, **meta),
            "v": torch.empty(total, hkv, d, **meta), "k_cache": torch.empty(cache, **meta),
            "v_cache": torch.empty(cache, **meta),
            "block_table": torch.empty(s, maxp, dtype=torch.int32, device="meta"),
            "seq_lens": torch.empty(s, dtype=torch.int32, device="meta"),
            "cu_seqlens": torch.empty(s + 1, dtype=torch.int32, device="meta"),
            "sinks": torch.empty(h, **meta) if shape.get("sinks", 0) else None, "scale": d ** -0.5,
            "window": int(shape.get("window", 0)), "softcap": float(shape.get("softcap", 0))}


SHAPES = {
    "smoke": [
        {"TOTAL": 20, "S": 3, "H": 4, "HKV": 2, "D": 32, "PAGE": 16, "MAXP": 3, "window": 0, "sinks": 0,
         "softcap": 0},
        {"TOTAL": 24, "S": 4, "H": 4, "HKV": 2, "D": 16, "PAGE": 8, "MAXP": 4, "window": 9, "sinks": 1,
         "softcap": 0, "heads_outer": 1},
    ],
    # one token of one sequence; one token among empty sequences, a soft cap; pages of one row, a window of one,
    # an 80-wide head (no power of two); a prompt filling its pages, MHA with sinks
    "edge": [{"TOTAL": total, "S": s, "H": h, "HKV": hkv, "D": d, "PAGE": page, "MAXP": maxp, "window": window,
              "sinks": sinks, "softcap": softcap}
             for total, s, h, hkv, d, page, maxp, window, sinks, softcap in [
                 (1, 1, 2, 1, 16, 16, 1, 0, 0, 0), (1, 3, 3, 3, 16, 4, 2, 0, 0, 3), (17, 3, 6, 2, 24, 1, 24, 1, 0, 0),
                 (9, 2, 2, 1, 80, 4, 5, 6, 1, 0), (32, 1, 2, 2, 16, 16, 2, 0, 1, 0)]],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Two shapes drawn at verification time: 1-4 sequences of 1-24 new tokens in all, 1-3 KV heads of 1-3 query
    heads each, head sizes 16-48, pages of 1-32 rows, room for every prompt; the second with the variants drawn."""
    shapes = []
    for variant in (0, 1):
        total, page, hkv = rng.randint(1, 24), rng.choice([1, 4, 8, 16, 32]), rng.randint(1, 3)
        shapes.append({"TOTAL": total, "S": rng.randint(1, 4), "H": hkv * rng.randint(1, 3), "HKV": hkv,
                       "D": rng.choice([16, 24, 32, 48]), "PAGE": page, "MAXP": -(-total // page) + rng.randint(0, 2),
                       "window": variant * rng.randint(1, 20), "sinks": variant * rng.randint(0, 1),
                       "softcap": variant * rng.choice([0, 3]), "heads_outer": variant * rng.randint(0, 1)})
    return shapes


def work(s: Shape) -> tuple[Work, Work]:
    """Every new token against its sequence's keys (mla_prefill's convention: the pages full, MAXP * PAGE rows a
    sequence, the new tokens last), at most the window's: 4 D flops per (query head, key); the compulsory traffic
    is each sequence's keys and values read once, q in, out out, the new keys and values written. (The group_tiled
    and head_loop kernels read a sequence's prefix once per new token: what the model's floor does not see.) No
    backward."""
    total, n, h, hkv, d = s["TOTAL"], max(s["S"], 1), s["H"], s["HKV"], s["D"]
    per_seq, context = total // n, s["MAXP"] * s["PAGE"]
    pairs = n * seen_pairs(min(per_seq, context), context, s.get("window", 0))
    moved = BF16 * (2 * n * context * hkv * d + 2 * total * h * d + 2 * total * hkv * d) \
        + I32 * (n * (s["MAXP"] + 2) + 1)
    return Work(moved, 4 * pairs * h * d, 2 * pairs * h), Work(0.0)


def onboard(model: ModelConfig) -> list[Found]:
    """Every softmax-attention layer prefills through this step: the model suite's tokens packed from
    PREFILL_SEQUENCES prompts, each sequence room for DECODE_CONTEXT cached tokens and the whole step, in pages of
    vLLM's 16 rows."""
    rows = DECODE_CONTEXT + model.tokens
    return [Found(f"{entry.role} over packed prompts from the paged KV cache (serving prefill)", entry.layers,
                  [{"TOTAL": model.tokens, "S": PREFILL_SEQUENCES, **{k: shape[k] for k in (
                      "H", "HKV", "D", "window", "sinks", "softcap")}, "PAGE": PAGE, "MAXP": -(-rows // PAGE)}
                   for shape in entry.shapes if not serving_variant(shape)], entry.fields,
                  next((why for shape in entry.shapes if (why := serving_variant(shape))), ""))
            for entry in attention_onboard(model)]


SPEC = BlockSpec(
    name="attention_prefill",
    family="attention",
    summary="softmax attention prefill for serving: packed prompts (cu_seqlens), each continuing its sequence in a "
            "paged KV cache, causal, the training form's variants, the new keys and values written in place",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=(),
    outputs=("out", "k_cache", "v_cache"),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    abstract_inputs=abstract_inputs,
    abstract_outputs=abstract_outputs,
    work=work,
    onboard=onboard,
    updated_in_place=("k_cache", "v_cache"),
)
