"""dsa_kpool_indexer: the lightning indexer over k-pools (GLM-5-Next's ``Glm5NextTextIndexer``), a variant of
dsa_indexer that scores pools of P consecutive keys instead of single keys, then hands the selected pools' keys, and
the incomplete tail pool's, to the sparse attention.

    a[b,p,j,c]  = softmax_j(gate[b,pP+j,c] + ape[j,c])                    over the pool's P keys, per channel c
    K[b,p]      = sum_j a[b,p,j] * k_idx[b,pP+j]                           pooled key of each complete pool p < T // P
    S[b,t,p]    = sum_h w[b,t,h] * relu(q_idx[b,t,h] . K[b,p])             when the pool's last key (p+1)P - 1 <= t;
                                                                           -inf otherwise
    pools[b,t]  = the top SK = min(topk // P, T // P) pools of S[b,t,:] by descending score, ties to the smaller pool,
                  then -1 where fewer than SK pools are complete at t
    indices[b,t] = [each selected pool's keys pP .. pP + P - 1, -1 for a -1 pool]   (SK * P entries)
                 + [the tail: keys n - n % P .. t with n = t + 1, then -1, P - 1 entries]   (``tail`` only)
                 + -1 padding                                                 width W = topk + P - 1 (``tail``), topk

Shapes: q_idx [B,T,HI,DI], k_idx [B,T,DI], w [B,T,HI], gate [B,T,DI] (the pool's gate scores, gate_weight @ x), ape
[P,DI] (the pool's position logits); scores [B,T,T // P] float32 (float64 for float64 inputs), pools [B,T,SK] and
indices [B,T,W] int64. transformers' module folds its softmax scale DI^-0.5 and HI^-0.5 into w here as for
dsa_indexer (relu(s a) = s relu(a), s > 0). The pooled keys are computed in float32 (float64 for float64 inputs);
the module rounds the softmax weights and the pooled keys to the keys' dtype (no rounding in float32). The module
runs under no_grad: the block is forward only. Padding of a batch (a first key after slot 0) is the module's own
step, outside the block: its forward runs as shipped there. A decode step is dsa_kpool_indexer_decode.

Inputs (make_inputs): q_idx and k_idx on dsa_indexer's 1/16 grid, w ~ N(0, 1) / sqrt(HI * DI), gate ~ N(0, 1) and ape
~ N(0, 0.5^2) (the pool's softmax neither flat nor one-hot). Pool scores are not exact in float32 (the pooled keys
round), so near ties may reorder: the pools are judged as dsa_indexer's indices (compare_indices, against the
truth's pool scores) and the expanded indices by their padding pattern, causality and overlap (compare_expanded).
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import torch

from workbench.blocks import dsa_indexer
from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._dsa import topk_upto
from workbench.blocks.base import BF16, F32, I64, BlockSpec, Shape, Work
from workbench.numerics import Tolerance, compute_dtype, contract_problem


def pooled_keys(k_idx: torch.Tensor, gate: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """k_idx, gate [B,T,DI], ape [P,DI] -> the complete pools' keys [B,T // P,DI] in the compute dtype."""
    ct = compute_dtype(k_idx)
    P, (B, T, DI) = ape.shape[0], k_idx.shape
    n = T // P
    logits = gate[:, :n * P].to(ct).view(B, n, P, DI) + ape.to(ct)
    return (logits.softmax(dim=2) * k_idx[:, :n * P].to(ct).view(B, n, P, DI)).sum(dim=2)


def expand(pools: torch.Tensor, positions: torch.Tensor, P: int, width: int, tail: bool) -> torch.Tensor:
    """pools [..., SK] (-1 padded) of the queries at ``positions`` (broadcast to pools.shape[:-1]) -> the key
    indices [..., width]: each pool's P keys, the tail (the keys of the query's incomplete pool), -1 padding."""
    rows = pools.shape[:-1]
    keys = pools[..., None] * P + torch.arange(P, device=pools.device)
    parts = [torch.where(pools[..., None] >= 0, keys, -1).flatten(-2)]
    if tail:
        n = positions.to(pools.device)[..., None] + 1  # keys visible to each query
        count = n % P
        slot = torch.arange(P - 1, device=pools.device)
        parts.append(torch.where(slot < count, n - count + slot, -1).expand(*rows, P - 1))
    out = torch.cat(parts, dim=-1)
    return torch.cat([out, out.new_full((*rows, width - out.shape[-1]), -1)], dim=-1)


