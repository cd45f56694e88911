"""Kimi Linear (transformers ``kimi_linear``; Kimi K3's text config carries this model_type too): KDA layers (short
convolution, softplus forget gate, delta rule, sigmoid-gated output norm), MLA layers without rotary embedding,
a sigmoid MoE with a shared expert, RMSNorm.

    module                            computed by
    KimiLinearRMSNorm                 rmsnorm
    KimiLinearMLP (silu)              swiglu (projections in torch)
    KimiLinearTopkRouter              moe_router (group-limited where n_group > 1)
    KimiLinearExperts (silu)          moe_permute, moe_grouped_gemm, moe_combine (the experts implementation)
    KimiLinearAttention (MLA)         mla (projections and the latent's RMSNorm around it); its decode steps by
                                      mla_decode (W_uk, W_uv in torch) where promoted
    KimiLinearDeltaAttention (KDA)    kda_short_conv, kda_prologue (the l2norm of q and k, beta's sigmoid; in torch
                                      where it is not promoted: _common.KDA_LEFT_IN_TORCH), kda; its decode steps
                                      (one token over the cache) by kda_short_conv_decode and kda_decode where both
                                      are promoted
    KimiLinearForgetGate              kda_gate, softplus form -exp(A_log) * softplus(f + dt_bias) (projections in torch)
    KimiLinearRMSNormGated            rmsnorm_gated, sigmoid gate: rmsnorm(o) * weight * sigmoid(gate) per head,
                                      float32 math and one rounding, as the module computes it
"""

from __future__ import annotations

from torch import nn
from transformers.models.kimi_linear import modeling_kimi_linear as shipped

from workbench.integrations.families._common import (
    SharedModules,
    finish_shared,
    forget_gate_forward,
    mla_forward,
    mla_forward_with_decode,
    patch_gated_rmsnorm,
    patch_kda_layer,
    patch_shared,
    qualified,
    rmsnorm_forward,
    sigmoid_router_forward,
)
from workbench.integrations.transformers import Patcher

MODEL_CLASS = "KimiLinearForCausalLM"
ROUTER = shipped.KimiLinearTopkRouter  # its output (router_logits, top_k_weights, top_k_index): the router choices
HUB_BOUND = ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention", "causal_conv1d_fn",
             "causal_conv1d_update")
"""The module's functions transformers binds to an installed package's kernels (fla, causal-conv1d) at import."""
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "kv_a_proj_with_mqa", "gate_proj", "up_proj", "down_proj")
"""The projections a parity run's LoRA adapts (workbench parity --lora): attention, MLA's latent, the MLPs."""

SHARED = SharedModules(rmsnorm=shipped.KimiLinearRMSNorm, rmsnorm_forward=rmsnorm_forward, mlp=shipped.KimiLinearMLP,
                       router=shipped.KimiLinearTopkRouter, router_forward=sigmoid_router_forward,
                       experts=shipped.KimiLinearExperts)


def apply(patcher: Patcher) -> None:
    """Swap the catalog's ops into every Kimi Linear module they compute; report each module."""
    report = patcher.report
    for path, module in patcher.model.named_modules():
        if patch_shared(patcher, path, module, SHARED):
            continue
        if isinstance(module, shipped.KimiLinearRMSNormGated):
            patch_gated_rmsnorm(patcher, path, module)
        elif isinstance(module, shipped.KimiLinearAttention):
            if type(module.kv_b_proj) is not nn.Linear:
                report.leave(path, module, f"kv_b_proj is a {qualified(module.kv_b_proj)} (an adapter): mla takes "
                                           "W_uk and W_uv as plain weights")
            elif patcher.wants(path, module, "mla"):
                if patcher.may("mla_decode"):
                    patcher.set_forward(path, module, mla_forward_with_decode, "mla", "mla_decode")
                else:
                    patcher.set_forward(path, module, mla_forward, "mla")
        elif isinstance(module, shipped.KimiLinearDeltaAttention):
            patch_kda_layer(patcher, path, module)
        elif isinstance(module, shipped.KimiLinearForgetGate):
            if patcher.wants(path, module, "kda_gate"):
                patcher.set_forward(path, module, forget_gate_forward, "kda_gate")
    finish_shared(patcher)
    report.notes.append("plain projections (nn.Linear) run in torch")


def tiny(full, layer_types: list[str], mlp_layer_types: list[str], experts: int, top_k: int) -> dict:
    """The fields of a tiny KimiLinearConfig of ``full``'s architecture: widths shrunk, the layer schedule, expert
    counts and routing as chosen by the parity (workbench.integrations.parity.tiny_config), every switch kept."""
    return {
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_hidden_layers": len(layer_types), "layer_types": layer_types, "mlp_layer_types": mlp_layer_types,
        "num_attention_heads": 4, "num_key_value_heads": 4,
        "q_lora_rank": None if full.q_lora_rank is None else 24, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "linear_num_heads": 4, "linear_head_dim": 16, "linear_conv_kernel_dim": full.linear_conv_kernel_dim,
        "num_local_experts": experts, "num_experts_per_tok": top_k, "n_shared_experts": full.n_shared_experts,
        "n_group": full.n_group if experts % full.n_group == 0 else 1, "topk_group": full.topk_group,
        "norm_topk_prob": full.norm_topk_prob, "routed_scaling_factor": full.routed_scaling_factor,
        "hidden_act": full.hidden_act, "rms_norm_eps": full.rms_norm_eps, "attention_bias": full.attention_bias,
        "tie_word_embeddings": full.tie_word_embeddings, "pad_token_id": None, "bos_token_id": None,
        "eos_token_id": None,
    }
