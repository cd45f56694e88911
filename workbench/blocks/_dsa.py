"""Helpers shared by the two DeepSeek Sparse Attention blocks (dsa_indexer, dsa_sparse_attention).

The selection convention both blocks rely on: ``indices[b, t]`` lists the selected key positions of query t, the
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
    B, T, _ = scores.shape
    causal = causal_mask(T, scores.device)
    masked = scores.detach().masked_fill(~causal, float("-inf"))
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices  # causal keys first: s > t are -inf
    keep = min(topk, T)
    indices = torch.full((B, T, topk), -1, dtype=torch.int64, device=scores.device)
    slot = torch.arange(keep, device=scores.device)
    n_causal = torch.arange(1, T + 1, device=scores.device)  # query t sees t + 1 keys
    valid = slot[None, :] < n_causal[:, None]  # [T, keep]
    indices[:, :, :keep] = torch.where(valid, order[:, :, :keep], -1)
    return indices


def selection_counts(T: int, topk: int) -> torch.Tensor:
    """[T] int64: how many valid (non-padding) entries each query's row of ``causal_topk`` holds, min(topk, t + 1)."""
    return torch.clamp(torch.arange(1, T + 1), max=topk)
