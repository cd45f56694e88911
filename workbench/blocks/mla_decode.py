"""mla_decode: one absorbed MLA decode step per sequence being served, over a paged latent cache (the serving form of
mla, the kernel FlashMLA is: its paged KV cache, block table and per-sequence lengths; vLLM and SGLang's MLA
backends call it between the W_uk and W_uv products).

For sequence n, with L = seq_lens[n] tokens already cached and this step's latent (c_kv[n] | k_rope[n]):

    latent_cache[block_table[n, L // PAGE], L % PAGE] = [c_kv[n] | k_rope[n]]        in place, rounded to its dtype
    key_j   = latent_cache[block_table[n, j // PAGE], j % PAGE]   [R + DR]    j = 0 .. L (this step's token last)
    value_j = key_j[:R]                                           the latent itself (values are c_kv)
    o[n, h] = sum_j softmax_j(scale * q[n, h] . key_j) value_j    [R], for every head h (MQA: one key per token)

in float32 (float64 for float64 inputs), cast to q.dtype once. q is the absorbed query of each head, [q_nope W_uk |
q_rope] (R + DR wide: 576 in Kimi K3 and DeepSeek-V3), and o the latent output that W_uv maps to the head's values
(``mla.absorbed`` is the same computation over a whole sequence: a sequence decoded token by token through this
block equals mla's prefill of it, tests/blocks/test_mla_decode.py).

Layout (FlashMLA's): latent_cache [PAGES, PAGE, R + DR], FlashMLA's k_cache without its kv-head axis of 1 (one latent
per token serves every head); a sequence's token j lives in page block_table[n, j // PAGE] at row j % PAGE, so a
sequence grows one page at a time anywhere in the pool and pages are shared by nobody. block_table [N, MAXP] int32;
entries past a sequence's pages are never read. seq_lens [N] int32 counts the tokens cached before this step
(FlashMLA's cache_seqlens is seq_lens + 1: the engine writes the token first). The cache is updated in place
(``updated_in_place``): this step's token is written into its row, every other row is left as it is.

Shapes: q [N, H, R + DR]; c_kv [N, R]; k_rope [N, DR]; latent_cache [PAGES, PAGE, R + DR] in q's dtype; block_table
[N, MAXP] int32; seq_lens [N] int32 with seq_lens[n] < MAXP * PAGE. Outputs: o [N, H, R] in q.dtype, and
latent_cache itself. Forward only: serving has no backward.
Inputs (make_inputs): q, the latents ~ N(0, 1) (c_kv is an RMSNorm output), scale (R / 4 + DR)^-0.5 (Kimi K3's
192^-0.5 at R 512, DR 64); every cache row no sequence has written holds 30.0 and the table's unused entries point at
a spare page of them, so a kernel that reads past a length or through an unused entry is far off.
"""

from __future__ import annotations

import random

import torch

from workbench.blocks._config import DECODE_CONTEXT, Found, ModelConfig
from workbench.blocks.base import BF16, I32, BlockSpec, Shape, Work
from workbench.blocks.mla import onboard as mla_onboard
from workbench.numerics import compute_dtype

UNWRITTEN = 30.0  # every cache row no sequence has written: a key that dominates any softmax it leaks into
PAGE = 64  # FlashMLA's page_block_size


