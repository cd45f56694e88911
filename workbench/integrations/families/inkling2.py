"""Inkling2 (transformers ``inkling2``, its text model ``inkling2_text``): block attention residuals in front of
every attention and MoE, a sigmoid MoE whose experts use the softcapped SwiGLU (SiTU), sliding-window and full
attention with relative-position logits, sinks and L2-clipped queries and keys, residual short convolutions after
each sublayer, RMSNorm.

    module                              computed by
    Inkling2RMSNorm                     rmsnorm (the embedding's norm too)
    Inkling2BlockAttentionResidual      attnres, normalised values (one call per query: the full layers' attention
                                        input mixes three, one each for q, k and v)
    Inkling2TopKRouter (sigmoid)        moe_router (sigmoid + renormalise, no groups, the config's route_scale)
    Inkling2Experts                     moe_permute, moe_grouped_gemm with the SiTU activation (the experts'
                                        mlp_gate_softcap and mlp_up_softcap), moe_combine (the experts implementation)
    Inkling2SlidingAttention,           left alone: per-token sinks (sink_proj) and relative-position logits (a dense
    Inkling2FullAttention               bias per query and key) are another variant than the attention block's
                                        (learnt per-head sinks, no bias); the sliding window, GQA and scale match
    Inkling2ShortConvolution            left alone: (conv(x) + x) / sqrt(W + 1), no activation (kda_short_conv
                                        computes silu(conv(x)))
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.inkling2 import modeling_inkling2 as shipped

from workbench.integrations.families._common import (
    EXPERT_BLOCKS,
    SharedModules,
    finish_shared,
    patch_attention,
    patch_shared,
    requested_logits,
    rmsnorm_forward,
)
from workbench.integrations.ops import ops
from workbench.integrations.transformers import Patcher

MODEL_CLASS = "Inkling2ForCausalLM"
ROUTER = shipped.Inkling2TopKRouter  # its output (router_logits, top_k_weights, top_k_index): the router choices
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
"""The projections a parity run's LoRA adapts (workbench parity --lora): the attention's (the experts are 3D
parameters, not Linear layers)."""


def router_forward(self: nn.Module, hidden_states: torch.Tensor):
    """Inkling2TopKRouter.forward (sigmoid scores, the correction bias in the selection only, weights renormalised
    and scaled by route_scale) as workbench::moe_router: (router_logits, top_k_weights [N, k] float32,
    top_k_index [N, k]); the logits computed in torch only where the model is asked for them."""
    x = hidden_states.reshape(-1, self.hidden_dim)
    weights, ids, _ = ops.moe_router(x, self.weight, self.e_score_correction_bias.float(), self.top_k, "sigmoid", None,
                                 True, float(self.routed_scaling_factor), 1, 1)
    return requested_logits(self, x), weights, ids


def attention_residual_forward(self: nn.Module, block_states: torch.Tensor,
                               partial_block_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Inkling2BlockAttentionResidual.forward as workbench::attnres with normalised values: the sources are the
    blocks [B, T, S, D] and the partial block [B, T, D], keys and values their unweighted RMS norm, scale D^-0.5;
    one float32 output [B, T, D] per query."""
    sources = torch.cat([block_states, partial_block_states.unsqueeze(-2)], dim=-2).float()
    b, t, s, d = sources.shape
    sources = sources.permute(2, 0, 1, 3).reshape(s, b * t, d)
    unweighted = torch.ones(d, dtype=sources.dtype, device=sources.device)
    return tuple(ops.attnres(sources, query.float(), unweighted, None, self.norm.eps, d ** -0.5, True)[0].view(b, t, d)
                 for query in self.query.view(-1, d))


SHARED = SharedModules(rmsnorm=shipped.Inkling2RMSNorm, rmsnorm_forward=rmsnorm_forward, mlp=None,
                       router=shipped.Inkling2TopKRouter, router_forward=router_forward, experts=None)

LEFT_ALONE = {
    shipped.Inkling2ShortConvolution: "residual short convolution (conv(x) + x) / sqrt(W + 1) without activation: "
                                      "kda_short_conv computes silu(conv(x))",
}


def apply(patcher: Patcher) -> None:
    """Swap the catalog's ops into every Inkling2 module they compute; report each module."""
    report = patcher.report
    for path, module in patcher.model.named_modules():
        if isinstance(module, shipped.Inkling2TopKRouter) and not isinstance(module.score_fn, nn.Sigmoid):
            report.leave(path, module, f"scores by {type(module.score_fn).__name__}: moe_router computes Inkling2's "
                                       "routing with sigmoid scores")
        elif patch_shared(patcher, path, module, SHARED):
            continue
        elif isinstance(module, shipped.Inkling2Experts):
            if patcher.wants(path, module, *EXPERT_BLOCKS):
                caps = module.act_fn
                module.workbench_activation = ("situ", caps.gate_softcap.softcap, caps.up_softcap.softcap)
                report.replace(path, module, *EXPERT_BLOCKS)
        elif isinstance(module, shipped.Inkling2BlockAttentionResidual):
            if patcher.wants(path, module, "attnres"):
                patcher.set_forward(path, module, attention_residual_forward, "attnres")
        elif type(module) in LEFT_ALONE:
            report.leave(path, module, LEFT_ALONE[type(module)])
    finish_shared(patcher)
    patch_attention(patcher, (shipped.Inkling2SlidingAttention, shipped.Inkling2FullAttention),
                    "the projections, L2-clipped q and k and the output gate")
    report.notes.append("plain projections (nn.Linear) run in torch")


def tiny(full, layer_types: list[str], mlp_layer_types: list[str], experts: int, top_k: int) -> dict:
    """The fields of a tiny Inkling2TextConfig of ``full``'s architecture: widths shrunk, the layer schedule, a
    residual block every two layers (so a 4-layer parity crosses block boundaries), a sliding window of 8 (a 32-token
    batch slides), expert counts and routing as chosen by the parity, the soft caps, route scale and switches
    kept."""
    return {
        "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": len(layer_types), "layer_types": layer_types,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2, "swa_head_dim": 16,
        "sliding_window_size": 8, "rel_extent": 16, "d_rel": 4,
        "n_layers_per_attn_res_block": min(full.n_layers_per_attn_res_block, 2),
        "moe_intermediate_size": 32, "n_routed_experts": experts, "num_experts_per_tok": top_k,
        "route_scale": full.route_scale, "scoring_func": full.scoring_func,
        "mlp_gate_softcap": full.mlp_gate_softcap, "mlp_up_softcap": full.mlp_up_softcap,
        "conv_kernel_size": full.conv_kernel_size, "final_logit_softcapping": full.final_logit_softcapping,
        "qk_l2_clip_threshold": full.qk_l2_clip_threshold, "rel_l2_clip_threshold": full.rel_l2_clip_threshold,
        "log_scaling_alpha": full.log_scaling_alpha, "log_scaling_n_floor": 16,
        "hidden_act": full.hidden_act, "rms_norm_eps": full.rms_norm_eps, "pad_token_id": None,
        "bos_token_id": None, "eos_token_id": None,
    }