def reference(q_idx: torch.Tensor, k_idx: torch.Tensor, w: torch.Tensor, gate: torch.Tensor, ape: torch.Tensor,
              topk: int, tail: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ct = compute_dtype(q_idx)
    P, T = ape.shape[0], q_idx.shape[1]
    pooled = pooled_keys(k_idx, gate, ape)  # [B, NP, DI]
    dots = torch.einsum("bthd,bpd->bthp", q_idx.to(ct), pooled)
    scores = (w.to(ct).unsqueeze(-1) * torch.relu(dots)).sum(dim=2)  # [B, T, NP]
    last_pool = torch.arange(1, T + 1, device=q_idx.device) // P - 1  # [T]: the last complete pool at t
    visible = torch.arange(scores.shape[-1], device=q_idx.device) <= last_pool[:, None]
    scores = scores.masked_fill(~visible, float("-inf"))
    pools = topk_upto(scores, last_pool, min(topk // P, scores.shape[-1]))
    return scores, pools, expand(pools, torch.arange(T, device=q_idx.device), P, topk + (P - 1 if tail else 0),
                                 tail)


# --- inputs ----------------------------------------------------------------------------------------------------


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """q_idx [B,T,HI,DI], k_idx [B,T,DI], w [B,T,HI] as dsa_indexer's random inputs; gate [B,T,DI] ~ N(0, 1), ape
    [P,DI] ~ N(0, 0.5^2) in ``dtype``; topk and tail from the shape."""
    g = torch.Generator().manual_seed(seed)
    B, T, HI, DI, P = shape["B"], shape["T"], shape["HI"], shape["DI"], shape["P"]
    q, k, w = dsa_indexer.draw_inputs(B, T, HI, DI, 0, g)
    gate = torch.randn(B, T, DI, generator=g)
    ape = 0.5 * torch.randn(P, DI, generator=g)
    tensors = {"q_idx": q, "k_idx": k, "w": w, "gate": gate, "ape": ape}
    return {**{n: x.to(device, dtype) for n, x in tensors.items()}, "topk": int(shape["topk"]),
            "tail": bool(shape["tail"])}


# --- shapes ----------------------------------------------------------------------------------------------------

SHAPES = {
    "smoke": [
        {"B": 1, "T": 64, "HI": 2, "DI": 16, "P": 4, "topk": 16, "tail": 1},
        {"B": 2, "T": 96, "HI": 4, "DI": 32, "P": 8, "topk": 32, "tail": 0},
    ],
    # fewer keys than a pool (no pool anywhere); a pool of one key (dsa_indexer's selection); topk not a multiple of
    # P with T not one of P either; odd HI and DI; more pools wanted than ever complete (-1 pools in every row)
    "edge": [
        {"B": 1, "T": 3, "HI": 1, "DI": 16, "P": 4, "topk": 8, "tail": 1},
        {"B": 1, "T": 40, "HI": 2, "DI": 16, "P": 1, "topk": 6, "tail": 1},
        {"B": 2, "T": 77, "HI": 3, "DI": 24, "P": 4, "topk": 13, "tail": 1},
        {"B": 1, "T": 50, "HI": 1, "DI": 20, "P": 16, "topk": 128, "tail": 1},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Two shapes within the suites' ranges: P from 1 to 16, topk from P - 1 to past T."""
    shapes = []
    for tail in (0, 1):
        T, P = rng.randint(1, 96), rng.choice([1, 2, 4, 8, 16])
        shapes.append({"B": rng.randint(1, 2), "T": T, "HI": rng.randint(1, 4), "DI": rng.randint(16, 32), "P": P,
                       "topk": rng.randint(max(1, P - 1), T + 16), "tail": tail})
    return shapes


# --- verification of the expanded indices ----------------------------------------------------------------------


def compare_expanded(out: torch.Tensor | None, truth: torch.Tensor, ref_lowp: torch.Tensor, tol: Tolerance,
                     expect_dtype: torch.dtype, *, inputs: Mapping | None = None) -> dict:
    """Verdict and figures for the ``indices`` output: the -1 pattern exact (it depends on t, P and topk only),
    every other entry a causal key (0 <= s <= t) without repeats in its row, and the selected (query, key) pairs
    overlapping the truth's by at least dsa_indexer.MIN_OVERLAP (a near tie of two pools swaps P keys; the pools
    themselves are judged against the truth's scores by compare_indices). Each row's query t: its position in the
    [B, T, W] rows of a prefill, or, where the trial's ``inputs`` hold ``seq_lens`` (a decode step's [N, W] rows),
    its sequence's length. Figures as compare_indices'."""
    problem = contract_problem(out, truth, expect_dtype, missing="no indices returned")
    if problem:
        return {"passed": False, "reason": problem}
    bound = 1.0 - dsa_indexer.MIN_OVERLAP
    if truth.numel() == 0:
        return {"passed": True, "max_abs": 0.0, "max_rel": 0.0, "err_ratio": 0.0, "ref_err": 0.0, "bound": bound}
    o, t, r = (x.detach().to("cpu", torch.int64) for x in (out, truth, ref_lowp))
    lengths = None if inputs is None else inputs.get("seq_lens")
    query = lengths.detach().to("cpu", torch.int64) if lengths is not None else \
        torch.arange(t.shape[-2]).expand(t.shape[:-1])  # [...]: each row's query position
    T = int(query.max()) + 1
    pad_wrong = int(((o == -1) != (t == -1)).sum())
    bad_key = int(((t != -1) & ((o < 0) | (o > query[..., None]))).sum())
    got, want = dsa_indexer._membership(o, T), dsa_indexer._membership(t, T)
    repeats = int((got > 1).sum())
    missed = dsa_indexer.missed_fraction(got, want)
    ref_missed = dsa_indexer.missed_fraction(dsa_indexer._membership(r, T), want)
    figures = {"max_abs": missed, "max_rel": 0.0, "err_ratio": missed, "ref_err": ref_missed, "bound": bound,
               "nonfinite": 0}
    return dsa_indexer.selection_verdict(figures, pad_wrong, bad_key, repeats)


# --- work (the cost model) ---------------------------------------------------------------------------------


def work(s: Shape) -> tuple[Work, Work]:
    """Pooling (P multiply-adds and a softmax per key channel), scores over T // P pools, the selection written."""
    b, t, hi, di, p = s["B"], s["T"], s["HI"], s["DI"], s["P"]
    n = t // p
    width = s["topk"] + (p - 1 if s["tail"] else 0)
    inputs = BF16 * (b * t * hi * di + 2 * b * t * di + b * t * hi + p * di)
    fwd = Work(inputs + F32 * b * t * n + I64 * b * t * (min(s["topk"] // p, n) + width),
               2 * b * t * n * hi * di + 4 * b * t * di)
    return fwd, Work(0, 0)


def onboard(model: ModelConfig) -> list[Found]:
    """The full-attention layers of a config whose indexer scores k-pools (index_kpool > 1): they replace
    dsa_indexer's entries and its serving forms' (the decode form is dsa_kpool_indexer_decode; no packed-prefill
    form is in the catalog)."""
    if not model.full_layers:
        return []
    pool, pool_field = model.integer("index_kpool")
    topk, topk_field = model.integer("index_topk")
    if not pool or pool < 2 or not topk:
        return []
    heads, heads_field = model.integer("index_n_heads")
    dim, dim_field = model.integer("index_head_dim")
    tail, tail_field = model.field("index_kpool_always_select_tail")
    return [Found("lightning indexer over k-pools: pooled keys, pool scores, the top pools and the tail",
                  model.full_layers,
                  [{"B": 1, "T": model.tokens, "HI": heads, "DI": dim, "P": pool, "topk": topk,
                    "tail": int(tail is not False)}],
                  [f for f in (pool_field, topk_field, heads_field, dim_field, tail_field) if f])]


SPEC = BlockSpec(
    name="dsa_kpool_indexer",
    family="attention",
    summary="DSA lightning indexer over k-pools: softmax-pooled keys, relu-weighted pool scores, the top pools "
            "expanded into their keys with the incomplete tail pool",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=(),
    outputs=("scores", "pools", "indices"),
    shapes=SHAPES,
    comparators={"forward:pools": dsa_indexer.compare_indices, "forward:indices": compare_expanded},
    hidden_shapes=hidden_shapes,
    work=work,
    onboard=onboard,
    supersedes=("dsa_indexer", "dsa_indexer_decode", "dsa_indexer_prefill"),
)
