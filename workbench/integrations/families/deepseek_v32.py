"""DeepSeek-V3.2 (transformers ``deepseek_v32``): DeepSeek-V3 with DeepSeek Sparse Attention in every layer (MLA whose
queries attend to the top-k keys of a lightning indexer), the same MoE, MLPs and norms.

    module                            computed by
    DeepseekV32RMSNorm                rmsnorm
    DeepseekV32MLP (silu)             swiglu (projections in torch)
    DeepseekV32TopkRouter             moe_router (sigmoid, group-limited, the config's routed_scaling_factor)
    DeepseekV32Experts (silu)         moe_permute, moe_grouped_gemm, moe_combine (the experts implementation)
    DeepseekV32Attention (DSA)        dsa_indexer (its projections in torch) and dsa_sparse_attention over the
                                      decompressed heads (the projections and the latents' RMSNorm in torch); the
                                      rotary embeddings (the indexer's rotate-half, the attention's interleaved
                                      pairs) by rotary and the indexer's key LayerNorm by layernorm where promoted;
                                      a decode step as
                                      dsa_indexer_decode and dsa_decode over paged caches (_dsa)
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as shipped

from workbench.integrations.families import deepseek_v3
from workbench.integrations.families._common import (
    SharedModules,
    mla_decodes,
    mla_runs_shipped,
    patch_mla_model,
    rmsnorm_forward,
    rotation,
    sigmoid_router_forward,
)
from workbench.integrations.families._dsa import KEY_NORM_IN_TORCH, dsa_attention, dsa_decode_attention, optional_blocks
from workbench.integrations.transformers import Patcher

MODEL_CLASS = "DeepseekV32ForCausalLM"
ROUTER = shipped.DeepseekV32TopkRouter  # its output (router_logits, top_k_weights, top_k_index): the router choices
LORA_TARGETS = deepseek_v3.LORA_TARGETS
DSA_BLOCKS = ("dsa_indexer", "dsa_sparse_attention")
DECODE_BLOCKS = ("dsa_indexer_decode", "dsa_decode")
IN_TORCH = "inside each DSA layer the projections, the latents' RMSNorm and kv_b_proj's decompression stay in torch"
ROPE_IN_TORCH = ("inside each DSA layer the rotary embeddings stay in torch (transformers' "
                 "apply_rotary_pos_emb_interleave for the attention, apply_rotary_pos_emb for the indexer)")


def rotations(self: nn.Module, position_embeddings):
    """The attention's rotary embedding (interleaved pairs) and the indexer's (rotate-half) on the module's position
    embeddings (cos, sin), as workbench::rotary or transformers' functions (``_common.rotation``)."""
    return (rotation(self, position_embeddings, shipped.apply_rotary_pos_emb_interleave, True),
            rotation(self, position_embeddings, shipped.apply_rotary_pos_emb, False, heads_dim=2))


def attention_forward(self: nn.Module, hidden_states: torch.Tensor, position_embeddings=None,
                      attention_mask: torch.Tensor | None = None, past_key_values=None, **kwargs):
    """DeepseekV32Attention.forward as workbench::dsa_indexer + workbench::dsa_sparse_attention (an empty cache
    written as shipped); a cache holding this layer's past (decode), a mask other than the causal one or attention
    dropout run the shipped forward."""
    if position_embeddings is None or mla_runs_shipped(self, hidden_states, attention_mask, past_key_values, False):
        return self.original_forward(hidden_states=hidden_states, position_embeddings=position_embeddings,
                                     attention_mask=attention_mask, past_key_values=past_key_values, **kwargs)
    out, _ = dsa_attention(self, hidden_states, *rotations(self, position_embeddings), None, past_key_values)
    return out, None


def attention_forward_with_decode(self: nn.Module, hidden_states: torch.Tensor, position_embeddings=None,
                                  attention_mask: torch.Tensor | None = None, past_key_values=None, **kwargs):
    """``attention_forward``, and its decode steps (``mla_decodes``) as ``dsa_decode_attention``."""
    if position_embeddings is not None and mla_decodes(self, hidden_states, attention_mask, past_key_values):
        return dsa_decode_attention(self, hidden_states, attention_mask, past_key_values,
                                    *rotations(self, position_embeddings))[0], None
    return attention_forward(self, hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs)


SHARED = SharedModules(rmsnorm=shipped.DeepseekV32RMSNorm, rmsnorm_forward=rmsnorm_forward, mlp=shipped.DeepseekV32MLP,
                       router=shipped.DeepseekV32TopkRouter, router_forward=sigmoid_router_forward,
                       experts=shipped.DeepseekV32Experts)


def apply(patcher: Patcher) -> None:
    """Swap the catalog's ops into every DeepSeek-V3.2 module they compute; report each module."""
    patch_mla_model(patcher, SHARED, shipped.DeepseekV32Attention, attention_forward, lambda module: DSA_BLOCKS,
                    plain_kv_b=False, decode_forward=attention_forward_with_decode,
                    decode_blocks=lambda module: DECODE_BLOCKS, optional=optional_blocks)
    patched = [r for r in patcher.report.rows if r.cls == "DeepseekV32Attention" and r.replaced]
    if patched:
        patcher.report.notes.append(IN_TORCH)
    if any("layernorm" not in r.blocks for r in patched):
        patcher.report.notes.append(KEY_NORM_IN_TORCH)
    if any("rotary" not in r.blocks for r in patched):
        patcher.report.notes.append(ROPE_IN_TORCH)


def tiny(full, layer_types: list[str], mlp_layer_types: list[str], experts: int, top_k: int) -> dict:
    """DeepSeek-V3's tiny fields (deepseek_v3.tiny) with a tiny indexer: 16 index heads (a zero score, every head's
    relu clipped, then has odds 2^-16: no exact ties for the top-k to settle), 16 wide, top 8 (a 32-token parity
    batch selects from row 8 on)."""
    return {**deepseek_v3.tiny(full, layer_types, mlp_layer_types, experts, top_k), "q_lora_rank": 24,
            "index_topk": 8, "index_n_heads": 16, "index_head_dim": 16}
