"""DeepSeek-V3 (transformers ``deepseek_v3``): MLA with a rotary embedding on its rope part (interleaved pairs where
``rope_interleave``), a sigmoid MoE with group-limited routing (n_group, topk_group) and a shared expert after
``first_k_dense_replace`` dense layers, RMSNorm.

    module                            computed by
    DeepseekV3RMSNorm                 rmsnorm
    DeepseekV3MLP (silu)              swiglu (projections in torch)
    DeepseekV3TopkRouter              moe_router (sigmoid, group-limited, the config's routed_scaling_factor)
    DeepseekV3Experts (silu)          moe_permute, moe_grouped_gemm, moe_combine (the experts implementation)
    DeepseekV3Attention (MLA)         mla, and rotary on q's and k's rope parts (interleaved pairs where
                                      rope_interleave; transformers' own functions where rotary is not promoted); the
                                      projections and the latents' RMSNorm (as rmsnorm) around it; its decode steps by
                                      mla_decode (W_uk, W_uv in torch) where promoted
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as shipped

from workbench.integrations.families._common import (
    SharedModules,
    mla_attention,
    mla_decode_attention,
    mla_decodes,
    mla_runs_shipped,
    patch_mla_model,
    rmsnorm_forward,
    sigmoid_router_forward,
)
from workbench.integrations.families._common import rotation as rotary_rotation
from workbench.integrations.transformers import Patcher

MODEL_CLASS = "DeepseekV3ForCausalLM"
ROUTER = shipped.DeepseekV3TopkRouter  # its output (router_logits, top_k_weights, top_k_index): the router choices
LORA_TARGETS = ("q_a_proj", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The projections a parity run's LoRA adapts (workbench parity --lora): MLA's latents and output, the MLPs."""


def attention_forward(self: nn.Module, hidden_states: torch.Tensor, position_embeddings=None,
                      attention_mask: torch.Tensor | None = None, past_key_values=None, **kwargs):
    """DeepseekV3Attention.forward with the attention as workbench::mla, q's and k's rope parts rotated by
    workbench::rotary (or transformers' apply_rotary_pos_emb(_interleave)) on the module's position embeddings
    (cos, sin). What ``mla_runs_shipped`` names runs the shipped forward."""
    if position_embeddings is None or mla_runs_shipped(self, hidden_states, attention_mask, past_key_values):
        return self.original_forward(hidden_states=hidden_states, position_embeddings=position_embeddings,
                                     attention_mask=attention_mask, past_key_values=past_key_values, **kwargs)
    return mla_attention(self, hidden_states, rotation(self, position_embeddings), past_key_values), None


def rotation(self: nn.Module, position_embeddings):
    """The module's rotary embedding of q's and k's rope parts on its position embeddings (cos, sin): interleaved
    pairs where rope_interleave, as workbench::rotary or transformers' function (``_common.rotation``)."""
    interleaved = self.config.rope_interleave
    apply = shipped.apply_rotary_pos_emb_interleave if interleaved else shipped.apply_rotary_pos_emb
    return rotary_rotation(self, position_embeddings, apply, interleaved)


def attention_forward_with_decode(self: nn.Module, hidden_states: torch.Tensor, position_embeddings=None,
                                  attention_mask: torch.Tensor | None = None, past_key_values=None, **kwargs):
    """``attention_forward``, and its decode steps (``mla_decodes``) as ``mla_decode_attention``."""
    if position_embeddings is not None and mla_decodes(self, hidden_states, attention_mask, past_key_values):
        return mla_decode_attention(self, hidden_states, attention_mask, past_key_values,
                                    rotation(self, position_embeddings)), None
    return attention_forward(self, hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs)


SHARED = SharedModules(rmsnorm=shipped.DeepseekV3RMSNorm, rmsnorm_forward=rmsnorm_forward, mlp=shipped.DeepseekV3MLP,
                       router=shipped.DeepseekV3TopkRouter, router_forward=sigmoid_router_forward,
                       experts=shipped.DeepseekV3Experts)


def apply(patcher: Patcher) -> None:
    """Swap the catalog's ops into every DeepSeek-V3 module they compute; report each module."""
    patch_mla_model(patcher, SHARED, shipped.DeepseekV3Attention, attention_forward, lambda module: ("mla",),
                    decode_forward=attention_forward_with_decode)
    if any(r.cls == "DeepseekV3Attention" and r.replaced and "rotary" not in r.blocks for r in patcher.report.rows):
        patcher.report.notes.append("inside each MLA layer the rotary embedding of the rope parts stays in torch "
                                    "(transformers' apply_rotary_pos_emb"
                                    + ("_interleave" if patcher.model.config.rope_interleave else "") + ")")


def tiny(full, layer_types: list[str], mlp_layer_types: list[str], experts: int, top_k: int) -> dict:
    """The fields of a tiny DeepseekV3Config of ``full``'s architecture: widths shrunk, the dense layers first (as
    many as ``mlp_layer_types`` says), expert counts and routing as chosen by the parity
    (workbench.integrations.parity.tiny_config), the rotary embedding and every switch kept."""
    groups = full.n_group if experts % full.n_group == 0 and experts // full.n_group >= 2 else 1
    return {
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_hidden_layers": len(layer_types), "first_k_dense_replace": mlp_layer_types.count("dense"),
        "num_attention_heads": 4, "num_key_value_heads": 4,
        "q_lora_rank": None if full.q_lora_rank is None else 24, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "n_routed_experts": experts, "num_experts_per_tok": top_k, "n_shared_experts": full.n_shared_experts,
        "n_group": groups, "topk_group": min(full.topk_group, groups) if groups > 1 else 1,
        "norm_topk_prob": full.norm_topk_prob, "routed_scaling_factor": full.routed_scaling_factor,
        **({"rope_interleave": full.rope_interleave} if hasattr(full, "rope_interleave") else {}),
        "rope_parameters": full.rope_parameters,
        "hidden_act": full.hidden_act, "rms_norm_eps": full.rms_norm_eps, "attention_bias": full.attention_bias,
        "tie_word_embeddings": full.tie_word_embeddings, "pad_token_id": None, "bos_token_id": None,
        "eos_token_id": None,
    }
