"""GLM-MoE-DSA (transformers ``glm_moe_dsa``, GLM-5): DeepSeek-V3.2's layout with an interleaved rotary embedding in
the indexer too, and cross-layer top-k sharing: ``indexer_types[i]`` "full" layers run their indexer, "shared" layers
attend over the previous full layer's selection.

    module                            computed by
    GlmMoeDsaRMSNorm                  rmsnorm
    GlmMoeDsaMLP (silu)               swiglu (projections in torch)
    GlmMoeDsaTopkRouter               moe_router (sigmoid, group-limited, the config's routed_scaling_factor)
    GlmMoeDsaExperts (silu)           moe_permute, moe_grouped_gemm, moe_combine (the experts implementation)
    GlmMoeDsaAttention, full          dsa_indexer and dsa_sparse_attention (as deepseek_v32's, rotary on
                                      interleaved pairs in both and the indexer's key LayerNorm by layernorm where
                                      promoted); a decode step as
                                      dsa_indexer_decode and dsa_decode
    GlmMoeDsaAttention, shared        dsa_sparse_attention over the selection handed down; a decode step as
                                      dsa_decode over it
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as shipped

from workbench.integrations.families import deepseek_v32
from workbench.integrations.families._common import (
    SharedModules,
    mla_decodes,
    mla_runs_shipped,
    patch_mla_model,
    rmsnorm_forward,
    rotation,
    sigmoid_router_forward,
)
from workbench.integrations.families._dsa import (
    KEY_NORM_IN_TORCH,
    dsa_attention,
    dsa_decode_attention,
    from_shipped,
    optional_blocks,
    to_shipped,
)
from workbench.integrations.transformers import Patcher

MODEL_CLASS = "GlmMoeDsaForCausalLM"
ROUTER = shipped.GlmMoeDsaTopkRouter  # its output (router_logits, top_k_weights, top_k_index): the router choices
LORA_TARGETS = deepseek_v32.LORA_TARGETS


def attention_forward(self: nn.Module, hidden_states: torch.Tensor, position_embeddings=None,
                      attention_mask: torch.Tensor | None = None, past_key_values=None, position_ids=None,
                      prev_topk_indices: torch.Tensor | None = None, **kwargs):
    """GlmMoeDsaAttention.forward as workbench::dsa_indexer (full layers) + workbench::dsa_sparse_attention; returns
    the selection in transformers' form for the next layer (an empty cache written as shipped). A cache holding this
    layer's past (decode), a mask other than the causal one or attention dropout run the shipped forward."""
    if position_embeddings is None or mla_runs_shipped(self, hidden_states, attention_mask, past_key_values, False):
        return self.original_forward(hidden_states=hidden_states, position_embeddings=position_embeddings,
                                     attention_mask=attention_mask, past_key_values=past_key_values,
                                     position_ids=position_ids, prev_topk_indices=prev_topk_indices, **kwargs)
    given = None if self.indexer is not None else from_shipped(handed_down(self, prev_topk_indices))
    out, indices = dsa_attention(self, hidden_states, *rotations(self, position_embeddings), given, past_key_values)
    return out, None, to_shipped(indices)


def attention_forward_with_decode(self: nn.Module, hidden_states: torch.Tensor, position_embeddings=None,
                                  attention_mask: torch.Tensor | None = None, past_key_values=None,
                                  position_ids=None, prev_topk_indices: torch.Tensor | None = None, **kwargs):
    """``attention_forward``, and its decode steps (``mla_decodes``) as ``dsa_decode_attention`` (a shared layer's
    over the selection handed down); returns the selection in transformers' form for the next layer."""
    if position_embeddings is not None and mla_decodes(self, hidden_states, attention_mask, past_key_values):
        given = None if self.indexer is not None else handed_down(self, prev_topk_indices)
        out, indices = dsa_decode_attention(self, hidden_states, attention_mask, past_key_values,
                                            *rotations(self, position_embeddings), given)
        return out, None, indices
    return attention_forward(self, hidden_states, position_embeddings, attention_mask, past_key_values, position_ids,
                             prev_topk_indices, **kwargs)


def rotations(self: nn.Module, position_embeddings):
    """The attention's and the indexer's rotary embeddings, both on interleaved pairs, on the module's position
    embeddings (cos, sin), as workbench::rotary or transformers' function (``_common.rotation``)."""
    apply = shipped.apply_rotary_pos_emb_interleave
    return rotation(self, position_embeddings, apply, True), rotation(self, position_embeddings, apply, True, 2)


def handed_down(self: nn.Module, prev_topk_indices: torch.Tensor | None) -> torch.Tensor | None:
    """A shared layer's selection (the previous full layer's), or the shipped layer's error where there is none."""
    if self.indexer is None and prev_topk_indices is None:
        raise ValueError("Shared DSA layers require top-k indices from a previous full indexer layer.")
    return prev_topk_indices


SHARED = SharedModules(rmsnorm=shipped.GlmMoeDsaRMSNorm, rmsnorm_forward=rmsnorm_forward, mlp=shipped.GlmMoeDsaMLP,
                       router=shipped.GlmMoeDsaTopkRouter, router_forward=sigmoid_router_forward,
                       experts=shipped.GlmMoeDsaExperts)


def apply(patcher: Patcher) -> None:
    """Swap the catalog's ops into every GLM-MoE-DSA module they compute; report each module."""
    blocks = deepseek_v32.DSA_BLOCKS
    decode = deepseek_v32.DECODE_BLOCKS
    patch_mla_model(patcher, SHARED, shipped.GlmMoeDsaAttention, attention_forward,
                    lambda module: blocks if module.indexer is not None else blocks[1:], plain_kv_b=False,
                    decode_forward=attention_forward_with_decode,
                    decode_blocks=lambda module: decode if module.indexer is not None else decode[1:],
                    optional=optional_blocks)
    patched = [r for r in patcher.report.rows if r.cls == "GlmMoeDsaAttention" and r.replaced]
    if patched:
        patcher.report.notes.append(deepseek_v32.IN_TORCH)
    if any("dsa_indexer" in r.blocks and "layernorm" not in r.blocks for r in patched):
        patcher.report.notes.append(KEY_NORM_IN_TORCH)
    if any("rotary" not in r.blocks for r in patched):
        patcher.report.notes.append(deepseek_v32.ROPE_IN_TORCH.replace("apply_rotary_pos_emb for",
                                                                       "apply_rotary_pos_emb_interleave for"))


def tiny(full, layer_types: list[str], mlp_layer_types: list[str], experts: int, top_k: int) -> dict:
    """deepseek_v32's tiny fields, with the indexer schedule: the first layer full (it has no selection to reuse),
    then the full schedule's, its last layer shared where the model has shared layers and the prefix has none."""
    kinds = list(full.indexer_types)
    rest = kinds[1:len(layer_types)]
    if "shared" in kinds and "shared" not in rest and rest:
        rest[-1] = "shared"
    return {**deepseek_v32.tiny(full, layer_types, mlp_layer_types, experts, top_k), "indexer_types": ["full", *rest]}
