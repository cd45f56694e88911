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
    KimiLinearDeltaAttention (KDA)    kda_short_conv, kda; its decode steps (one token over the cache) by
                                      kda_short_conv_decode and kda_decode where both are promoted; the l2norm of q
                                      and k and beta's sigmoid stay in torch (see LEFT_IN_TORCH)
    KimiLinearForgetGate              kda_gate, softplus form -exp(A_log) * softplus(f + dt_bias) (projections in torch)
    KimiLinearRMSNormGated            rmsnorm_gated, sigmoid gate: rmsnorm(o) * weight * sigmoid(gate) per head,
                                      float32 math and one rounding, as the module computes it
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.kimi_linear import modeling_kimi_linear as shipped

from workbench.integrations.families._common import (
    SharedModules,
    empty_cache,
    finish_shared,
    forget_gate_forward,
    mla_forward,
    mla_forward_with_decode,
    patch_gated_rmsnorm,
    patch_shared,
    qualified,
    rmsnorm_forward,
    short_conv_supported,
    sigmoid_router_forward,
)
from workbench.integrations.transformers import Patcher
from workbench.kernels import kda, kda_decode, kda_short_conv, kda_short_conv_decode

MODEL_CLASS = "KimiLinearForCausalLM"
ROUTER = shipped.KimiLinearTopkRouter  # its output (router_logits, top_k_weights, top_k_index): the router choices
HUB_BOUND = ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention", "causal_conv1d_fn",
             "causal_conv1d_update")
"""The module's functions transformers binds to an installed package's kernels (fla, causal-conv1d) at import."""
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "kv_a_proj_with_mqa", "gate_proj", "up_proj", "down_proj")
"""The projections a parity run's LoRA adapts (workbench parity --lora): attention, MLA's latent, the MLPs."""

LEFT_IN_TORCH = "inside each KDA layer the l2norm of q and k (eps 1e-6) and the sigmoid of beta stay in torch"
DECODE_BLOCKS = ("kda_short_conv_decode", "kda_decode")


def kda_layer_forward(self: nn.Module, hidden_states: torch.Tensor, cache_params=None,
                      attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """KimiLinearDeltaAttention.forward (and GLM-5-Next's, the same code) with the short convolution as
    workbench::kda_short_conv and the delta rule as workbench::kda (no initial state); into an empty cache (a
    prefill from the first token) it writes the conv input's tail and the final state as the shipped forward does.
    A cache holding this layer's past (decode), packed sequences (cu_seqlens) or an adapted conv1d (its weight alone
    is not what it computes) run the shipped forward."""
    if not empty_cache(cache_params, self.layer_idx) or kwargs.get("cu_seqlens") is not None \
            or type(self.conv1d) is not nn.Conv1d:
        return self.original_forward(hidden_states, cache_params=cache_params, attention_mask=attention_mask,
                                     **kwargs)
    hidden_states = shipped.apply_mask_to_padding_states(hidden_states, attention_mask)
    b, t = hidden_states.shape[:2]
    heads = (b, t, -1, self.head_dim)
    mixed = torch.cat([self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)], dim=-1)
    if cache_params is not None:
        cache_params.update_conv_state(mixed.transpose(1, 2), self.layer_idx, conv_kernel_size=self.conv_kernel_size)
    mixed = kda_short_conv(mixed, self.conv1d.weight.squeeze(1))
    q, k, v = (part.reshape(heads) for part in mixed.split(self.qkv_dim, dim=-1))
    g = self.forget_gate(hidden_states)
    beta = torch.sigmoid(self.b_proj(hidden_states))
    q = shipped.l2norm(q.float(), dim=-1, eps=1e-6).to(v.dtype)
    k = shipped.l2norm(k.float(), dim=-1, eps=1e-6).to(v.dtype)
    o, final_state = kda(q, k, v, g.to(v.dtype), beta.to(v.dtype), self.head_dim ** -0.5, None)
    if cache_params is not None:
        cache_params.update_recurrent_state(final_state.to(torch.float32), self.layer_idx)
    gate = self.g_b_proj(self.g_a_proj(hidden_states)).view(heads)
    return self.o_proj(self.o_norm(o, gate).reshape(b, t, -1))


def kda_layer_forward_with_decode(self: nn.Module, hidden_states: torch.Tensor, cache_params=None,
                                  attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """kda_layer_forward, and a decode step (one token of each sequence over a cache that holds this layer's past)
    through workbench::kda_short_conv_decode and workbench::kda_decode: the cache's conv states [B, 3 x qkv, W] and
    recurrent states [B, HV, K, V] float32 are the ops' caches, sequence b in slot b, updated in place as the
    shipped causal_conv1d_update and recurrent step update them."""
    decode = hidden_states.shape[1] == 1 and not empty_cache(cache_params, self.layer_idx)
    if not decode or kwargs.get("cu_seqlens") is not None or type(self.conv1d) is not nn.Conv1d:
        return kda_layer_forward(self, hidden_states, cache_params=cache_params, attention_mask=attention_mask,
                                 **kwargs)
    conv_state = cache_params.get_conv_state(self.layer_idx, state_idx=0)
    recurrent_state = cache_params.get_recurrent_state(self.layer_idx, state_idx=0)
    hidden_states = shipped.apply_mask_to_padding_states(hidden_states, attention_mask)
    b = hidden_states.shape[0]
    x = hidden_states[:, 0]
    slots = torch.arange(b, device=x.device)
    mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
    mixed, _ = kda_short_conv_decode(mixed, self.conv1d.weight.squeeze(1), conv_state, slots)
    q, k, v = (part.reshape(b, -1, self.head_dim) for part in mixed.split(self.qkv_dim, dim=-1))
    g = self.forget_gate(hidden_states)[:, 0]
    beta = torch.sigmoid(self.b_proj(hidden_states))[:, 0]
    q = shipped.l2norm(q.float(), dim=-1, eps=1e-6).to(v.dtype)
    k = shipped.l2norm(k.float(), dim=-1, eps=1e-6).to(v.dtype)
    o, _ = kda_decode(q, k, v, g.to(v.dtype), beta.to(v.dtype), self.head_dim ** -0.5, recurrent_state, slots)
    gate = self.g_b_proj(self.g_a_proj(hidden_states)).view(b, 1, -1, self.head_dim)
    return self.o_proj(self.o_norm(o[:, None], gate).reshape(b, 1, -1))


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


def patch_kda_layer(patcher: Patcher, path: str, module: nn.Module) -> None:
    """A KDA layer (Kimi Linear's KimiLinearDeltaAttention, GLM-5-Next's Glm5NextTextLinearAttention: the same
    forward) by kda_short_conv + kda, and its decode steps by their serving forms where both are promoted and
    requested; or left alone with the reason."""
    why = short_conv_supported(module)
    if why:
        patcher.report.leave(path, module, why)
    elif patcher.wants(path, module, "kda_short_conv", "kda"):
        if patcher.may(*DECODE_BLOCKS):
            patcher.set_forward(path, module, kda_layer_forward_with_decode, "kda_short_conv", "kda", *DECODE_BLOCKS)
        else:
            patcher.set_forward(path, module, kda_layer_forward, "kda_short_conv", "kda")
        if LEFT_IN_TORCH not in patcher.report.notes:
            patcher.report.notes.append(LEFT_IN_TORCH)


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
