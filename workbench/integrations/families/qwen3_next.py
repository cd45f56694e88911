"""Qwen3-Next (transformers ``qwen3_next``): Gated DeltaNet layers (a short convolution on q, k and v, the gated
delta rule with one decay per value head, a SiLU-gated output norm) and gated softmax-attention layers, 3 to 1; a
softmax-routed MoE with a sigmoid-gated shared expert; zero-centred RMSNorm.

    module                            computed by
    Qwen3NextRMSNorm                  rmsnorm with weight 1 + w (the zero-centred norm: x / rms(x) * (1 + w))
    Qwen3NextMLP (silu)               swiglu (projections in torch; also the shared expert)
    Qwen3NextTopKRouter               moe_router (softmax, renormalized where norm_topk_prob, no bias, scale 1)
    Qwen3NextExperts (silu)           moe_permute, moe_grouped_gemm, moe_combine (the experts implementation)
    Qwen3NextGatedDeltaNet            kda_short_conv; kda_gate (softplus form, one channel per value head);
                                      kda_prologue (the l2norm of q and k and beta's sigmoid; in torch where it is
                                      not promoted); kda (the gated delta rule is KDA with one decay for every key
                                      channel of a head)
    Qwen3NextRMSNormGated             rmsnorm_gated, silu gate: rmsnorm(o) * weight * silu(z) (the weight plain, not
                                      zero-centred); the module rounds the normed o and its product with the weight
                                      to the input dtype before the gate (in bfloat16 two roundings more than the
                                      block's one; in float32 the same)
    Qwen3NextAttention                attention (GQA, through transformers' attention registry: the model's
                                      attention implementation becomes the workbench's); the projections, the q/k
                                      RMSNorm, the partial rotary embedding and the sigmoid output gate stay in torch
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.qwen3_next import modeling_qwen3_next as shipped

from workbench.integrations.families._common import (
    SharedModules,
    empty_cache,
    finish_shared,
    kda_prologue,
    patch_attention,
    patch_gated_rmsnorm,
    patch_shared,
    requested_logits,
    short_conv_supported,
)
from workbench.integrations.ops import ops
from workbench.integrations.transformers import Patcher

MODEL_CLASS = "Qwen3NextForCausalLM"
ROUTER = shipped.Qwen3NextTopKRouter  # its output (router_logits, top_k_weights, top_k_index): the router choices
HUB_BOUND = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
             "causal_conv1d_update")
"""The module's functions transformers binds to an installed package's kernels (fla, causal-conv1d) at import."""
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkvz", "out_proj", "gate_proj", "up_proj",
                "down_proj")
"""The projections a parity run's LoRA adapts (workbench parity --lora): attention, the DeltaNet's, the MLPs."""
LEFT_IN_TORCH = "inside each Gated DeltaNet layer the l2norm of q and k (eps 1e-6) and beta's sigmoid stay in torch"


def zero_centred_rmsnorm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """Qwen3NextRMSNorm, x / rms(x) * (1 + w) in float32, as workbench::rmsnorm with weight 1 + w."""
    return ops.rmsnorm(hidden_states, 1.0 + self.weight.float(), self.eps)


def softmax_router_forward(self: nn.Module, hidden_states: torch.Tensor):
    """Qwen3NextTopKRouter as workbench::moe_router: softmax scores of the float32 logits, top k, renormalized where
    norm_topk_prob, no selection bias, scale 1; returns (router_logits, top_k_weights [N, k] in the input's dtype,
    top_k_index [N, k]). The sparse MoE block discards the logits: they are computed (in torch) only when the model
    is asked for them (config.output_router_logits), else None."""
    x = hidden_states.reshape(-1, self.hidden_dim)
    bias = torch.zeros(self.num_experts, dtype=torch.float32, device=x.device)
    weights, ids, _ = ops.moe_router(x, self.weight, bias, self.top_k, "softmax", None, bool(self.norm_topk_prob), 1.0)
    return requested_logits(self, x), weights.to(x.dtype), ids


def gated_delta_net_forward(self: nn.Module, hidden_states: torch.Tensor, cache_params=None,
                            attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """Qwen3NextGatedDeltaNet.forward with the short convolution as workbench::kda_short_conv, the decay
    -exp(A_log) softplus(a + dt_bias) as workbench::kda_gate (K = 1 per value head) and the gated delta rule as
    workbench::kda with that decay on every key channel; into an empty cache (a prefill from the first token) it
    writes the conv input's tail and the final state as the shipped forward does. A cache holding this layer's past
    (decode), packed sequences or an adapted conv1d run the shipped forward."""
    if not empty_cache(cache_params, self.layer_idx) or kwargs.get("cu_seq_lens_q") is not None \
            or type(self.conv1d) is not nn.Conv1d:
        return self.original_forward(hidden_states, cache_params=cache_params, attention_mask=attention_mask,
                                     **kwargs)
    hidden_states = shipped.apply_mask_to_padding_states(hidden_states, attention_mask)
    b, t = hidden_states.shape[:2]
    query, key, value, z, beta_logit, a = self.fix_query_key_value_ordering(self.in_proj_qkvz(hidden_states),
                                                                            self.in_proj_ba(hidden_states))
    mixed = torch.cat([x.reshape(b, t, -1) for x in (query, key, value)], dim=-1)
    if cache_params is not None:
        cache_params.update_conv_state(mixed.transpose(1, 2), self.layer_idx, conv_kernel_size=self.conv_kernel_size)
    mixed = ops.kda_short_conv(mixed, self.conv1d.weight.squeeze(1))
    q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
    q, k = (x.reshape(b, t, -1, self.head_k_dim) for x in (q, k))
    v = v.reshape(b, t, -1, self.head_v_dim)
    heads = self.num_v_heads
    g = ops.kda_gate(a.reshape(b, t, heads, 1), self.A_log, self.dt_bias.view(heads, 1), None)
    g = g.expand(b, t, heads, self.head_k_dim).contiguous()
    q, k, beta = kda_prologue(self, q, k, beta_logit)
    o, final_state = ops.kda(q, k, v, g.to(v.dtype), beta.to(v.dtype), self.head_k_dim ** -0.5, None)
    if cache_params is not None:
        cache_params.update_recurrent_state(final_state, self.layer_idx)
    o = self.norm(o.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(o.reshape(b, t, -1))


SHARED = SharedModules(rmsnorm=shipped.Qwen3NextRMSNorm, rmsnorm_forward=zero_centred_rmsnorm_forward,
                       mlp=shipped.Qwen3NextMLP, router=shipped.Qwen3NextTopKRouter,
                       router_forward=softmax_router_forward, experts=shipped.Qwen3NextExperts)


def apply(patcher: Patcher) -> None:
    """Swap the catalog's ops into every Qwen3-Next module they compute; report each module."""
    report = patcher.report
    for path, module in patcher.model.named_modules():
        if patch_shared(patcher, path, module, SHARED):
            continue
        if isinstance(module, shipped.Qwen3NextRMSNormGated):
            patch_gated_rmsnorm(patcher, path, module)
        elif isinstance(module, shipped.Qwen3NextGatedDeltaNet):
            why = short_conv_supported(module)
            if why:
                report.leave(path, module, why)
            elif patcher.wants(path, module, "kda_short_conv", "kda_gate", "kda"):
                patcher.set_forward(path, module, gated_delta_net_forward, "kda_short_conv", "kda_gate",
                                    *(("kda_prologue",) if patcher.may("kda_prologue") else ()), "kda")
    finish_shared(patcher)
    patch_attention(patcher, (shipped.Qwen3NextAttention,),
                    "the projections, the q/k RMSNorm and the sigmoid output gate")
    if any(r.cls == "Qwen3NextGatedDeltaNet" and r.replaced and "kda_prologue" not in r.blocks for r in report.rows):
        report.notes.append(LEFT_IN_TORCH)
    report.notes.append("plain projections (nn.Linear, the shared expert's sigmoid gate) run in torch")


