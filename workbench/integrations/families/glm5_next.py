"""GLM-5-Next (transformers ``glm5_next``, GLM-5.3-Flash, a vision-language class whose text model is built from
the config's text fields; and that text model loaded alone, ``glm5_next_text``): KDA layers with the bounded forget
gate (Kimi K3's), DSA layers with a k-pool compressed indexer and no rotary embedding, manifold-constrained
hyper-connections around every sublayer, a group-limited sigmoid MoE with a shared expert, SwiGLU with clamped
inputs, RMSNorm.

    module                            computed by
    Glm5NextTextRMSNorm               rmsnorm
    Glm5NextTextTopkRouter            moe_router (sigmoid, group-limited, the config's routed_scaling_factor)
    Glm5NextTextLinearAttention       kda_short_conv, kda_prologue, kda (Kimi Linear's KDA layer: the same
                                      forward); its decode steps by kda_short_conv_decode and kda_decode where both
                                      are promoted
    Glm5NextTextForgetGate            kda_gate, bounded form lower_bound * sigmoid(exp(A_log) * (f + dt_bias))
    Glm5NextTextMLP                   swiglu, clamped: silu(min(a, L)) * clamp(b, -L, L) with L = swiglu_limit
                                      (projections in torch; also the shared experts)
    Glm5NextTextExperts               moe_permute, moe_grouped_gemm with the same clamped SwiGLU, moe_combine (the
                                      experts implementation)
    Glm5NextTextAttention             dsa_kpool_indexer (full layers: the pools' keys, scores, top pools and tail;
                                      its projections in torch, its key LayerNorm by layernorm where promoted) and
                                      dsa_sparse_attention over the
                                      decompressed heads (no rotary embedding; shared layers over the selection
                                      handed down); a decode step as dsa_kpool_indexer_decode and dsa_decode over
                                      paged caches where both are promoted; padded batches (the full layers'
                                      decode steps too) and continued prefills as shipped
    Glm5NextTextRMSNormGated          rmsnorm_gated, sigmoid gate (Kimi Linear's output norm: plain weight, float32
                                      math, one rounding)
    Glm5NextTextHyperConnection       hyper_connection (the weights: pre, post and the Sinkhorn-normalised comb;
                                      the pre-weighted collapse)
    Glm5NextTextDecoderLayer          hyper_connection_mix (each sub-layer's output expanded into the streams and
                                      the streams mixed: the layer's forward, with that step swapped)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.glm5_next import modeling_glm5_next as shipped

from workbench.integrations.families import kimi_linear
from workbench.integrations.families._common import (
    EXPERT_BLOCKS,
    SWIGLU,
    SharedModules,
    absorbed,
    clamped_mlp_forward,
    decode_pages,
    empty_cache,
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
from workbench.integrations.families._dsa import KEY_NORM_IN_TORCH, decode_latents, dsa_attention, key_norm
from workbench.integrations.ops import ops
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

DSA_BLOCKS = ("dsa_kpool_indexer", "dsa_sparse_attention")
DECODE_BLOCKS = ("dsa_kpool_indexer_decode", "dsa_decode")
IN_TORCH = ("inside each DSA layer the projections, the latents' RMSNorm and kv_b_proj's decompression stay in torch; "
            "padded batches (the full layers' decode steps too) and continued prefills run the shipped attention")
DECODES_IN_TORCH = "the DSA layers' decode steps run the shipped attention (dsa_kpool_indexer_decode or dsa_decode " \
                   "not promoted)"


def select_pools(self: nn.Module, hidden_states: torch.Tensor, q_resid: torch.Tensor, cache=None) -> torch.Tensor:
    """The DSA attention ``self``'s Glm5NextTextIndexer.forward on an unpadded batch from its first token as
    workbench::dsa_kpool_indexer (its key norm as ``_dsa.key_norm``): its key indices [B, T, index_topk
    (+ index_kpool - 1 with the tail)] int64, -1 padded (no gradients, as shipped); ``cache`` (empty for this
    layer): the packed index states written to it, as the shipped indexer does."""
    indexer = self.indexer
    b, t = hidden_states.shape[:2]
    with torch.no_grad():
        q = indexer.wq_b(q_resid).view(b, t, indexer.n_heads, indexer.head_dim)
        k = key_norm(self, indexer.wk(hidden_states))
        gate = F.linear(hidden_states, indexer.index_kpool_compress_gate)
        if cache is not None:
            cache.update_indexer(torch.cat([k, gate, k.new_ones(b, t, 1)], dim=-1), indexer.layer_idx)
        w = indexer.weights_proj(hidden_states.to(indexer.weights_proj.weight.dtype)).float()
        w = w * (indexer.n_heads ** -0.5 * indexer.softmax_scale)
        return ops.dsa_kpool_indexer(q.contiguous(), k.contiguous(), w, gate.contiguous(),
                                     indexer.index_kpool_compress_ape, indexer.index_topk,
                                     bool(indexer.index_kpool_always_select_tail))[2]


def attention_forward(self: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None,
                      past_key_values=None, prev_topk_indices: torch.Tensor | None = None, **kwargs):
    """Glm5NextTextAttention.forward as workbench::dsa_kpool_indexer (full layers) + workbench::dsa_sparse_attention
    over the decompressed heads, no rotary embedding; returns the selection as shipped (int32, -1 padded) where the
    next layer shares it. A cache holding this layer's past (decode, a continued prefill), a padded batch (the
    indexer pools from each row's first real token) or attention dropout run the shipped forward."""
    if not empty_cache(past_key_values, self.layer_idx) or bool(self.training and self.attention_dropout) or \
            (attention_mask is not None and not bool(attention_mask.all())):
        return self.original_forward(hidden_states, attention_mask, past_key_values, prev_topk_indices, **kwargs)
    if self.indexer is None and prev_topk_indices is None:
        raise ValueError("Shared DSA layers require top-k indices from a previous full indexer layer.")
    given = None if self.indexer is not None else prev_topk_indices.long()
    out, indices = dsa_attention(self, hidden_states, unrotated, None, given, past_key_values,
                                 lambda q_resid: select_pools(self, hidden_states, q_resid, past_key_values))
    return out, None, indices.to(torch.int32) if self.next_skip_topk else None


