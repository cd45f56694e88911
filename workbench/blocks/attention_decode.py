"""attention_decode: one softmax-attention decode step per sequence being served, over a paged KV cache (the serving
form of ``attention`` that FlashAttention's ``flash_attn_with_kvcache`` and vLLM's paged-attention kernels are: a
block table, per-sequence lengths, grouped KV heads).

For sequence n, with L = seq_lens[n] tokens already cached and this step's key and value k[n], v[n]:

    k_cache[block_table[n, L // PAGE], L % PAGE] = k[n]     (and v_cache = v[n])     in place
    out[n] = attention(q[n], keys and values 0 .. L of sequence n)    the training form's variants

that is, attention_prefill with one new token per sequence (and ``attention.reference`` of one query over its L + 1
keys); a sequence decoded token by token through this step equals its prefill, and the training form over the whole
sequence (tests/blocks/test_attention_decode.py). In float32 (float64 for float64 inputs), cast to q.dtype once.
The cache layout and its traps are attention_prefill's (rows nobody wrote hold 30.0; unused table entries point at a
spare page).

Shapes: q [N, H, D]; k, v [N, HKV, D]; k_cache, v_cache [PAGES, PAGE, HKV, D] in q's dtype; block_table [N, MAXP]
int32; seq_lens [N] int32 with seq_lens[n] < MAXP * PAGE; sinks [H] or None; scale; window (0: none); softcap (0:
none). Outputs: out [N, H, D] in q.dtype, and both caches (updated in place). Forward only.
"""

from __future__ import annotations

import random

import torch

from workbench.blocks import attention_prefill, mla_decode
from workbench.blocks._config import DECODE_CONTEXT, Found, ModelConfig
from workbench.blocks.attention import onboard as attention_onboard
from workbench.blocks.attention import serving_variant
from workbench.blocks.base import BF16, I32, BlockSpec, Shape, Work


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              block_table: torch.Tensor, seq_lens: torch.Tensor, sinks: torch.Tensor | None, scale: float,
              window: int, softcap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """attention_prefill's reference with one new token per sequence. Returns (out [N, H, D] in q.dtype, the
    updated copies of the caches)."""
    one_each = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return attention_prefill.reference(q, k, v, k_cache, v_cache, block_table, seq_lens, one_each, sinks, scale,
                                       window, softcap)


def abstract_outputs(q, k, v, k_cache, v_cache, block_table, seq_lens, sinks, scale, window, softcap):
    """out's shape and dtype (the library op's fake implementation)."""
    return q.new_empty(q.shape), k_cache, v_cache


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """q, this step's keys and values and the cached ones ~ N(0, 1); the lengths and pages as mla_decode lays them
    out (for seeds 0 and 1 one sequence empty and one at the last row of its last page)."""
    g = torch.Generator().manual_seed(seed)
    n, h, hkv, d, maxp = (shape[k] for k in ("N", "H", "HKV", "D", "MAXP"))
    lengths, table, pages = mla_decode.layout(shape, seed)
    caches = attention_prefill.paged_kv(lengths, table, pages, shape, g)
    q, k, v = (torch.randn(n, heads, d, generator=g).to(device, dtype) for heads in (h, hkv, hkv))
    return {"q": q, "k": k, "v": v, "k_cache": caches[0].to(device, dtype), "v_cache": caches[1].to(device, dtype),
            "block_table": torch.tensor(table, dtype=torch.int32).reshape(n, maxp).to(device),
            "seq_lens": torch.tensor(lengths, dtype=torch.int32).to(device),
            **attention_prefill.variants(shape, dtype, g, device)}


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """The inputs as meta tensors (a pool of N * MAXP + 1 pages, as make_inputs lays out)."""
    n, h, hkv, d, page, maxp = (shape[k] for k in ("N", "H", "HKV", "D", "PAGE", "MAXP"))
    meta = {"device": "meta", "dtype": dtype}
    cache = (n * maxp + 1, page, hkv, d)
    return {"q": torch.empty(n, h, d, **meta), "k": torch.empty(n, hkv, d, **meta),
            "v": torch.empty(n, hkv, d, **meta), "k_cache": torch.empty(cache, **meta),
            "v_cache": torch.empty(cache, **meta),
            "block_table": torch.empty(n, maxp, dtype=torch.int32, device="meta"),
            "seq_lens": torch.empty(n, dtype=torch.int32, device="meta"),
            "sinks": torch.empty(h, **meta) if shape.get("sinks", 0) else None, "scale": d ** -0.5,
            "window": int(shape.get("window", 0)), "softcap": float(shape.get("softcap", 0))}


