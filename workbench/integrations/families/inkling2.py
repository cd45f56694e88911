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
    Inkling2SlidingAttention,           attention, its Inkling2 variant: per-token sinks (sink_proj) and relative
    Inkling2FullAttention               logits (rel_logits_proj's bank mixed per token, one logit per backward
                                        distance: [B, TQ, H, E], never the dense [B, H, TQ, TK] bias), the sliding
                                        window, GQA and scale; the L2 clips of q, k and the relative states as
                                        l2_clip (the full layers' log scaling folded in) and the values' unweighted
                                        RMSNorm as rmsnorm where promoted; the projections and the sigmoid output
                                        gate in torch
    Inkling2ShortConvolution            kda_short_conv's residual variant, (conv(x) + x) / sqrt(W + 1) without
                                        activation (after each sublayer, and on the sliding layers' keys and
                                        values); its decode steps by kda_short_conv_decode's where promoted
    Inkling2DynamicShortConvolution     kda_short_conv's dynamic variant (the full layers' keys and values): the
                                        static taps plus per-token ones from weight_proj (run as the module, adapter
                                        included), shared by a KV head's channels, (conv(x) + x) / sqrt(2 W + 1); its
                                        decode steps by kda_short_conv_decode's where promoted
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from transformers.models.inkling2 import modeling_inkling2 as shipped

