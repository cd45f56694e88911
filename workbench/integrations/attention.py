"""Softmax attention through transformers' attention registry: ``attention_forward`` is an ``AttentionInterface``
function (what ``sdpa`` and ``flash_attention_2`` are) computed by ``ops.attention``, registered as
``"workbench"`` with flash-attention's mask function (no mask where a batch has no padding: the causal and sliding
patterns are the kernel's own), so ``model.set_attn_implementation("workbench")`` runs every attention layer of a
model through it, training and ``generate()`` over the cache alike (the queries are the last of the cached keys).

What the published modules pass it: query [B, H, TQ, D], key and value [B, HKV, TK, D] (the cache's keys included),
``scaling``, and per family ``sliding_window`` (Mistral, Gemma, GPT-OSS, ...), ``softcap`` (Gemma 2), ``s_aux``
(GPT-OSS's learnt sinks, [H]); it returns ([B, TQ, H, D], None). A padded batch (left or right padding) runs row by
row over each row's tokens. Anything it cannot compute exactly through the registry (dropout while training,
per-token sinks or a dense position bias; a mask with holes inside a row) is one clear error, never a silent
approximation; ``unsupported(module)`` names the module-level variants before a family swaps a module in. A family
whose attention has the block's other variants (Inkling2's per-token sinks and relative logits) calls ``attend``
from its own forward.
"""

from __future__ import annotations

import torch
from torch import nn

from workbench.blocks.attention import seen_keys
from workbench.errors import WorkbenchError
from workbench.integrations.ops import ops

NAME = "workbench"
"""The attention implementation's name in transformers' registries."""


def unsupported(module: nn.Module) -> str:
    """Why ``module``'s attention cannot run through ``attention_forward`` (its variant is another), or ""."""
    names = {n for n, _ in module.named_children()}
    if {"sink_proj", "rel_logits_proj"} & names:
        return ("attention with per-token sinks (sink_proj) and relative-position logits (a dense [B, H, TQ, TK] "
                "bias, rel_logits_proj) through the attention registry: the block takes them per token and per "
                "distance from a family's own forward (Inkling2's)")
    sinks = getattr(module, "sinks", None)
    if isinstance(sinks, torch.Tensor) and sinks.dim() != 1:
        return f"sinks of shape {tuple(sinks.shape)}: the attention block's are one per head"
    if hasattr(module, "kv_b_proj"):
        return "MLA attention: the mla block computes it"
    return ""


def _window(sliding_window) -> int:
    return int(sliding_window) if sliding_window else 0


def _kept_keys(mask: torch.Tensor, tk: int) -> list[tuple[int, int]]:
    """Each batch row's kept keys [start, end) of a 2D padding mask [B, >= TK] (True: a token), which must be one
    contiguous run per row (left or right padding, as tokenizers pad); WorkbenchError otherwise."""
    keep = mask[:, -tk:].bool()
    runs = []
    for row in keep:
        kept = row.nonzero().flatten().tolist()
        if kept and kept[-1] - kept[0] + 1 != len(kept):
            raise WorkbenchError("workbench attention: a padding mask with holes inside a row is not supported "
                                 "(left or right padding only)")
        runs.append((kept[0], kept[-1] + 1) if kept else (0, 0))
    return runs


def _check_pattern(mask: torch.Tensor, tq: int, tk: int, window: int) -> None:
    """A 4D mask (another implementation's, where a module runs ours alone) must be exactly the causal (and window)
    pattern the kernel applies; padding or a custom mask is a WorkbenchError."""
    allowed = mask if mask.dtype == torch.bool else mask == 0
    if allowed.shape[-2:] == (tq, tk) and bool((allowed == seen_keys(tq, tk, window, mask.device)).all()):
        return
    raise WorkbenchError("workbench attention: a 4D attention mask that is not the causal (sliding-window) pattern "
                         "(padding or a custom mask) is not supported; run the model with the 'workbench' attention "
                         "implementation, whose masks are 2D")


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None, scale: float, window: int,
           softcap: float, rel: torch.Tensor | None, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """ops.attention over q [B, TQ, H, D], k and v [B, TK, HKV, D] (the queries the last TQ of the keys), sinks [H]
    or [B, TQ, H], rel [B, TQ, H, E] or None, under a model's mask: none, a 2D padding mask [B, >= TK] (each batch
    row over its own tokens, FlashAttention's unpadding; the queries at padded positions get zeros, as no real token
    reads them) or a 4D one that must be the causal (window) pattern. -> [B, TQ, H, D]."""
    tq, tk = q.shape[1], k.shape[1]
    if attention_mask is not None and attention_mask.dim() == 4:
        _check_pattern(attention_mask, tq, tk, window)
        attention_mask = None
    if attention_mask is None or bool(attention_mask[:, -tk:].all()):
        return ops.attention(q, k, v, sinks, scale, window, softcap, rel)
    out = q.new_zeros(q.shape[:3] + (v.shape[-1],))
    shift = tk - tq  # query i sits at key position shift + i
    for b, (start, end) in enumerate(_kept_keys(attention_mask, tk)):
        first = max(start, shift)
        if end > first:
            rows = slice(first - shift, end - shift)
            row_sinks = sinks if sinks is None or sinks.dim() == 1 else sinks[b:b + 1, rows]
            out[b:b + 1, rows] = ops.attention(q[b:b + 1, rows], k[b:b + 1, start:end], v[b:b + 1, start:end],
                                               row_sinks, scale, window, softcap,
                                               rel[b:b + 1, rows] if rel is not None else None)
    return out


def attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      sliding_window: int | None = None, softcap: float | None = None,
                      s_aux: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                      position_bias: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention function signature: query [B, H, TQ, D], key/value [B, HKV, TK, D] ->
    ([B, TQ, H, D], None), through ``attend``."""
    if dropout and module.training:
        raise WorkbenchError(f"workbench attention: attention dropout {dropout} while training is not supported")
    if position_bias is not None:
        raise WorkbenchError("workbench attention: a dense position bias [B, H, TQ, TK] is not supported (the block "
                             "takes relative logits per distance: a family's own attention forward passes them)")
    head_sinks = s_aux if s_aux is not None else sinks
    if head_sinks is not None and head_sinks.dim() != 1:
        raise WorkbenchError(f"workbench attention: sinks of shape {tuple(head_sinks.shape)} (per token) through "
                             "the attention registry are not supported: a family's own forward passes them as "
                             "[B, TQ, H]")
    scale = scaling if scaling is not None else query.shape[3] ** -0.5
    return attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), head_sinks, scale,
                  _window(sliding_window), float(softcap or 0.0), None, attention_mask), None


def register() -> None:
    """Register ``attention_forward`` and flash-attention's mask function under ``NAME`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)


def use_workbench_attention(model: nn.Module) -> None:
    """Run every attention layer of ``model`` through ``attention_forward``."""
    register()
    model.set_attn_implementation(NAME)