def _shape(n, h, hkv, d, page, maxp, window=0, sinks=0, softcap=0, heads_outer=0) -> dict:
    return {"N": n, "H": h, "HKV": hkv, "D": d, "PAGE": page, "MAXP": maxp, "window": window, "sinks": sinks,
            "softcap": softcap, "heads_outer": heads_outer}


SHAPES = {
    "smoke": [_shape(2, 4, 2, 32, 16, 3), _shape(3, 8, 2, 16, 8, 4, window=11, sinks=1, heads_outer=1)],
    # one sequence in one page; pages of one row, MHA with a soft cap; a window of one with sinks over 80-wide heads;
    # pages wider than a key block
    "edge": [_shape(1, 1, 1, 16, 16, 1), _shape(4, 3, 3, 24, 1, 24, softcap=3),
             _shape(2, 4, 2, 80, 4, 5, window=1, sinks=1), _shape(2, 2, 1, 16, 128, 1)],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Two shapes drawn at verification time: a batch up to 5, 1-3 KV heads of 1-4 query heads, head sizes 16-48,
    pages of 1-32 rows, up to 6 pages per sequence; the second with the variants and the page layout drawn."""
    return [_shape(rng.randint(1, 5), (hkv := rng.randint(1, 3)) * rng.randint(1, 4), hkv, rng.choice([16, 24, 32, 48]),
                   rng.choice([1, 2, 4, 8, 16, 32]), rng.randint(1, 6), window=variant * rng.randint(1, 30),
                   sinks=variant * rng.randint(0, 1), softcap=variant * rng.choice([0, 3]),
                   heads_outer=variant * rng.randint(0, 1))
            for variant in (0, 1)]


def work(s: Shape) -> tuple[Work, Work]:
    """Every sequence's pages full (MAXP * PAGE keys: the model suite's DECODE_CONTEXT rounded up to pages), at most
    the window's read: the keys and values read once for the KV head's query group (what decoding is bound by); q
    in, out out, this step's keys and values written. 4 D flops per (query head, key). No backward."""
    n, h, hkv, d = s["N"], s["H"], s["HKV"], s["D"]
    keys = min(s["MAXP"] * s["PAGE"], s.get("window") or s["MAXP"] * s["PAGE"])
    moved = BF16 * (2 * n * keys * hkv * d + 2 * n * h * d + 2 * n * hkv * d) + I32 * n * (s["MAXP"] + 1)
    return Work(moved, 4 * n * keys * h * d, 2 * n * keys * h), Work(0.0)


def onboard(model: ModelConfig) -> list[Found]:
    """Every softmax-attention layer serves its decode through this step: the model suite's decode batch, each
    sequence holding DECODE_CONTEXT tokens in pages of vLLM's 16 rows."""
    page = attention_prefill.PAGE
    return [Found(f"{entry.role}: decode over the paged KV cache (serving, {DECODE_CONTEXT} tokens cached)",
                  entry.layers, [_shape(model.decode_batch, shape["H"], shape["HKV"], shape["D"], page,
                                        -(-(DECODE_CONTEXT + 1) // page), shape["window"], shape["sinks"],
                                        shape["softcap"]) for shape in entry.shapes if not serving_variant(shape)],
                  entry.fields, next((why for shape in entry.shapes if (why := serving_variant(shape))), ""))
            for entry in attention_onboard(model)]


SPEC = BlockSpec(
    name="attention_decode",
    family="attention",
    summary="softmax attention decode for serving: one token per sequence over a paged KV cache (grouped KV heads, "
            "the training form's variants), this step's key and value written in place",
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