def tiny(full, layer_types: list[str], mlp_layer_types: list[str], experts: int, top_k: int) -> dict:
    """The fields of a tiny Qwen3NextConfig of ``full``'s architecture: widths shrunk (value heads per key head
    kept), the layer schedule, dense layers where ``mlp_layer_types`` says, expert counts and routing as chosen by
    the parity (workbench.integrations.parity.tiny_config), every switch kept."""
    group = max(1, full.linear_num_value_heads // full.linear_num_key_heads)
    return {
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48, "num_hidden_layers": len(layer_types), "layer_types": layer_types,
        "mlp_only_layers": [i for i, kind in enumerate(mlp_layer_types) if kind == "dense"], "decoder_sparse_step": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rope_parameters": full.rope_parameters,
        "linear_num_key_heads": 2, "linear_num_value_heads": 2 * group, "linear_key_head_dim": 16,
        "linear_value_head_dim": 16, "linear_conv_kernel_dim": full.linear_conv_kernel_dim,
        "num_experts": experts, "num_experts_per_tok": top_k, "norm_topk_prob": full.norm_topk_prob,
        "hidden_act": full.hidden_act, "rms_norm_eps": full.rms_norm_eps, "attention_bias": full.attention_bias,
        "tie_word_embeddings": full.tie_word_embeddings, "pad_token_id": None, "bos_token_id": None,
        "eos_token_id": None,
    }