def attention_forward_with_decode(self: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None,
                                  past_key_values=None, prev_topk_indices: torch.Tensor | None = None, **kwargs):
    """``attention_forward``, and its decode steps (``decodes``) as ``decode_attention``."""
    if decodes(self, hidden_states, past_key_values) and (self.indexer is not None or prev_topk_indices is not None):
        out, indices = decode_attention(self, hidden_states, past_key_values,
                                        None if self.indexer is not None else prev_topk_indices)
        return out, None, indices if self.next_skip_topk else None
    return attention_forward(self, hidden_states, attention_mask, past_key_values, prev_topk_indices, **kwargs)


def decodes(self: nn.Module, hidden_states: torch.Tensor, cache) -> bool:
    """Whether a Glm5NextTextAttention call is a decode step the serving forms compute: one token per sequence over a
    cache holding this layer's past, kv_b_proj a plain weight, no attention dropout in training, and (a layer with an
    indexer) every cached key valid: the shipped indexer pools a padded row from its first real key, a serving
    engine's cache holds no padding."""
    if hidden_states.shape[1] != 1 or empty_cache(cache, self.layer_idx) or type(self.kv_b_proj) is not nn.Linear \
            or (self.training and self.attention_dropout):
        return False
    return self.indexer is None or bool(cache.layers[self.indexer.layer_idx].indexer_keys[..., -1].all())


