"""GLM-5-Next (transformers ``glm5_next``, GLM-5.3-Flash, a vision-language class whose text model is built from
the config's text fields; and that text model loaded alone, ``glm5_next_text``): KDA layers with the bounded forget
gate (Kimi K3's), DSA layers with a k-pool compressed indexer and no rotary embedding, manifold-constrained
hyper-connections around every sublayer, a group-limited sigmoid MoE with a shared expert, SwiGLU with clamped
inputs, RMSNorm.

    module                            computed by
    Glm5NextTextRMSNorm               rmsnorm
    Glm5NextTextTopkRouter            moe_router (sigmoid, group-limited, the config's routed_scaling_factor)
    Glm5NextTextLinearAttention       kda_short_conv, kda (Kimi Linear's KDA layer: the same forward); its decode
                                      steps by kda_short_conv_decode and kda_decode where both are promoted
    Glm5NextTextForgetGate            kda_gate, bounded form lower_bound * sigmoid(exp(A_log) * (f + dt_bias))
    Glm5NextTextMLP                   swiglu, clamped: silu(min(a, L)) * clamp(b, -L, L) with L = swiglu_limit
                                      (projections in torch; also the shared experts)
    Glm5NextTextExperts               moe_permute, moe_grouped_gemm with the same clamped SwiGLU, moe_combine (the
                                      experts implementation)
    Glm5NextTextAttention             left alone: its indexer scores k-pools of index_kpool keys (dsa_indexer scores
                                      every key)
    Glm5NextTextRMSNormGated          rmsnorm_gated, sigmoid gate (Kimi Linear's output norm: plain weight, float32
                                      math, one rounding)
    Glm5NextTextHyperConnection       hyper_connection (the weights: pre, post and the Sinkhorn-normalised comb;
                                      the pre-weighted collapse)
    Glm5NextTextDecoderLayer          hyper_connection_mix (each sub-layer's output expanded into the streams and
                                      the streams mixed: the layer's forward, with that step swapped)
"""

from __future__ import annotations

from transformers.models.glm5_next import modeling_glm5_next as shipped

from workbench.integrations.families import kimi_linear
from workbench.integrations.families._common import (
    EXPERT_BLOCKS,
    SWIGLU,
    SharedModules,
    clamped_mlp_forward,
    finish_shared,
    forget_gate_forward,
    hyper_connection_forward,
    hyper_connection_mix,
    patch_gated_rmsnorm,
    patch_kda_layer,
    patch_shared,
    rmsnorm_forward,
    sigmoid_router_forward,
)
from workbench.integrations.transformers import Patcher

MODEL_CLASS = "Glm5NextForConditionalGeneration"
MODEL_TYPE = "glm5_next"
"""The model_type of MODEL_CLASS's config: the text model (``glm5_next_text``, ``Glm5NextTextModel``) has no LM head
of its own, so a parity of either runs the vision-language class on its text (its vision tower one tiny block)."""
ROUTER = shipped.Glm5NextTextTopkRouter  # its output (router_logits, top_k_weights, top_k_index): the router choices
HUB_BOUND = kimi_linear.HUB_BOUND
LORA_TARGETS = kimi_linear.LORA_TARGETS

SHARED = SharedModules(rmsnorm=shipped.Glm5NextTextRMSNorm, rmsnorm_forward=rmsnorm_forward, mlp=None,
                       router=shipped.Glm5NextTextTopkRouter, router_forward=sigmoid_router_forward, experts=None)
"""The MLPs and experts are not shared: the class always clamps their SwiGLU's inputs (swiglu_limit, a float)."""

LEFT_ALONE = {
    shipped.Glm5NextTextAttention: "DSA whose indexer scores k-pools of index_kpool keys and keeps the tail pool: "
                                   "dsa_indexer scores every key",
}


def decoder_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                          use_cache=False, position_embeddings=None, prev_topk_indices=None, **kwargs):
    """``Glm5NextTextDecoderLayer.forward`` (transformers 5.23) with each sub-layer's expand and mix as
    workbench::hyper_connection_mix: hidden_states [B, S, N, D] -> ([B, S, N, D], the DSA layer's top-k indices or
    None). The rest is the shipped layer's, step for step: the hyper-connections, norms, attention and MLP modules
    are called as they are (each patched where a block computes it)."""
    residual = hidden_states
    post, comb, hidden_states = self.attn_hc(hidden_states)
    hidden_states = self.input_layernorm(hidden_states)
    topk_indices = None
    if self.block_type == "linear_attention":
        hidden_states = self.self_attn(hidden_states=hidden_states, cache_params=past_key_values,
                                       attention_mask=attention_mask, **kwargs)
    else:
        hidden_states, _, topk_indices = self.self_attn(
            hidden_states=hidden_states, attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=past_key_values, use_cache=use_cache, position_embeddings=position_embeddings,
            prev_topk_indices=prev_topk_indices, **kwargs)
    hidden_states = hyper_connection_mix(hidden_states, residual, post, comb)

    residual = hidden_states
    post, comb, hidden_states = self.ffn_hc(hidden_states)
    hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
    return hyper_connection_mix(hidden_states, residual, post, comb), topk_indices


