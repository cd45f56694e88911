"""dsa_indexer: the lightning indexer of DeepSeek Sparse Attention (DeepSeek-V3.2; the gated DSA of Kimi).

    I[b,t,s] = sum_j w[b,t,j] * relu(q_idx[b,t,j] . k_idx[b,s])     for s <= t;   -inf for s > t (causal)
    indices[b,t] = the topk causal keys of largest I[b,t,:], by descending score, ties to the smaller key position,
                   then -1 padding where fewer than topk causal keys exist (rows t < topk - 1; every row if topk > T)

Shapes: q_idx [B,T,HI,DI] (HI index heads), k_idx [B,T,DI] (one index key per token, shared by all index heads: MQA),
w [B,T,HI] (per-token head weights); outputs scores [B,T,T] and indices [B,T,topk] int64.
Scores are float32 for float32/float16/bfloat16 inputs (float64 for float64): like DeepSeek's fp32 index logits and the
float32 router logits, the selection is made on float32 scores and the scores leave the block in float32.
Gradients reach q_idx, k_idx and w through the scores (relu' = 0 at 0, as torch); the selection is forward only.

Inputs (make_inputs): q_idx and k_idx lie on a 1/16 grid within [-4, 4] (the indexer quantizes both to FP8 in V3.2),
so every head dot product is exact in float32 whatever the summation order: the relu mask, hence the gradients, are
the same for any correct kernel and the float64 truth. ``w ~ N(0, 1) / sqrt(HI * DI)`` (V3.2 folds HI^-0.5 and the
softmax scale into the weights), so scores are O(1) and signed; about 2^-HI of the causal scores are exactly 0 (every
head's dot negative), exact ties that the smaller-position rule settles.
Shapes with ``tie_free: 1`` get arange-based inputs instead (TransformerEngine style): channel 0 of k_idx holds a
random permutation of (1..T)/16, channel 0 of q_idx is +1 on even heads and -1 on odd heads (odd heads are always
clipped by relu), w > 0, and the other channels are perturbations of at most 1/128 each, so the ranking of every row
is the permutation's and distinct scores are at least ~W/20 apart: the top-k set must match exactly.

Verification of the indices (compare_indices): padding positions exact; every selected entry a causal key, no repeats;
set overlap with the truth >= 0.99; and, when the truth scores are at hand, every selected key scores within the score
bound of the truth's k-th score (so a candidate cannot fill its 1% with garbage, and tie-free rows must match exactly).
The decode step (dsa_indexer_decode) is verified by the same comparator: a row's causal keys end at its last finite
truth score.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._dsa import causal_mask, causal_topk
from workbench.blocks.base import BF16, F32, I64, BlockSpec, Shape, Work
from workbench.numerics import Tolerance, compute_dtype, contract_problem

MIN_OVERLAP = 0.99
"""Fraction of the truth's selected (query, key) pairs a candidate must also select (BLOCKS.md)."""