def decode_attention(self: nn.Module, hidden_states: torch.Tensor, cache, given: torch.Tensor | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode step (``decodes``) as workbench::dsa_kpool_indexer_decode and workbench::dsa_decode: the latents and
    (a layer with an indexer) the packed index states [key | gate | valid] written to the cache as shipped, the cached
    latents and [key | gate] rows laid out in pages with one block table (``decode_pages``), the token's keys
    selected by the k-pool indexer (float32, as shipped) or ``given`` (a shared layer's: the previous layer's), then
    the sparse MQA over the selected latents, W_uk absorbed into the query and W_uv applied in torch. Positions are
    the cache's (no padding: nothing to skip). -> (out [B, 1, D], the selection [B, 1, W] int32, -1 padded, as the
    shipped layer hands it on)."""
    b = hidden_states.shape[0]
    q_resid, q, c_kv, k_rope, past = decode_latents(self, hidden_states, cache)
    every = past.new_ones(past.shape[:2], dtype=torch.bool)
    pool, table, lengths = decode_pages(past, every)
    if given is None:
        indexer = self.indexer
        with torch.no_grad():
            q_i = indexer.wq_b(q_resid[:, 0]).view(b, indexer.n_heads, indexer.head_dim)
            k_i = key_norm(self, indexer.wk(hidden_states[:, 0]))
            gate = F.linear(hidden_states[:, 0], indexer.index_kpool_compress_gate)
            packed = cache.update_indexer(torch.cat([k_i, gate, k_i.new_ones(b, 1)], dim=-1)[:, None],
                                          indexer.layer_idx)  # [B, L + 1, 2 DI + 1]
            index_pool, _, _ = decode_pages(packed[:, :-1, :-1].float(), every)
            w = indexer.weights_proj(hidden_states[:, 0].to(indexer.weights_proj.weight.dtype)).float()
            _, _, indices, _ = ops.dsa_kpool_indexer_decode(
                q_i.float().contiguous(), k_i.float().contiguous(), w * indexer.n_heads ** -0.5 * indexer.softmax_scale,
                gate.float().contiguous(), indexer.index_kpool_compress_ape.float(), index_pool, table, lengths,
                indexer.index_topk, bool(indexer.index_kpool_always_select_tail))
    else:
        indices = given[:, 0].to(torch.int32).contiguous()
    q_abs, w_uv = absorbed(self, q)
    o_lat, _ = ops.dsa_decode(q_abs, c_kv[:, 0].contiguous(), k_rope[:, 0].contiguous(), pool, table, lengths, indices,
                              self.scaling)
    return self.o_proj(torch.einsum("bhr,hdr->bhd", o_lat, w_uv).reshape(b, 1, -1)), indices[:, None]


def unrotated(q_rope: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GLM-5-Next's DSA layers use no rotary embedding (NoPE): the rope channels pass as they are."""
    return q_rope, k_rope


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
    norm_in_torch = decodes_in_torch = False
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
        elif isinstance(module, shipped.Glm5NextTextAttention):
            if patcher.wants(path, module, *DSA_BLOCKS):
                norm = ("layernorm",) if module.indexer is not None and patcher.may("layernorm") else ()
                if patcher.may(*DECODE_BLOCKS):
                    patcher.set_forward(path, module, attention_forward_with_decode, *DSA_BLOCKS, *DECODE_BLOCKS,
                                        *norm)
                else:
                    patcher.set_forward(path, module, attention_forward, *DSA_BLOCKS, *norm)
                    decodes_in_torch = True
                norm_in_torch = norm_in_torch or (module.indexer is not None and not norm)
    finish_shared(patcher)
    if any(r.cls == "Glm5NextTextAttention" and r.replaced for r in report.rows):
        report.notes.append(IN_TORCH)
    if norm_in_torch:
        report.notes.append(KEY_NORM_IN_TORCH)
    if decodes_in_torch:
        report.notes.append(DECODES_IN_TORCH)
    report.notes.append("the vision tower (model.visual) runs as shipped; plain projections (nn.Linear) run in "
                        "torch")


def tiny(full, layer_types: list[str], mlp_layer_types: list[str], experts: int, top_k: int) -> dict:
    """The text fields of a tiny GLM-5-Next (``full``: the text config) and a one-block vision tower: widths shrunk,
    the layer and MLP schedules, the indexer schedule (its first layer full), a top 8 of pools of 4 keys scored by
    16 index heads (pooled keys are means of near-alike keys: with 4 heads, pools whose every head's relu clips tie
    at 0, and torch.topk orders ties as it likes; 16 heads make such ties rare), expert
    counts and routing as chosen by the parity, the gate's lower bound, the clamp, the hyper-connection streams and
    every switch kept."""
    groups = full.n_group if experts % full.n_group == 0 and experts // full.n_group >= 2 else 1
    return {
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_hidden_layers": len(layer_types), "layer_types": layer_types, "mlp_layer_types": mlp_layer_types,
        "indexer_types": ["full", *list(full.indexer_types)[1:len(layer_types)]],
        "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 0, "v_head_dim": 16,
        "index_topk": 8, "index_kpool": 4, "index_n_heads": 16, "index_head_dim": 16,
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