from workbench.blocks.kda_short_conv import INKLING2, INKLING2_DYNAMIC, variant
from workbench.errors import WorkbenchError
from workbench.integrations.attention import attend, use_workbench_attention
from workbench.integrations.families._common import (
    EXPERT_BLOCKS,
    SharedModules,
    finish_shared,
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


@functools.cache
def unit(width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """ones [width]: the unit weight of Inkling2's unweighted RMS norms, made once per width, dtype and device (a
    constant a kernel is handed, not a tensor filled at every call)."""
    return torch.ones(width, dtype=dtype, device=device)


def attention_residual_forward(self: nn.Module, block_states: torch.Tensor,
                               partial_block_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Inkling2BlockAttentionResidual.forward as workbench::attnres with normalised values: the sources are the
    blocks [B, T, S, D] and the partial block [B, T, D], keys and values their unweighted RMS norm, scale D^-0.5;
    one float32 output [B, T, D] per query."""
    sources = torch.cat([block_states, partial_block_states.unsqueeze(-2)], dim=-2).float()
    b, t, s, d = sources.shape
    sources = sources.permute(2, 0, 1, 3).reshape(s, b * t, d)
    ones = unit(d, sources.dtype, sources.device)
    return tuple(ops.attnres(sources, query.float(), ones, None, self.norm.eps, d ** -0.5, True)[0].view(b, t, d)
                 for query in self.query.view(-1, d))


def short_convolution_forward(self: nn.Module, hidden_states: torch.Tensor, past_key_values=None,
                              conv_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """Inkling2ShortConvolution.forward as workbench::kda_short_conv's residual variant: (conv(x) + x) / sqrt(W + 1),
    no activation, [B, T, D] in x's dtype (float32 math, as the module's); see convolve."""
    return convolve(self, hidden_states, None, past_key_values, conv_mask, kwargs)


def dynamic_convolution_forward(self: nn.Module, hidden_states: torch.Tensor, dynamic_input: torch.Tensor,
                                past_key_values=None, conv_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """Inkling2DynamicShortConvolution.forward as workbench::kda_short_conv's dynamic variant: taps static_weight
    plus weight_proj(dynamic_input) per token (shared by a KV head's channels, reordered oldest input first), (conv(x)
    + x) / sqrt(2 W + 1), no activation, [B, T, D] in x's dtype (float32 math, as the module's); see convolve."""
    return convolve(self, hidden_states, dynamic_input, past_key_values, conv_mask, kwargs)


def convolve(self: nn.Module, hidden_states: torch.Tensor, dynamic_input: torch.Tensor | None, past_key_values,
             conv_mask: torch.Tensor | None, kwargs: dict) -> torch.Tensor:
    """Either short convolution (the dynamic one where ``dynamic_input`` [B, T, D'] is given) over hidden_states
    [B, T, D]. Over a cache holding nothing of this convolution: workbench::kda_short_conv, writing the float32 inputs'
    tail into the cache as the shipped forward does. A decode step (one token of each sequence over a cache that holds
    this convolution's past) where the patch named kda_short_conv_decode: that op, the cache's float32 conv state
    [B, D, W] its cache, sequence b in slot b, shifted in place as the shipped forward shifts it. A padded batch,
    packed sequences, an adapted conv1d, a recording cache or any other call over a cache with this convolution's past
    run the shipped forward."""
    state = conv_state(self, past_key_values)
    decode = state is not None and hidden_states.shape[1] == 1 and "kda_short_conv_decode" in self.workbench_blocks
    if runs_shipped(self, past_key_values, conv_mask, kwargs) or (state is not None and not decode):
        inputs = (hidden_states,) if dynamic_input is None else (hidden_states, dynamic_input)
        return self.original_forward(*inputs, past_key_values=past_key_values, conv_mask=conv_mask, **kwargs)
    if dynamic_input is None:
        weight, taps, scale = self.conv1d.weight.squeeze(1), None, residual_scale(self)
    else:
        (weight, taps), scale = dynamic_taps(self, dynamic_input), dynamic_scale(self)
    if decode:
        slots = torch.arange(hidden_states.shape[0], device=hidden_states.device)
        y, _ = ops.kda_short_conv_decode(hidden_states[:, 0].float(), weight, state, slots, False, scale,
                                         None if taps is None else taps[:, 0])
        return y[:, None].to(hidden_states.dtype)
    if past_key_values is not None:
        past_key_values.update_conv_state(hidden_states.float().transpose(1, 2), self.layer_idx,
                                          state_idx=self.conv_idx, conv_kernel_size=self.conv_kernel_size)
    return ops.kda_short_conv(hidden_states, weight, False, scale, taps)


def attention_forward(self: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      conv_mask: torch.Tensor | None = None, past_key_values=None,
                      key_hidden_states: torch.Tensor | None = None, value_hidden_states: torch.Tensor | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """Inkling2SlidingAttention.forward and Inkling2FullAttention.forward (which passes key_hidden_states and
    value_hidden_states) with the attention itself as workbench::attention: per-token sinks [B, TQ, H] and the
    relative logits relative_states @ proj [B, TQ, H, E] handed to the block as they are, where the shipped forward
    gathers them into a dense bias; the L2 clips (the full layers' log scaling with them) as workbench::l2_clip and
    the values' unweighted RMSNorm as workbench::rmsnorm where the patch named them (``workbench_blocks``). A padded
    batch runs row by row (workbench.integrations.attention.attend: the model's masks are the workbench
    implementation's 2D ones)."""
    if self.training and self.attention_dropout:
        raise WorkbenchError(f"Inkling2 attention: dropout {self.attention_dropout} while training is not supported")
    full = key_hidden_states is not None
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    conv = {"past_key_values": past_key_values, "conv_mask": conv_mask}
    query = self.q_proj(hidden_states)
    if full:
        key = self.k_sconv(self.k_proj(key_hidden_states), key_hidden_states, **conv)
        value = self.v_sconv(self.v_proj(value_hidden_states), value_hidden_states, **conv)
    else:
        key, value = self.k_sconv(self.k_proj(hidden_states), **conv), self.v_sconv(self.v_proj(hidden_states), **conv)
    relative = self.r_proj(hidden_states).view(*input_shape, self.num_heads, -1)
    # the full layers' log scaling of the queries and relative states [B, T], in float32 as shipped
    tau = (1.0 + self.config.log_scaling_alpha * torch.log(((kwargs["position_ids"] + 1).float()
                                                             / self.config.log_scaling_n_floor).clamp(min=1.0))
           ).expand(input_shape) if full else None
    if "l2_clip" in self.workbench_blocks:
        query = ops.l2_clip(query.view(hidden_shape), self.q_l2_clip.scale, tau, self.q_l2_clip.threshold)
        relative = ops.l2_clip(relative, self.rel_l2_clip.scale, tau, self.rel_l2_clip.threshold)
        key = ops.l2_clip(key.view(hidden_shape), None, None, self.k_l2_clip.threshold)
    else:
        query, relative = self.q_l2_clip(query.view(hidden_shape)), self.rel_l2_clip(relative)
        if full:
            query = (query.float() * tau[..., None, None]).to(query.dtype)
            relative = (relative.float() * tau[..., None, None]).to(relative.dtype)
        key = self.k_l2_clip(key.view(hidden_shape))
    values = value.view(hidden_shape).float()  # the unweighted RMSNorm in float32, as shipped
    value = (ops.rmsnorm(values, unit(self.head_dim, values.dtype, values.device), self.v_norm.eps)
             if "rmsnorm" in self.workbench_blocks else self.v_norm(values)).to(value.dtype)
    if past_key_values is not None:
        key, value = (x.transpose(1, 2) for x in past_key_values.update(key.transpose(1, 2), value.transpose(1, 2),
                                                                         self.layer_idx))
    out = attend(query, key, value, self.sink_proj(hidden_states), self.scaling, self.sliding_window or 0, 0.0,
                 relative @ self.rel_logits_proj.proj, attention_mask).reshape(*input_shape, -1)
    out = (out.float() * torch.sigmoid(self.gate_proj(hidden_states).float())).to(out.dtype)
    return self.o_proj(out), None


def residual_scale(self: nn.Module) -> float:
    """Inkling2's output scale of the residual short convolution, 1 / sqrt(W + 1), as kda_short_conv's variant has
    it."""
    return variant({"W": self.conv_kernel_size, **INKLING2})["residual_scale"]


def dynamic_taps(self: nn.Module, dynamic_input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An Inkling2DynamicShortConvolution's taps in kda_short_conv's layout, oldest input first: (weight [D, W]
    from static_weight [W, D], taps [..., G, W] from weight_proj(dynamic_input) [..., G * W]); the module indexes
    both by backward distance."""
    taps = self.weight_proj(dynamic_input)
    return self.static_weight.flip(0).T, taps.view(*taps.shape[:-1], self.num_heads, -1).flip(-1)


def dynamic_scale(self: nn.Module) -> float:
    """Inkling2's output scale of the dynamic short convolution, 1 / sqrt(2 W + 1), as kda_short_conv's variant has
    it."""
    return variant({"W": self.conv_kernel_size, **INKLING2_DYNAMIC})["residual_scale"]


def conv_state(self: nn.Module, past_key_values) -> torch.Tensor | None:
    """The cache's conv state of this convolution [B, D, W] (float32), None where it holds none."""
    return None if past_key_values is None else past_key_values.get_conv_state(self.layer_idx,
                                                                               state_idx=self.conv_idx)


def runs_shipped(self: nn.Module, past_key_values, conv_mask: torch.Tensor | None, kwargs: dict) -> bool:
    """Whether a short convolution call has no form in the ops: a padded batch, packed sequences, an adapted conv1d
    or a cache recording its past."""
    return (conv_mask is not None and not bool(conv_mask.all())) or kwargs.get("seq_idx") is not None \
        or (hasattr(self, "conv1d") and type(self.conv1d) is not nn.Conv1d) \
        or (past_key_values is not None and past_key_values.is_recording_past(self.layer_idx))


SHARED = SharedModules(rmsnorm=shipped.Inkling2RMSNorm, rmsnorm_forward=rmsnorm_forward, mlp=None,
                       router=shipped.Inkling2TopKRouter, router_forward=router_forward, experts=None)

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
        elif isinstance(module, shipped.Inkling2ShortConvolution | shipped.Inkling2DynamicShortConvolution):
            if patcher.wants(path, module, "kda_short_conv"):
                forward = dynamic_convolution_forward if isinstance(
                    module, shipped.Inkling2DynamicShortConvolution) else short_convolution_forward
                patcher.set_forward(path, module, forward, "kda_short_conv",
                                    *[block for block in ("kda_short_conv_decode",) if patcher.may(block)])
    finish_shared(patcher)
    attention = [(path, m) for path, m in patcher.model.named_modules()
                 if isinstance(m, shipped.Inkling2SlidingAttention | shipped.Inkling2FullAttention)]
    if attention and all(patcher.wants(path, module, "attention") for path, module in attention):
        use_workbench_attention(patcher.model)  # the model's masks become 2D (padding) or none
        around = [block for block in ("l2_clip", "rmsnorm") if patcher.may(block)]
        for path, module in attention:
            patcher.set_forward(path, module, attention_forward, "attention", *around)
        left = ["the projections", "the output gate"] + [part for block, part in (
            ("l2_clip", "the L2 clips and the log scaling"), ("rmsnorm", "the values' RMSNorm")) if block not in around]
        report.notes.append(f"around each attention, {', '.join(left)} stay in torch")
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