def apply(patcher: Patcher) -> None:
    """Swap the catalog's ops into every GLM-5-Next text module they compute; report each module."""
    report = patcher.report
    for path, module in patcher.model.named_modules():
        if path == "model.visual" or path.startswith("model.visual."):
            continue  # the vision tower: no block computes its modules
        if patch_shared(patcher, path, module, SHARED):
            continue
        if isinstance(module, shipped.Glm5NextTextMLP):
            if patcher.wants(path, module, "swiglu"):
                patcher.set_forward(path, module, clamped_mlp_forward, "swiglu")
        elif isinstance(module, shipped.Glm5NextTextExperts):
            if patcher.wants(path, module, *EXPERT_BLOCKS):
                module.workbench_activation = (*SWIGLU, float(module.swiglu_limit))
                report.replace(path, module, *EXPERT_BLOCKS)
        elif isinstance(module, shipped.Glm5NextTextLinearAttention):
            patch_kda_layer(patcher, path, module)
        elif isinstance(module, shipped.Glm5NextTextForgetGate):
            if patcher.wants(path, module, "kda_gate"):
                patcher.set_forward(path, module, forget_gate_forward, "kda_gate")
        elif isinstance(module, shipped.Glm5NextTextRMSNormGated):
            patch_gated_rmsnorm(patcher, path, module)
        elif isinstance(module, shipped.Glm5NextTextHyperConnection):
            if patcher.wants(path, module, "hyper_connection"):
                patcher.set_forward(path, module, hyper_connection_forward, "hyper_connection")
        elif isinstance(module, shipped.Glm5NextTextDecoderLayer):
            if patcher.wants(path, module, "hyper_connection_mix"):
                patcher.set_forward(path, module, decoder_layer_forward, "hyper_connection_mix")
        elif type(module) in LEFT_ALONE:
            report.leave(path, module, LEFT_ALONE[type(module)])
    finish_shared(patcher)
    report.notes.append("the vision tower (model.visual) runs as shipped; plain projections (nn.Linear) run in "
                        "torch")


def tiny(full, layer_types: list[str], mlp_layer_types: list[str], experts: int, top_k: int) -> dict:
    """The text fields of a tiny GLM-5-Next (``full``: the text config) and a one-block vision tower: widths shrunk,
    the layer and MLP schedules, the indexer schedule (its first layer full), a top 8 of pools of 4 keys, expert
    counts and routing as chosen by the parity, the gate's lower bound, the clamp, the hyper-connection streams and
    every switch kept."""
    groups = full.n_group if experts % full.n_group == 0 and experts // full.n_group >= 2 else 1
    return {
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_hidden_layers": len(layer_types), "layer_types": layer_types, "mlp_layer_types": mlp_layer_types,
        "indexer_types": ["full", *list(full.indexer_types)[1:len(layer_types)]],
        "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 0, "v_head_dim": 16,
        "index_topk": 8, "index_kpool": 4, "index_n_heads": 4, "index_head_dim": 16,
        "index_kpool_always_select_tail": full.index_kpool_always_select_tail,
        "linear_num_heads": 4, "linear_head_dim": 16, "linear_conv_kernel_dim": full.linear_conv_kernel_dim,
        "linear_lower_bound": full.linear_lower_bound, "swiglu_limit": full.swiglu_limit,
        "hc_mult": full.hc_mult, "hc_eps": full.hc_eps, "hc_sinkhorn_iters": full.hc_sinkhorn_iters,
        "n_routed_experts": experts, "num_experts_per_tok": top_k, "n_shared_experts": full.n_shared_experts,
        "n_group": groups, "topk_group": min(full.topk_group, groups) if groups > 1 else 1,
        "norm_topk_prob": full.norm_topk_prob, "routed_scaling_factor": full.routed_scaling_factor,
        "hidden_act": full.hidden_act, "rms_norm_eps": full.rms_norm_eps, "attention_bias": full.attention_bias,
        "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
        "vision_config": {"depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 32,
                          "out_hidden_size": 64, "projection_intermediate_size": 32},
    }