def reference(q: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor, latent_cache: torch.Tensor,
              block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """This step's latent written into an updated copy of the cache, then each sequence's MQA over its L + 1 cached
    latents. Returns (o [N, H, R] in q.dtype, the updated copy); the input cache is left alone."""
    ct = compute_dtype(q)
    cache = latent_cache.clone()
    page, r = cache.shape[1], c_kv.shape[-1]
    new = torch.cat([c_kv, k_rope], dim=-1).to(cache.dtype)
    o = torch.empty(q.shape[0], q.shape[1], r, dtype=ct, device=q.device)
    for n, length in enumerate(seq_lens.tolist()):
        cache[block_table[n, length // page].long(), length % page] = new[n]
        positions = torch.arange(length + 1, device=q.device)
        keys = cache[block_table[n, positions // page].long(), positions % page].to(ct)  # [L + 1, R + DR]
        p = torch.softmax(q[n].to(ct) @ keys.T * scale, dim=-1)  # [H, L + 1]
        o[n] = p @ keys[:, :r]
    return o.to(q.dtype), cache


def abstract_outputs(q, c_kv, k_rope, latent_cache, block_table, seq_lens, scale):
    """o's shape and dtype without reading the lengths (the library op's fake implementation)."""
    return q.new_empty(q.shape[0], q.shape[1], c_kv.shape[-1]), latent_cache


def layout(shape: Shape, seed: int) -> tuple[list[int], list[list[int]], int]:
    """(seq_lens, block_table rows, PAGES) of a shape: lengths drawn in [0, MAXP * PAGE) (for seeds 0 and 1 one
    sequence empty and one at the last row of its last page), the pages through ``pages_for`` (each sequence's
    cached rows and this step's)."""
    rng = random.Random(seed)
    n, maxp, page = shape["N"], shape["MAXP"], shape["PAGE"]
    longest = maxp * page - 1
    lengths = [rng.randint(0, longest) for _ in range(n)]
    if seed < 2 and n:
        lengths[0], lengths[-1] = (0, longest) if seed == 0 else (longest, 0)
    table, pages = pages_for([length + 1 for length in lengths], maxp, page, rng)
    return lengths, table, pages


def pages_for(rows: list[int], maxp: int, page: int, rng: random.Random) -> tuple[list[list[int]], int]:
    """(block_table rows, PAGES) for sequences that will hold ``rows`` rows each: each sequence's pages a random
    choice of a pool of N * MAXP + 1 (the last a spare page nobody writes), table entries past its pages pointing at
    it."""
    n = len(rows)
    pool = list(range(n * maxp))
    rng.shuffle(pool)
    spare = n * maxp
    table = [[pool[i * maxp + p] if p <= (rows[i] - 1) // page else spare for p in range(maxp)] for i in range(n)]
    return table, spare + 1


def paged_cache(lengths: list[int], table: list[list[int]], pages: int, page: int, rows: torch.Tensor
                ) -> torch.Tensor:
    """[pages, page, width] float32: the rows [sum(lengths), width] (sequence by sequence, position by position) where
    ``layout``'s table puts each sequence's cached tokens, UNWRITTEN everywhere else."""
    cache = torch.full((pages, page, rows.shape[-1]), UNWRITTEN)
    written = [(table[i][j // page], j % page) for i, length in enumerate(lengths) for j in range(length)]
    if written:
        where = torch.tensor(written)
        cache[where[:, 0], where[:, 1]] = rows
    return cache


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    gen = torch.Generator().manual_seed(seed)
    n, h, r, dr, page = (shape[d] for d in ("N", "H", "R", "DR", "PAGE"))
    lengths, table, pages = layout(shape, seed)
    cache = paged_cache(lengths, table, pages, page, torch.randn(sum(lengths), r + dr, generator=gen))
    return {"q": torch.randn(n, h, r + dr, generator=gen).to(device, dtype),
            "c_kv": torch.randn(n, r, generator=gen).to(device, dtype),
            "k_rope": torch.randn(n, dr, generator=gen).to(device, dtype),
            "latent_cache": cache.to(device, dtype),
            "block_table": torch.tensor(table, dtype=torch.int32).reshape(n, shape["MAXP"]).to(device),
            "seq_lens": torch.tensor(lengths, dtype=torch.int32).to(device), "scale": (r / 4 + dr) ** -0.5}


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """The inputs as meta tensors (the model suite: a pool of N * MAXP + 1 pages, as make_inputs lays out)."""
    n, h, r, dr, page, maxp = (shape[d] for d in ("N", "H", "R", "DR", "PAGE", "MAXP"))
    meta = {"device": "meta"}
    return {"q": torch.empty(n, h, r + dr, dtype=dtype, **meta), "c_kv": torch.empty(n, r, dtype=dtype, **meta),
            "k_rope": torch.empty(n, dr, dtype=dtype, **meta),
            "latent_cache": torch.empty(n * maxp + 1, page, r + dr, dtype=dtype, **meta),
            "block_table": torch.empty(n, maxp, dtype=torch.int32, **meta),
            "seq_lens": torch.empty(n, dtype=torch.int32, **meta), "scale": (r / 4 + dr) ** -0.5}


SHAPES = {
    "smoke": [
        {"N": 2, "H": 4, "R": 32, "DR": 16, "PAGE": 16, "MAXP": 3},
        {"N": 3, "H": 16, "R": 64, "DR": 16, "PAGE": 8, "MAXP": 4},
    ],
    # one sequence in one page; more heads than a head tile, odd widths and a page of one row; a rope part of one;
    # pages wider than a key block
    "edge": [
        {"N": 1, "H": 1, "R": 16, "DR": 16, "PAGE": 16, "MAXP": 1},
        {"N": 4, "H": 20, "R": 40, "DR": 8, "PAGE": 1, "MAXP": 24},
        {"N": 2, "H": 3, "R": 24, "DR": 1, "PAGE": 4, "MAXP": 5},
        {"N": 2, "H": 2, "R": 16, "DR": 16, "PAGE": 128, "MAXP": 1},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Two shapes drawn at verification time: a batch up to 5, heads 1-24, latent widths 1-72 and 1-24, pages of
    1-32 rows, up to 6 pages per sequence."""
    return [{"N": rng.randint(1, 5), "H": rng.randint(1, 24), "R": rng.randint(1, 72), "DR": rng.randint(1, 24),
             "PAGE": rng.choice([1, 2, 4, 8, 16, 32, rng.randint(1, 32)]), "MAXP": rng.randint(1, 6)}
            for _ in range(2)]


def work(s: Shape) -> tuple[Work, Work]:
    """Every sequence's pages full (MAXP * PAGE tokens: the model suite's DECODE_CONTEXT rounded up to pages): the
    latents read once for all H heads (what decoding from a latent cache is bound by), q in, o out, this step's row
    written; 2 H (R + DR) + 2 H R flops per cached token (scores and values). No backward."""
    n, h, r, dr = s["N"], s["H"], s["R"], s["DR"]
    tokens = n * s["MAXP"] * s["PAGE"]
    moved = BF16 * (tokens * (r + dr) + n * h * (2 * r + dr) + n * (r + dr)) + I32 * n * (s["MAXP"] + 1)
    return Work(moved, 2 * tokens * h * (2 * r + dr)), Work(0.0)


def onboard(model: ModelConfig) -> list[Found]:
    """Every MLA layer (mla's rule finds them) serves its decode through this step: the model suite's decode
    batch, each sequence holding DECODE_CONTEXT tokens in pages of FlashMLA's 64 rows."""
    return [Found(f"absorbed MLA decode over the paged latent cache (serving, {DECODE_CONTEXT} tokens cached)",
                  found.layers, [{"N": model.decode_batch, "H": shape["H"], "R": shape["R"], "DR": shape["DR"],
                                  "PAGE": PAGE, "MAXP": -(-(DECODE_CONTEXT + 1) // PAGE)}], found.fields)
            for found in mla_onboard(model) for shape in found.shapes[:1]]


SPEC = BlockSpec(
    name="mla_decode",
    family="attention",
    summary="absorbed MLA decode for serving: one token per sequence, an MQA over the latent in a paged cache "
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