def reference(q_idx: torch.Tensor, k_idx: torch.Tensor, w: torch.Tensor, topk: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    ct = compute_dtype(q_idx)
    q, k, wt = q_idx.to(ct), k_idx.to(ct), w.to(ct)
    dots = torch.einsum("bthd,bsd->bths", q, k)  # [B, T, HI, T]: every index head against every index key
    scores = (wt.unsqueeze(-1) * torch.relu(dots)).sum(dim=2)  # [B, T, T]
    T = scores.shape[-1]
    scores = scores.masked_fill(~causal_mask(T, scores.device), float("-inf"))
    return scores, causal_topk(scores.detach(), topk)


# --- inputs ----------------------------------------------------------------------------------------------------

GRID = 16
"""q_idx and k_idx take values k / GRID: products are multiples of 2^-8, so dot products are exact in float32."""


def _on_grid(x: torch.Tensor) -> torch.Tensor:
    return torch.round(x.clamp(-4, 4) * GRID) / GRID


def _random_inputs(B: int, T: int, HI: int, DI: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    q = _on_grid(torch.randn(B, T, HI, DI, generator=g))
    k = _on_grid(torch.randn(B, T, DI, generator=g))
    w = torch.randn(B, T, HI, generator=g) / math.sqrt(HI * DI)
    return q, k, w


def _tie_free_inputs(B: int, T: int, HI: int, DI: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    perm = torch.stack([torch.randperm(T, generator=g) for _ in range(B)])  # [B, T]
    k = torch.randint(-1, 2, (B, T, DI), generator=g) / 128
    k[..., 0] = (perm + 1) / GRID
    q = torch.randint(-1, 2, (B, T, HI, DI), generator=g) / 128
    q[..., 0] = torch.where(torch.arange(HI) % 2 == 0, 1.0, -1.0)
    w = (0.5 + torch.rand(B, T, HI, generator=g)) / math.sqrt(HI)
    return q, k, w


def draw_inputs(B: int, T: int, HI: int, DI: int, tie_free: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """(q_idx [B,T,HI,DI], k_idx [B,T,DI], w [B,T,HI]) float32, random or tie-free (the module docstring)."""
    return (_tie_free_inputs if tie_free else _random_inputs)(B, T, HI, DI, g)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """q_idx [B,T,HI,DI], k_idx [B,T,DI], w [B,T,HI] in ``dtype``, topk an int; see the module docstring for the
    two distributions (random, the default, and ``tie_free: 1``)."""
    g = torch.Generator().manual_seed(seed)
    q, k, w = draw_inputs(shape["B"], shape["T"], shape["HI"], shape["DI"], shape.get("tie_free", 0), g)
    return {"q_idx": q.to(device, dtype), "k_idx": k.to(device, dtype), "w": w.to(device, dtype),
            "topk": int(shape["topk"])}


# --- shapes ----------------------------------------------------------------------------------------------------

SHAPES = {
    "smoke": [
        {"B": 1, "T": 32, "HI": 2, "DI": 16, "topk": 8, "tie_free": 1},
        {"B": 2, "T": 48, "HI": 4, "DI": 32, "topk": 16, "tie_free": 0},
    ],
    # one token (topk > T); odd T and HI with a non-power-of-two DI; topk just past a power of two; topk > T with a
    # single head (half the scores exactly 0: ties everywhere); every row short of topk on a tie-free input
    "edge": [
        {"B": 1, "T": 1, "HI": 1, "DI": 16, "topk": 4, "tie_free": 0},
        {"B": 2, "T": 77, "HI": 3, "DI": 24, "topk": 20, "tie_free": 1},
        {"B": 1, "T": 80, "HI": 4, "DI": 32, "topk": 33, "tie_free": 0},
        {"B": 1, "T": 19, "HI": 1, "DI": 16, "topk": 64, "tie_free": 0},
        {"B": 2, "T": 23, "HI": 2, "DI": 20, "topk": 31, "tie_free": 1},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """One random and one tie-free shape within the suites' ranges; topk anywhere from 1 to past T."""
    shapes = []
    for tie_free in (0, 1):
        T = rng.randint(1, 80)
        shapes.append({"B": rng.randint(1, 2), "T": T, "HI": rng.randint(1, 4), "DI": rng.randint(16, 32),
                       "topk": rng.randint(1, T + 16), "tie_free": tie_free})
    return shapes


# --- verification of the discrete output -----------------------------------------------------------------------


def _membership(indices: torch.Tensor, S: int) -> torch.Tensor:
    """[..., S] int64: how many times each key appears in each row (padding and out-of-range dropped)."""
    ok = (indices >= 0) & (indices < S)
    slots = torch.where(ok, indices, S)  # a dummy column S absorbs padding and garbage
    counts = torch.zeros(*indices.shape[:-1], S + 1, dtype=torch.int64)
    counts.scatter_add_(-1, slots, torch.ones_like(slots))
    return counts[..., :S]


def missed_fraction(selected: torch.Tensor, want: torch.Tensor) -> float:
    """The fraction of the truth's (query, key) pairs (``want``, _membership counts) that ``selected`` misses; 0 where
    the truth selects none (no row has a key: a decode step shorter than a k-pool)."""
    kept = int((want > 0).sum())
    return 1.0 - float(((selected > 0) & (want > 0)).sum()) / kept if kept else 0.0


def compare_indices(out: torch.Tensor | None, truth: torch.Tensor, ref_lowp: torch.Tensor, tol: Tolerance,
                    expect_dtype: torch.dtype, *, truth_outputs: Mapping[str, torch.Tensor] | None = None,
                    lowp_outputs: Mapping[str, torch.Tensor] | None = None) -> dict:
    """Verdict and figures for the ``indices`` output (the keyword fields of a Check, like compare()).

    Each row of ``truth`` [..., K] is one query at position t, whose keys are 0..t: with the float64 ``scores`` in
    ``truth_outputs``, t is the row's last finite score (a decode step's row: its length L); without them, the rows
    are the queries t of a [B, T, K] prefill.
    Always: the padding pattern exact, every other entry a causal key (0 <= s <= t) without repeats in its row, and
    the selected (query, key) pairs overlapping the truth's by at least MIN_OVERLAP. With the truth scores: every
    selected key's true score at least the row's true k-th score minus twice the scores' own bound (tol on the
    reference's low-precision scores from ``lowp_outputs`` when given), so a mismatch is only allowed between keys
    that a correct kernel's rounding can reorder.
    Figures: max_abs = the fraction of truth pairs missed, bound = 1 - MIN_OVERLAP, ref_err = the same fraction for
    the reference in the candidate's precision, max_rel = worst score deficit / its allowance.
    """
    problem = contract_problem(out, truth, expect_dtype, missing="no indices returned")
    if problem:
        return {"passed": False, "reason": problem}
    bound = 1.0 - MIN_OVERLAP
    if truth.numel() == 0:
        return {"passed": True, "max_abs": 0.0, "max_rel": 0.0, "err_ratio": 0.0, "ref_err": 0.0, "bound": bound}
    o, t, r = (x.detach().to("cpu", torch.int64) for x in (out, truth, ref_lowp))
    scores = truth_outputs.get("scores") if truth_outputs is not None else None
    s = None if scores is None else scores.detach().to("cpu", torch.float64)
    query = (torch.isfinite(s).sum(-1) - 1 if s is not None
             else torch.arange(t.shape[-2]).expand(t.shape[:-1]))  # [...]: each row's query position
    K, S = t.shape[-1], int(query.max()) + 1

    pad = torch.arange(K) >= torch.clamp(query + 1, max=K)[..., None]  # [..., K]: where -1 belongs
    pad_wrong = int(((o == -1) != pad).sum())
    bad_key = int((~pad & ((o < 0) | (o > query[..., None]))).sum())  # not a causal key
    got, want = _membership(o, S), _membership(t, S)
    repeats = int((got > 1).sum())
    missed, ref_missed = missed_fraction(got, want), missed_fraction(_membership(r, S), want)
    figures = {"max_abs": missed, "max_rel": 0.0, "err_ratio": missed, "ref_err": ref_missed, "bound": bound,
               "nonfinite": 0}

    deficit_reason = ""
    if s is not None and S > 0:  # S = 0: no query has a key (a decode step shorter than a k-pool)
        finite = torch.isfinite(s)
        scale = float(s[finite].abs().max()) if finite.any() else 0.0
        ref_err = 0.0
        if lowp_outputs is not None and "scores" in lowp_outputs:
            diff = (lowp_outputs["scores"].detach().to("cpu", torch.float64) - s)[finite].abs()
            ref_err = float(diff.max()) if diff.numel() else 0.0
        allowance = 2.0 * tol.bound(ref_err, scale)
        s = s[..., :S]
        kth = s.masked_fill(want == 0, float("inf")).amin(dim=-1, keepdim=True)  # the truth's k-th score per row
        chosen = (got > 0) & (want == 0)  # picks outside the truth's set
        deficit = (kth - s).masked_fill(~chosen, float("-inf"))
        worst = float(deficit.max()) if chosen.any() else 0.0
        figures["max_rel"] = max(0.0, worst) / allowance if allowance > 0 else 0.0
        if chosen.any() and worst > allowance:
            where = (deficit == deficit.max()).nonzero()[0].tolist()
            deficit_reason = (f"key {where[-1]} chosen for query {int(query[tuple(where[:-1])])} (batch {where[0]}) "
                              f"scores {worst:.3g} below the row's k-th score (allowed {allowance:.3g})")

    return selection_verdict(figures, pad_wrong, bad_key, repeats, deficit_reason)


def selection_verdict(figures: dict, pad_wrong: int, bad_key: int, repeats: int, deficit_reason: str = "") -> dict:
    """The verdict of a selection comparator from its counts and figures (max_abs: the fraction of the truth's pairs
    missed, ref_err: the reference's own): the first failed rule's reason, in the order padding, causality, repeats,
    overlap, score deficit."""
    missed, ref_missed = figures["max_abs"], figures["ref_err"]
    if pad_wrong:
        return {**figures, "passed": False, "reason": f"{pad_wrong} entries disagree with the -1 padding pattern"}
    if bad_key:
        return {**figures, "passed": False, "reason": f"{bad_key} selected entries are not causal keys (0 <= s <= t)"}
    if repeats:
        return {**figures, "passed": False, "reason": f"{repeats} keys selected twice in one row"}
    if missed > 1.0 - MIN_OVERLAP:
        return {**figures, "passed": False, "reason": f"selection overlap {1 - missed:.4f} < {MIN_OVERLAP} "
                f"(reference's own {1 - ref_missed:.4f})"}
    if deficit_reason:
        return {**figures, "passed": False, "reason": deficit_reason}
    return {**figures, "passed": True}


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """Q_idx [B, T, HI, DI], k_idx [B, T, DI], w [B, T, HI] -> scores [B, T, T] f32, top-k int64."""
    b, t, hi, di = s["B"], s["T"], s["HI"], s["DI"]
    inputs = BF16 * (b * t * hi * di + b * t * di + b * t * hi)
    fwd = Work(inputs + F32 * b * t * t + I64 * b * t * s["topk"], 2 * b * t * t * hi * di)
    return fwd, Work(F32 * b * t * t + inputs * 2, 4 * b * t * t * hi * di)


def onboard(model: ModelConfig) -> list[Found]:
    """The full-attention layers of a config with index_topk: the indexer's heads and head size."""
    if not model.full_layers:
        return []
    topk, topk_field = model.integer("index_topk")
    if not topk:
        return []
    heads, heads_field = model.integer("index_n_heads")
    dim, dim_field = model.integer("index_head_dim")
    return [Found("lightning indexer scoring and top-k selection", model.full_layers,
                  [{"B": 1, "T": model.tokens, "HI": heads, "DI": dim, "topk": topk, "tie_free": 0}],
                  [topk_field, heads_field, dim_field])]


SPEC = BlockSpec(
    name="dsa_indexer",
    family="attention",
    summary="DSA lightning indexer: relu-weighted multi-head index scores, causal top-k selection",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("q_idx", "k_idx", "w"),
    outputs=("scores", "indices"),
    shapes=SHAPES,
    comparators={"forward:indices": compare_indices},
    hidden_shapes=hidden_shapes,
    work=work,
    onboard=onboard,
    replay="D",
)
