"""Helpers shared by the DeepSeek Sparse Attention blocks (dsa_indexer and its decode step, dsa_sparse_attention).

The selection convention they rely on: ``indices[b, t]`` lists the selected key positions of query t, the
valid ones first (by descending score, ties to the smaller position), then ``-1`` padding up to ``topk``.
"""

from __future__ import annotations

import torch


def causal_mask(T: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[T, T] bool, True where key s <= query t."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def causal_topk(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """The ``topk`` highest-scoring causal keys per query.

    scores [B, T, T] (any float dtype; entries with s > t are ignored whatever they hold) -> indices [B, T, topk]
    int64: by descending score, ties to the smaller key position (a stable sort), then -1 where query t has fewer
    than topk causal keys (rows t < topk - 1, and every row when topk > T).
    """
    return topk_upto(scores, torch.arange(scores.shape[-1], device=scores.device), topk)


def topk_upto(scores: torch.Tensor, limits: torch.Tensor, topk: int) -> torch.Tensor:
    """The ``topk`` highest-scoring keys 0..limit of each row (causal_topk's rule, with any per-row limit).

    scores [..., S] (entries past a row's limit are ignored whatever they hold), limits [...] int (broadcast against
    the rows; each row's last admissible key) -> indices [..., topk] int64: by descending score, ties to the smaller
    position, then -1 where a row has fewer than topk admissible keys (limit + 1 < topk).
    """
    S = scores.shape[-1]
    admissible = torch.arange(S, device=scores.device) <= limits[..., None]
    masked = scores.detach().masked_fill(~admissible, float("-inf"))
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices  # admissible keys first: the rest -inf
    keep = min(topk, S)
    indices = torch.full((*scores.shape[:-1], topk), -1, dtype=torch.int64, device=scores.device)
    valid = torch.arange(keep, device=scores.device) <= limits[..., None]  # slot i holds a key where i <= limit
    indices[..., :keep] = torch.where(valid, order[..., :keep], -1)
    return indices


def selection_counts(T: int, topk: int) -> torch.Tensor:
    """[T] int64: how many valid (non-padding) entries each query's row of ``causal_topk`` holds, min(topk, t + 1)."""
    return torch.clamp(torch.arange(1, T + 1), max=topk)
