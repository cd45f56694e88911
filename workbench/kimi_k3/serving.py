"""What Kimi K3 keeps between serving calls, laid out as vLLM keeps it, and how a call's tokens are packed.

    KDA layer   conv state [S, 3 * H * K, W - 1] (q, k, v channels, inputs in the model dtype, oldest first: the
                causal-conv1d layout) and recurrent state stored [S, H, V, K] float32 as vLLM stores it (fla's
                fused_recurrent default is K x V), both by slot (sequence b in slot b), updated in place by the
                prefill and decode forms (kda_short_conv_prefill / _decode, kda_prefill / kda_decode), which take the
                state as its [S, H, K, V] view: no copy, no transpose (``vllm_state`` is the storage's own view)
    MLA layer   a paged latent cache [PAGES, PAGE, R + DR] (FlashMLA's layout: mla_prefill / mla_decode write each
                token's [c_kv | k_rope] at its position), and with DSA a paged index-key cache [PAGES, PAGE, DI]
    all layers  one block table [S, MAXP] int32 and the tokens each sequence has cached, ``seq_lens`` [S] int32

A call's new tokens are packed end to end (``Packing``: cu_seqlens [S + 1] int32, the padded positions they came
from); every sequence of the batch is in every call, with zero new tokens where it has none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from workbench.blocks.kda import state_dtype

PAGE = 16
"""Rows per page of the latent caches (vLLM's CPU MLA block size; FlashMLA's is 64)."""


@dataclass
class Packing:
    """A call's new tokens as packed rows: ``cu_seqlens`` [S + 1] int32 over the S sequences, ``rows`` [TOTAL] the
    flat positions (b * T + t) of the [B, T] inputs they came from, and whether the call is one decode step (one
    token for every sequence, each continuing a cached one)."""

    cu_seqlens: torch.Tensor
    rows: torch.Tensor
    decode: bool

    @property
    def lengths(self) -> torch.Tensor:
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).to(torch.int32)

    @property
    def last_rows(self) -> torch.Tensor:
        """The packed row of each sequence's last new token [S] (-1 where it has none)."""
        return torch.where(self.lengths > 0, self.cu_seqlens[1:] - 1, -1)


def pack(attention_mask: torch.Tensor, cached: torch.Tensor) -> Packing:
    """The packing of a [B, T] call whose real tokens ``attention_mask`` marks (left or right padding), for
    sequences holding ``cached`` [B] tokens already."""
    keep = attention_mask.bool()
    lengths = keep.sum(dim=1)
    cu = torch.zeros(keep.shape[0] + 1, dtype=torch.int32, device=keep.device)
    cu[1:] = lengths.cumsum(0)
    decode = keep.shape[1] == 1 and bool((lengths == 1).all()) and bool((cached > 0).all())
    return Packing(cu, keep.reshape(-1).nonzero()[:, 0], decode)


@dataclass
class KimiK3Cache:
    """The serving state of a batch of ``batch`` sequences (module docstring). Layers register their tensors on first
    use (``kda_state``, ``latent``); pages are added as sequences grow (``reserve``)."""

    batch: int
    device: torch.device
    dtype: torch.dtype
    seq_lens: torch.Tensor = field(init=False)
    block_table: torch.Tensor = field(init=False)
    layers: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.seq_lens = torch.zeros(self.batch, dtype=torch.int32, device=self.device)
        self.block_table = torch.zeros(self.batch, 0, dtype=torch.int32, device=self.device)

    @property
    def slots(self) -> torch.Tensor:
        return torch.arange(self.batch, device=self.device)

    def reserve(self, new_tokens: torch.Tensor) -> None:
        """Room for ``new_tokens`` [B] more tokens per sequence: the block table widened (sequence b's pages are
        b, b + B, b + 2B, ...) and every paged cache grown to the pages it names."""
        pages = -(-int((self.seq_lens + new_tokens).max()) // PAGE)
        have = self.block_table.shape[1]
        if pages <= have:
            return
        self.block_table = (torch.arange(pages, device=self.device)[None, :] * self.batch
                            + torch.arange(self.batch, device=self.device)[:, None]).to(torch.int32)
        for tensors in self.layers.values():
            for name, pool in tensors.items():
                if name in ("latent", "index_keys"):
                    grown = pool.new_zeros(pages * self.batch, PAGE, pool.shape[-1])
                    grown[:pool.shape[0]] = pool
                    tensors[name] = grown

    def kda_state(self, layer: int, channels: int, width: int, heads: int, k: int, v: int
                  ) -> dict[str, torch.Tensor]:
        """Layer ``layer``'s KDA conv state and recurrent state (its [S, H, K, V] view), zeros at first use."""
        if layer not in self.layers:
            self.layers[layer] = {
                "conv": torch.zeros(self.batch, channels, width - 1, dtype=self.dtype, device=self.device),
                "state": torch.zeros(self.batch, heads, v, k, dtype=state_dtype(self.dtype),
                                     device=self.device).transpose(-1, -2)}
        return self.layers[layer]

    def paged(self, layer: int, name: str, width: int) -> dict[str, torch.Tensor]:
        """Layer ``layer``'s paged cache ``name`` ("latent" or "index_keys"), as many pages as the table names."""
        tensors = self.layers.setdefault(layer, {})
        if name not in tensors:
            tensors[name] = torch.zeros(self.block_table.shape[1] * self.batch, PAGE, width, dtype=self.dtype,
                                        device=self.device)
        return tensors

    def advance(self, new_tokens: torch.Tensor) -> None:
        """After every layer has written a call's tokens."""
        self.seq_lens += new_tokens.to(torch.int32)

    def vllm_state(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s recurrent state as vLLM stores it, [S, H, V, K] contiguous (the storage itself)."""
        return self.layers[layer]["state"].transpose(-1, -2)
