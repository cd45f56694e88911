"""Packed sequences, shared by the packed-prefill blocks: S sequences laid end to end along one token axis, with
``cu_seqlens`` [S + 1] int32 their offsets (cu_seqlens[0] = 0, cu_seqlens[S] = TOTAL), as flash-attention's varlen
functions, fla and vLLM take them."""

from __future__ import annotations

import torch


def split(total: int, sequences: int, g: torch.Generator) -> list[int]:
    """``sequences`` lengths summing to ``total``: a random split, with (given three sequences or more) one empty and
    one a single token long, shuffled, so every packing has the edges a kernel gets wrong."""
    if sequences < 1:
        raise ValueError(f"a packing needs at least one sequence, not {sequences}")
    fixed = [0, 1] if sequences > 2 and total >= 1 else [0] if sequences > 1 else []
    rest = sequences - len(fixed)
    left = total - sum(fixed)
    cuts = sorted(torch.randint(0, left + 1, (rest - 1,), generator=g).tolist())
    lengths = fixed + [b - a for a, b in zip([0, *cuts], [*cuts, left], strict=True)]
    order = torch.randperm(sequences, generator=g).tolist()
    return [lengths[i] for i in order]


def offsets(lengths: list[int]) -> torch.Tensor:
    """cu_seqlens [S + 1] int32 of ``lengths``."""
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
