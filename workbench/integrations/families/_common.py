"""Module forwards shared by the families: transformers' RMSNorm, gated output norm, gated MLP, sigmoid top-k router,
experts, MLA attention and KDA forget gate computed by the catalog's ops. Each ``*_forward(self, ...)`` replaces the
forward of one module instance (``Patcher.set_forward``) and falls back to the shipped forward
(``self.original_forward``) where the op has no form for the call (a cache, packed sequences, a padding mask): those
calls run as shipped."""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workbench.blocks.rmsnorm_gated import ACTIVATIONS as GATE_ACTIVATIONS
from workbench.blocks.situ import BETA, LINEAR_BETA
from workbench.integrations.ops import ops

EXPERTS_IMPLEMENTATION = "workbench"
"""The name the experts forward is registered under in transformers' ALL_EXPERTS_FUNCTIONS."""
EXPERT_BLOCKS = ("moe_permute", "moe_grouped_gemm", "moe_combine")


def qualified(module: nn.Module) -> str:
    """``peft.Linear``: a module's class with its package."""
    return f"{type(module).__module__.split('.')[0]}.{type(module).__name__}"


def rmsnorm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """transformers' RMSNorm (weight, variance_epsilon) as workbench::rmsnorm. The shipped module casts the
    normalised x to its dtype before the weight (one rounding more than the block in bfloat16; equal in float32)."""
    return ops.rmsnorm(hidden_states, self.weight, self.variance_epsilon)


def gated_rmsnorm_forward(self: nn.Module, hidden_states: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """transformers' gated output norm of a linear-attention layer (weight, variance_epsilon, activation: Kimi
    Linear's and GLM-5-Next's sigmoid gate, Qwen3-Next's silu gate) as workbench::rmsnorm_gated over rows of the
    last dim: hidden_states, gate [..., N] -> [..., N] in hidden_states' dtype. Qwen3-Next's module casts the normed
    x to its dtype before the weight and the product again before the gate (two roundings more than the block in
    bfloat16; equal in float32)."""
    n = hidden_states.shape[-1]
    y = ops.rmsnorm_gated(hidden_states.reshape(-1, n), self.weight, gate.reshape(-1, n), self.variance_epsilon,
                      self.activation)
    return y.view(hidden_states.shape)


def patch_gated_rmsnorm(patcher, path: str, module: nn.Module) -> None:
    """A gated output norm by rmsnorm_gated (``gated_rmsnorm_forward``), or left alone with the reason: a gate
    activation the block does not compute."""
    if module.activation not in GATE_ACTIVATIONS:
        patcher.report.leave(path, module, f"gated RMSNorm with activation '{module.activation}': rmsnorm_gated "
                                           f"gates by {' or '.join(GATE_ACTIVATIONS)}")
    elif patcher.wants(path, module, "rmsnorm_gated"):
        patcher.set_forward(path, module, gated_rmsnorm_forward, "rmsnorm_gated")


def gated_mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """down_proj(silu(gate_proj(x)) * up_proj(x)) with the activation as workbench::swiglu."""
    return self.down_proj(ops.swiglu(self.gate_proj(x), self.up_proj(x)))


def clamped_mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """down_proj(silu(min(gate_proj(x), L)) * clamp(up_proj(x), -L, L)) with L = self.swiglu_limit, as
    workbench::swiglu's clamped variant (GLM-5-Next's MLPs and shared experts)."""
    return self.down_proj(ops.swiglu(self.gate_proj(x), self.up_proj(x), float(self.swiglu_limit)))


def sigmoid_router_forward(self: nn.Module, hidden_states: torch.Tensor):
    """A sigmoid top-k router with a selection bias, group-limited where n_group > 1 (DeepSeek-V3's recipe, Kimi) as
    workbench::moe_router: returns (router_logits, top_k_weights [N, k] float32, top_k_index [N, k]). The logits are
    computed (in torch) only when the model is asked for them (config.output_router_logits), else None."""
    x = hidden_states.reshape(-1, self.hidden_dim)
    weights, ids, _ = ops.moe_router(x, self.weight, self.e_score_correction_bias.float(), self.top_k, "sigmoid", None,
                                 bool(self.norm_topk_prob), float(self.routed_scaling_factor), int(self.num_group),
                                 int(self.topk_group))
    return requested_logits(self, x), weights, ids


def requested_logits(router: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """A router's logits x W^T [N, E] float32, computed in torch only when the model is asked for them
    (config.output_router_logits), else None: moe_router never builds them."""
    wanted = getattr(getattr(router, "config", None), "output_router_logits", False)
    return F.linear(x.float(), router.weight.float()) if wanted else None


def forget_gate_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """KDA's forget gate from its low-rank projection, f = f_b_proj(f_a_proj(x)) [B, T, H, K], as workbench::kda_gate:
    the softplus form (Kimi Linear) or, where the module has a lower bound (GLM-5-Next's safe_gate_lower_bound), the
    bounded one; g [B, T, H, K] float32."""
    heads, dim = self.num_heads, self.head_dim
    f = self.f_b_proj(self.f_a_proj(hidden_states)).view(*hidden_states.shape[:2], heads, dim)
    return ops.kda_gate(f, self.A_log.reshape(heads), self.dt_bias.view(heads, dim),
                    getattr(self, "safe_gate_lower_bound", None))


SWIGLU = ("swiglu", BETA, LINEAR_BETA)
"""moe_grouped_gemm's activation of the experts most families use (silu(gate) * up; the caps unused)."""


def experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' experts interface (``ALL_EXPERTS_FUNCTIONS``): hidden_states [N, D], top_k_index [N, k],
    top_k_weights [N, k] -> [N, D], through workbench::moe_permute, moe_grouped_gemm over the concatenated
    gate_up_proj [E, 2F, D] (gate first) and down_proj [E, D, F] and moe_combine. The activation is SwiGLU, or what
    the family set as the module's ``workbench_activation`` (("situ", beta, linear_beta): Inkling2's softcapped
    SwiGLU; ("swiglu", beta, linear_beta, limit): GLM-5-Next's clamped SwiGLU, swiglu_limit)."""
    return grouped_experts(self, hidden_states, top_k_index, top_k_weights, getattr(self, "workbench_activation",
                                                                                      SWIGLU))


def grouped_experts(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor, activation: tuple) -> torch.Tensor:
    """experts_forward with ``activation``: moe_grouped_gemm's (activation, beta, linear_beta[, limit])."""
    f = self.intermediate_dim
    x_perm, _, row_of_slot, _, offsets = ops.moe_permute(hidden_states, top_k_index, self.num_experts)
    y = ops.moe_grouped_gemm(x_perm, offsets, self.gate_up_proj[:, :f], self.gate_up_proj[:, f:], self.down_proj,
                         *activation)
    return ops.moe_combine(y, top_k_weights.float(), row_of_slot)


def short_conv_supported(module: nn.Module) -> str:
    """Why kda_short_conv cannot compute a layer's short convolution (``conv1d``, ``activation``) ("" when it
    can)."""
    if type(module.conv1d) is not nn.Conv1d:
        return f"conv1d is a {qualified(module.conv1d)} (an adapter): kda_short_conv takes the taps as a plain weight"
    if module.activation != "silu" or module.conv1d.bias is not None:
        return (f"short convolution with activation '{module.activation}' or a bias: kda_short_conv computes "
                "silu(conv(x)) without bias")
    return ""


def experts_supported(module: nn.Module, hidden_act: str) -> str:
    """Why ``experts_forward`` cannot compute ``module`` ("" when it can)."""
    if hidden_act != "silu":
        return f"experts with hidden_act '{hidden_act}': moe_grouped_gemm computes SwiGLU and SiTU only"
    layout = {"has_gate": True, "has_bias": False, "is_transposed": False, "is_concatenated": True,
              "has_post_expert_norm": False}
    other = [k for k, want in layout.items() if getattr(module, k, want) != want]
    return f"experts layout ({', '.join(other)}) moe_grouped_gemm does not take" if other else ""


def causal_only(mask: torch.Tensor | None, length: int) -> bool:
    """Whether an attention mask (None, or [B, 1, T, T] boolean or additive) allows exactly the causal pairs."""
    if mask is None:
        return True
    if mask.dim() != 4 or mask.shape[-1] != length or mask.shape[-2] != length:
        return False
    allowed = mask if mask.dtype == torch.bool else mask == 0
    return bool((allowed == torch.ones(length, length, dtype=torch.bool, device=mask.device).tril()).all())


def empty_cache(cache, layer_idx: int) -> bool:
    """Whether ``cache`` (a transformers Cache, or None) holds nothing yet for layer ``layer_idx``: the call is a
    prefill from the first token (generate's first step, and every forward of a model that builds a cache while it
    trains: transformers makes a DynamicCache whenever use_cache is on), which the ops compute while writing the
    cache as the shipped forward would. A layer that holds state (decode, a continued prefill) is not empty."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    if cache is None or layer_idx >= len(cache.layers):
        return True
    layer = cache.layers[layer_idx]
    if isinstance(layer, LinearAttentionCacheLayerMixin) and any(layer.has_previous_state.values()):
        return False
    return not hasattr(layer, "get_seq_length") or layer.get_seq_length() == 0


def mla_runs_shipped(self: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None,
                     past_key_values, plain_kv_b: bool = True) -> bool:
    """Whether an MLA call has no form in workbench::mla (or DSA's ops): a cache that already holds this layer's
    past (decode), a mask other than the causal one, attention dropout in training, or (``plain_kv_b``: where the op
    takes W_uk and W_uv as weights) an adapted kv_b_proj (a LoRA layer: its weight alone is not what it computes)."""
    return not empty_cache(past_key_values, self.layer_idx) or not causal_only(attention_mask, hidden_states.shape[1]) \
        or bool(self.training and self.attention_dropout) or (plain_kv_b and type(self.kv_b_proj) is not nn.Linear)


def mla_latents(self: nn.Module, hidden_states: torch.Tensor, rotate=None, q_resid: torch.Tensor | None = None):
    """An MLA module's projections (DeepSeek-V2 naming: q_proj or q_a_proj/q_a_layernorm/q_b_proj,
    kv_a_proj_with_mqa, kv_a_layernorm): q [B, T, H, DN + DR], c_kv [B, T, R] (normalised), k_rope [B, T, DR].
    ``rotate(q_rope [B, H, T, DR], k_rope [B, 1, T, DR])`` -> both rotated: the family's rotary embedding, in torch
    (None: no rotary embedding, Kimi's mla_use_nope); where it has ``rope_last`` (``rotation``), q and k_rope are
    rotated whole by it instead. ``q_resid``: q_a_layernorm(q_a_proj(x)) where the caller has
    it already (DSA's indexer reads it too)."""
    b, t = hidden_states.shape[:2]
    if self.q_lora_rank is None:
        q = self.q_proj(hidden_states)
    else:
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)) if q_resid is None else q_resid)
    q = q.view(b, t, self.num_heads, self.qk_head_dim)
    c_kv, k_rope = self.kv_a_proj_with_mqa(hidden_states).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
    c_kv = self.kv_a_layernorm(c_kv)
    if getattr(rotate, "rope_last", None) is not None:  # no split of q, no concatenation
        q = rotate.rope_last(q)
        k_rope = rotate.rope_last(k_rope.view(b, t, 1, self.qk_rope_head_dim)).view(b, t, self.qk_rope_head_dim)
    elif rotate is not None:
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_rope, k_rope = rotate(q_rope.transpose(1, 2), k_rope.view(b, 1, t, self.qk_rope_head_dim))
        q, k_rope = torch.cat([q_nope, q_rope.transpose(1, 2)], dim=-1), k_rope.view(b, t, self.qk_rope_head_dim)
    return q, c_kv, k_rope


def mla_attention(self: nn.Module, hidden_states: torch.Tensor, rotate=None, cache=None) -> torch.Tensor:
    """MLA from its latents (``mla_latents``) with the attention as workbench::mla: W_uk and W_uv are views of
    kv_b_proj's weight [H * (DN + DV), R]. ``cache`` (empty for this layer): the latents c_kv [B, 1, T, R] and
    k_rope [B, 1, T, DR] written to it, as the shipped forward does. -> [B, T, D]."""
    b, t = hidden_states.shape[:2]
    q, c_kv, k_rope = mla_latents(self, hidden_states, rotate)
    if cache is not None:
        cache.update(c_kv.view(b, 1, t, self.kv_lora_rank), k_rope.view(b, 1, t, self.qk_rope_head_dim), self.layer_idx)
    w_kv = self.kv_b_proj.weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
    out = ops.mla(q, c_kv.contiguous(), k_rope.contiguous(), w_kv[:, :self.qk_nope_head_dim],
              w_kv[:, self.qk_nope_head_dim:], None, self.scaling)
    return self.o_proj(out.reshape(b, t, -1))


DECODE_PAGE = 16
"""Rows per page of the paged latent cache an MLA decode step is given (``mla_decode_attention``)."""


def mla_decodes(self: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, cache) -> bool:
    """Whether an MLA call is a decode step workbench::mla_decode computes: one token per sequence over a cache that
    holds this layer's past, a mask (if any) over the cached keys and the token, kv_b_proj a plain weight, no
    attention dropout in training."""
    if hidden_states.shape[1] != 1 or empty_cache(cache, self.layer_idx) or type(self.kv_b_proj) is not nn.Linear:
        return False
    past = cache.layers[self.layer_idx].get_seq_length()
    fits = attention_mask is None or (attention_mask.dim() == 4 and attention_mask.shape[-1] == past + 1)
    return fits and not (self.training and self.attention_dropout)


def decode_visible(attention_mask: torch.Tensor | None, past: int, batch: int, device) -> torch.Tensor:
    """[B, past] bool: the cached positions a decode step's mask lets its token see (all without a mask)."""
    if attention_mask is None:
        return torch.ones(batch, past, dtype=torch.bool, device=device)
    allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    return allowed[:, 0, -1, :-1]


def decode_pages(past: torch.Tensor, visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A decode step's cached rows as a serving engine keeps them: each sequence's rows of ``past`` [B, L, W] at the
    ``visible`` positions [B, L] (``decode_visible``: left padding skipped) laid out in pages of DECODE_PAGE rows with
    a block table (copied here from transformers' contiguous cache, which an engine's paged cache makes unnecessary).
    -> (pages [B * P, DECODE_PAGE, W], block_table [B, P] int32, lengths [B] int32); every table leaves room for
    this step's row."""
    b, width = past.shape[0], past.shape[-1]
    lengths = visible.sum(dim=1)
    pages = -(-(int(lengths.max()) + 1) // DECODE_PAGE)
    pool = past.new_zeros(b * pages, DECODE_PAGE, width)
    rows = pool.view(b, pages * DECODE_PAGE, width)
    for n in range(b):
        rows[n, :int(lengths[n])] = past[n, visible[n]]
    table = torch.arange(b * pages, dtype=torch.int32, device=past.device).view(b, pages)
    return pool, table, lengths.to(torch.int32)


def absorbed(self: nn.Module, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode step's query with W_uk absorbed, [B, H, R + DR] (from q [B, 1, H, DN + DR]), and W_uv [H, DV, R]:
    views of kv_b_proj's weight [H * (DN + DV), R]."""
    w_kv = self.kv_b_proj.weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
    q_abs = torch.cat([torch.einsum("bhd,hdr->bhr", q[:, 0, :, :self.qk_nope_head_dim],
                                    w_kv[:, :self.qk_nope_head_dim]), q[:, 0, :, self.qk_nope_head_dim:]], dim=-1)
    return q_abs.contiguous(), w_kv[:, self.qk_nope_head_dim:]


def mla_decode_attention(self: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, cache,
                         rotate=None) -> torch.Tensor:
    """A decode step (``mla_decodes``) as workbench::mla_decode: the cache updated as shipped (its latents c_kv and
    k_rope); the cached latents laid out in pages (``decode_pages``); W_uk absorbed into the query and W_uv applied to
    the latent output in torch. -> [B, 1, D]."""
    b = hidden_states.shape[0]
    q, c_kv, k_rope = mla_latents(self, hidden_states, rotate)
    keys, values = cache.update(c_kv.view(b, 1, 1, self.kv_lora_rank), k_rope.view(b, 1, 1, self.qk_rope_head_dim),
                                self.layer_idx)
    past = torch.cat([keys[:, 0, :-1], values[:, 0, :-1]], dim=-1)  # [B, L, R + DR]
    pool, table, lengths = decode_pages(past, decode_visible(attention_mask, past.shape[1], b, past.device))
    q_abs, w_uv = absorbed(self, q)
    o_lat, _ = ops.mla_decode(q_abs, c_kv[:, 0].contiguous(), k_rope[:, 0].contiguous(), pool, table, lengths,
                          self.scaling)
    return self.o_proj(torch.einsum("bhr,hdr->bhd", o_lat, w_uv).reshape(b, 1, -1))


def mla_forward(self: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None,
                past_key_values=None, **kwargs):
    """Kimi's MLA (no rotary embedding, mla_use_nope) as ``mla_attention``; what ``mla_runs_shipped`` names runs the
    shipped forward."""
    if mla_runs_shipped(self, hidden_states, attention_mask, past_key_values):
        return self.original_forward(hidden_states, attention_mask, past_key_values=past_key_values, **kwargs)
    return mla_attention(self, hidden_states, None, past_key_values), None


def mla_forward_with_decode(self: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None,
                            past_key_values=None, **kwargs):
    """``mla_forward``, and its decode steps (``mla_decodes``) as ``mla_decode_attention``."""
    if mla_decodes(self, hidden_states, attention_mask, past_key_values):
        return mla_decode_attention(self, hidden_states, attention_mask, past_key_values), None
    return mla_forward(self, hidden_states, attention_mask, past_key_values, **kwargs)


def lora_supported(module: nn.Module) -> str:
    """Why ``lora_forward`` cannot compute a PEFT LoRA Linear ("" when it can)."""
    adapters = list(module.active_adapters)
    if len(adapters) != 1:
        return f"{len(adapters)} active adapters: lora_linear takes one"
    name = adapters[0]
    dropout = module.lora_dropout[name]
    if isinstance(dropout, nn.Dropout) and dropout.p > 0:
        return (f"LoRA dropout {dropout.p}: the adapter sees dropout(x) and the base layer plain x, which lora_linear "
                "(one x for both) cannot express")
    if module.use_dora.get(name):
        return "DoRA: lora_linear has no magnitude vector"
    base = module.get_base_layer()
    if not isinstance(base, nn.Linear) or base.bias is not None or getattr(module, "fan_in_fan_out", False):
        return "a base layer other than a bias-free nn.Linear: lora_linear computes x W^T + x A^T B^T * scaling"
    return ""


def lora_forward(self: nn.Module, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """A PEFT LoRA Linear (one adapter, no dropout, unmerged) as workbench::lora_linear: x W^T + x A^T B^T *
    scaling (alpha / r, or alpha / sqrt(r) with rsLoRA: PEFT's own scaling); disabled or merged adapters, or another
    active adapter than the one patched, run the shipped forward."""
    name = self.workbench_adapter
    if self.disable_adapters or self.merged or list(self.active_adapters) != [name]:
        return self.original_forward(x, *args, **kwargs)
    base = self.get_base_layer()
    y = ops.lora_linear(x.reshape(-1, x.shape[-1]), base.weight, self.lora_A[name].weight, self.lora_B[name].weight,
                    float(self.scaling[name]))
    return y.reshape(*x.shape[:-1], y.shape[-1])


@dataclass(frozen=True)
class SharedModules:
    """A family's classes of the modules every family patches alike, with the forwards that compute its norm and
    its router (the variant that family uses); None for a class the family does not have (Inkling2 has no dense
    MLP) or patches its own way (Inkling2's SiTU experts)."""

    rmsnorm: type
    rmsnorm_forward: Callable
    mlp: type | None
    router: type
    router_forward: Callable
    experts: type | None


def patch_shared(patcher, path: str, module: nn.Module, shared: SharedModules) -> bool:
    """Patch (or report left alone) ``module`` if it is one of the modules every family shares: the RMSNorm, the
    gated MLP (silu), the router, the experts (through the experts implementation: ``finish_shared``), the
    embedding and the logits head. False for any other module."""
    config, report = patcher.model.config, patcher.report
    if isinstance(module, shared.rmsnorm):
        if patcher.wants(path, module, "rmsnorm"):
            patcher.set_forward(path, module, shared.rmsnorm_forward, "rmsnorm")
    elif shared.mlp is not None and isinstance(module, shared.mlp):
        if config.hidden_act != "silu":
            report.leave(path, module, f"hidden_act '{config.hidden_act}': swiglu computes silu(a) * b")
        elif patcher.wants(path, module, "swiglu"):
            patcher.set_forward(path, module, gated_mlp_forward, "swiglu")
    elif isinstance(module, shared.router):
        if patcher.wants(path, module, "moe_router"):
            patcher.set_forward(path, module, shared.router_forward, "moe_router")
    elif shared.experts is not None and isinstance(module, shared.experts):
        why = experts_supported(module, config.hidden_act)
        if why:
            report.leave(path, module, why)
        elif patcher.wants(path, module, *EXPERT_BLOCKS):
            report.replace(path, module, *EXPERT_BLOCKS)
    elif isinstance(module, nn.Embedding):
        report.leave(path, module, "embedding lookup: no block")
    elif path.rsplit(".", 1)[-1] == "lm_head":
        report.leave(path, module, "the logits are the model's output: the fused linear cross-entropy blocks never "
                                   "build them, so they are not swapped in here")
    else:
        return False
    return True


def patch_mla_model(patcher, shared: SharedModules, attention: type, forward: Callable, blocks: Callable,
                    plain_kv_b: bool = True, decode_forward: Callable | None = None,
                    decode_blocks: Callable = lambda module: ("mla_decode",),
                    optional: Callable = lambda module: ("rotary",)) -> None:
    """The walk of an MLA family (DeepSeek's naming): the shared modules, then every ``attention`` module's forward
    replaced by ``forward`` with the blocks ``blocks(module)`` names (by ``decode_forward``, with the blocks
    ``decode_blocks(module)`` names, where that is given and they are promoted and requested), and those of
    ``optional(module)`` that are promoted and requested too (its rotary embeddings by workbench::rotary:
    ``rotation``; a DSA indexer's key norm by workbench::layernorm); with ``plain_kv_b`` a module whose kv_b_proj is
    adapted is left alone (its weight alone is not what it computes)."""
    for path, module in patcher.model.named_modules():
        if patch_shared(patcher, path, module, shared) or not isinstance(module, attention):
            continue
        if plain_kv_b and type(module.kv_b_proj) is not nn.Linear:
            patcher.report.leave(path, module, f"kv_b_proj is a {qualified(module.kv_b_proj)} (an adapter): mla "
                                               "takes W_uk and W_uv as plain weights")
        elif patcher.wants(path, module, *blocks(module)):
            extra = tuple(block for block in optional(module) if patcher.may(block))
            if decode_forward is not None and patcher.may(*decode_blocks(module)):
                patcher.set_forward(path, module, decode_forward, *blocks(module), *decode_blocks(module), *extra)
            else:
                patcher.set_forward(path, module, forward, *blocks(module), *extra)
    finish_shared(patcher)
    patcher.report.notes.append("plain projections (nn.Linear) run in torch")


def computes(module: nn.Module, block: str) -> bool:
    """Whether ``module``'s patched forward computes ``block`` through its op (the blocks its patch named:
    ``Patcher.set_forward``, ``kinds.install``), where the block is optional to it (rotary, kda_prologue)."""
    return block in getattr(module, "workbench_blocks", ())


def rotation(self: nn.Module, position_embeddings, shipped_apply: Callable, interleaved: bool, heads_dim: int = 1):
    """The ``rotate(q, k)`` an MLA or DSA forward hands on: q and k [B, H, T, R] (``heads_dim`` 1: the attention's
    rope parts) or [B, T, H, R] (2: the indexer's), rotated on the module's position embeddings (cos, sin
    [B, T, R]) by workbench::rotary (``interleaved``: transformers' _interleave form) where the module computes
    that block (``computes``), else by ``shipped_apply`` (the family's apply_rotary_pos_emb or its _interleave
    form). Its ``rope_last``: x [B, T, H, D] -> its last R channels rotated by one workbench::rotary call, the others
    passed (an MLA query [nope | rope] rotated whole; a rope key, D = R), where the module computes that block, else
    None."""
    cos, sin = position_embeddings
    ported = computes(self, "rotary")
    if not ported:
        def rotate(q, k):
            return shipped_apply(q, k, cos, sin, unsqueeze_dim=heads_dim)
    elif heads_dim == 2:
        def rotate(q, k):
            return ops.rotary(q, cos, sin, interleaved), ops.rotary(k, cos, sin, interleaved)
    else:
        def rotate(q, k):
            return tuple(ops.rotary(x.transpose(1, 2), cos, sin, interleaved).transpose(1, 2) for x in (q, k))
    rotate.rope_last = (lambda x: ops.rotary(x, cos, sin, interleaved, True)) if ported else None
    return rotate


ROTARY_TABLES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "as given": lambda t: t,
    "doubled": lambda t: torch.cat([t, t], dim=-1),
}
"""How a modeling file's apply_rotary_pos_emb reads its cos and sin [B, T, W] before rotating by halves, as the
table workbench::rotary takes: as given (cat(freqs, freqs): Llama, Qwen, GLM-4.5's partial rotary) or doubled (a
half-width table, one angle a pair: GPT-OSS). ERNIE-4.5 rotates interleaved pairs and keeps them interleaved, which
no table gives (workbench::rotary returns interleaved pairs in the half layout): it keeps its own rotation."""


_ROTATING: contextvars.ContextVar[tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]] | None] = \
    contextvars.ContextVar("workbench_rotary_as_op", default=None)
"""The module whose forward runs inside ``rotary_as_op`` in this thread (context), and how it reads its table."""
_SHIPPED_ROTATIONS: dict[str, Callable] = {}
"""Modeling module name -> its shipped apply_rotary_pos_emb, where ``rotary_as_op`` put its dispatcher."""


def _dispatch_rotation(modeling) -> Callable:
    """The shipped ``apply_rotary_pos_emb`` of ``modeling``, its module attribute made (once, for the process) a
    dispatcher: workbench::rotary inside ``rotary_as_op`` for a module of that file, in that thread only; the shipped
    function everywhere else, and for a call of another form (position ids, cos without its batch)."""
    if modeling.__name__ in _SHIPPED_ROTATIONS:
        return _SHIPPED_ROTATIONS[modeling.__name__]
    shipped_apply = _SHIPPED_ROTATIONS[modeling.__name__] = modeling.apply_rotary_pos_emb

    def apply(q, k, cos, sin, *rest, unsqueeze_dim=1, **more):
        active = _ROTATING.get()
        if active is None or sys.modules[type(active[0]).__module__] is not modeling or rest or more \
                or cos.dim() != 3 or unsqueeze_dim not in (1, 2):
            return shipped_apply(q, k, cos, sin, *rest, unsqueeze_dim=unsqueeze_dim, **more)
        module, read = active
        return rotation(module, (read(cos), read(sin)), shipped_apply, False, unsqueeze_dim)(q, k)

    apply.__wrapped__ = shipped_apply
    modeling.apply_rotary_pos_emb = apply
    return shipped_apply


@contextmanager
def rotary_as_op(module: nn.Module, table: str = "as given") -> Iterator[None]:
    """Within the block, in this thread, the ``apply_rotary_pos_emb`` of ``module``'s modeling file (transformers'
    rotate-half form: q, k [B, H, T, D] with unsqueeze_dim 1 or [B, T, H, D] with 2, cos and sin [B, T, W] read as
    ``table`` says (ROTARY_TABLES) into R channels, the channels past R passed) is workbench::rotary, as ``rotation``
    applies it. The file's function is a dispatcher from the first use on (``_dispatch_rotation``): other threads,
    and this one outside the block, run the shipped function, whatever the blocks' order of entry and exit. A call
    of another form runs the shipped function. The probe holds the module to its shipped forward with this in place:
    a family whose function of that name computes another rotation fails there."""
    _dispatch_rotation(sys.modules[type(module).__module__])
    token = _ROTATING.set((module, ROTARY_TABLES[table]))
    try:
        yield
    finally:
        _ROTATING.reset(token)


def takes_rotary_as_op(module: nn.Module) -> bool:
    """Whether ``module``'s modeling file has the rotate-half ``apply_rotary_pos_emb`` that ``rotary_as_op``
    replaces."""
    return callable(getattr(sys.modules.get(type(module).__module__), "apply_rotary_pos_emb", None))


def attention_with_rotary_forward(self: nn.Module, *args, **kwargs):
    """A softmax-attention module's own forward (its attention function the model's, the workbench's) with its
    rotary embedding as workbench::rotary (``rotary_as_op``)."""
    with rotary_as_op(self):
        return self.original_forward(*args, **kwargs)


def finish_shared(patcher) -> None:
    """After the walk: where experts were replaced, register ``experts_forward`` in transformers' experts registry
    and make it the model's experts implementation."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if any(row.blocks == EXPERT_BLOCKS for row in patcher.report.rows):
        ALL_EXPERTS_FUNCTIONS.register(EXPERTS_IMPLEMENTATION, experts_forward)
        patcher.model.set_experts_implementation(EXPERTS_IMPLEMENTATION)


def patch_attention(patcher, attention_classes: tuple[type, ...], role: str) -> None:
    """The softmax-attention modules of ``attention_classes`` through the attention block: where every one of them
    computes the block's variant (workbench.integrations.attention.unsupported) and the block may be used, the
    model's attention implementation becomes the workbench's (one for the whole model, as transformers has it) and
    each module is reported replaced; else each is left alone with the reason. ``role``: what stays in torch
    around the attention function (projections, norms, gate); the rotary embedding runs as workbench::rotary where
    the modeling file's apply_rotary_pos_emb is there and that block is promoted and requested
    (``attention_with_rotary_forward``)."""
    from workbench.integrations.attention import unsupported, use_workbench_attention

    found = [(path, m) for path, m in patcher.model.named_modules() if isinstance(m, attention_classes)]
    why = next((reason for _, m in found if (reason := unsupported(m))), "")
    if not found:
        return
    if why:
        for path, module in found:
            patcher.report.leave(path, module, why)
        return
    if all(patcher.wants(path, module, "attention") for path, module in found):
        use_workbench_attention(patcher.model)
        for path, module in found:
            if patcher.may("rotary") and takes_rotary_as_op(module):
                patcher.set_forward(path, module, attention_with_rotary_forward, "attention", "rotary")
            else:
                patcher.report.replace(path, module, "attention")
        patcher.report.notes.append(f"around each attention function, {role} stay in torch")


KDA_LEFT_IN_TORCH = "inside each KDA layer the l2norm of q and k (eps 1e-6) and the sigmoid of beta stay in torch"
KDA_L2NORM_EPS = 1e-6
"""The eps of fla's l2norm, which the KDA and gated DeltaNet layers apply to q and k."""
KDA_DECODE_BLOCKS = ("kda_short_conv_decode", "kda_decode")


def hyper_connection_forward(self: nn.Module, hidden_streams: torch.Tensor):
    """transformers' mHC module (``Glm5NextTextHyperConnection``, ``DeepseekV4HyperConnection``: fn, base, scale,
    hc_mult, hc_sinkhorn_iters, hc_eps, an unweighted input_norm) as workbench::hyper_connection: hidden_streams
    [B, S, N, D] -> (post [B, S, N], comb [B, S, N, N], both float32, collapsed [B, S, D] in the streams' dtype)."""
    b, s, n, d = hidden_streams.shape
    post, comb, collapsed = ops.hyper_connection(hidden_streams.reshape(b * s, n, d), self.fn, self.base, self.scale,
                                                 self.input_norm.eps, self.hc_eps, self.hc_sinkhorn_iters)
    return post.view(b, s, n), comb.view(b, s, n, n), collapsed.view(b, s, d)


def hyper_connection_mix(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
                         comb: torch.Tensor) -> torch.Tensor:
    """A hyper-connected sub-layer's end as workbench::hyper_connection_mix: its output y [B, S, D] expanded into
    the streams by post [B, S, N] plus the residual streams [B, S, N, D] mixed by comb [B, S, N, N] ->
    [B, S, N, D] in the residual's dtype (the layers' ``post * y + comb^T @ residual``)."""
    b, s, n, d = residual.shape
    out = ops.hyper_connection_mix(y.reshape(b * s, d), residual.reshape(b * s, n, d), post.reshape(b * s, n),
                                   comb.reshape(b * s, n, n))
    return out.view(b, s, n, d)


def l2norm(x: torch.Tensor, eps: float = KDA_L2NORM_EPS) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, in float32 (fla's l2norm, which the KDA layers apply to q and k;
    transformers' torch path computes the same)."""
    x32 = x.float()
    return (x32 / torch.sqrt((x32 * x32).sum(dim=-1, keepdim=True) + eps)).to(x.dtype)


def kda_prologue(self: nn.Module, q: torch.Tensor, k: torch.Tensor, beta_logits: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A KDA (or gated DeltaNet) layer's q, k [B, T, H, K] l2-normalised per head (eps 1e-6) and its beta
    [B, T, HV] squashed by a sigmoid: workbench::kda_prologue where the layer computes that block (``computes``),
    else in torch as shipped (the l2norm in float32, the sigmoid in the logits' dtype)."""
    if computes(self, "kda_prologue"):
        return ops.kda_prologue(q, k, beta_logits, KDA_L2NORM_EPS)
    return l2norm(q, KDA_L2NORM_EPS), l2norm(k, KDA_L2NORM_EPS), torch.sigmoid(beta_logits)


def padding_zeroed(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The hidden states with the padding tokens of a 2-D attention mask zeroed (transformers'
    apply_mask_to_padding_states, which every linear-attention layer applies first)."""
    if attention_mask is None or attention_mask.dim() != 2:
        return hidden_states
    return (hidden_states * attention_mask[:, :, None]).to(hidden_states.dtype)


def kda_output_gate(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """A KDA layer's output gate [B, T, HV * V]: low rank (g_b_proj(g_a_proj(x)), Kimi Linear) or full rank
    (g_proj(x): Kimi K3's use_full_rank_gate, Bailing-Hybrid)."""
    if hasattr(self, "g_a_proj"):
        return self.g_b_proj(self.g_a_proj(hidden_states))
    return self.g_proj(hidden_states)


def kda_layer_supported(module: nn.Module) -> str:
    """Why ``kda_layer_forward`` cannot compute a KDA layer ("" when it can): the projections, short convolution,
    forget gate, beta and gated output norm of Kimi Linear's layer, under these names."""
    missing = [n for n in ("q_proj", "k_proj", "v_proj", "conv1d", "forget_gate", "b_proj", "o_norm", "o_proj")
               if not hasattr(module, n)]
    if missing or not (hasattr(module, "g_proj") or hasattr(module, "g_a_proj")):
        return f"a linear-attention layer without {', '.join(missing) or 'an output gate (g_proj, g_a_proj)'}"
    return short_conv_supported(module)


def kda_layer_forward(self: nn.Module, hidden_states: torch.Tensor, cache_params=None,
                      attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """A KDA layer's forward (transformers' KimiLinearDeltaAttention; GLM-5-Next's and Bailing-Hybrid's compute the
    same) with the short convolution as workbench::kda_short_conv and the delta rule as workbench::kda (no initial
    state); into an empty cache (a prefill from the first token) it writes the conv input's tail and the final state
    as the shipped forward does. A cache holding this layer's past (decode), packed sequences (cu_seqlens) or an
    adapted conv1d (its weight alone is not what it computes) run the shipped forward."""
    if not empty_cache(cache_params, self.layer_idx) or kwargs.get("cu_seqlens") is not None \
            or type(self.conv1d) is not nn.Conv1d:
        return self.original_forward(hidden_states, cache_params=cache_params, attention_mask=attention_mask,
                                     **kwargs)
    hidden_states = padding_zeroed(hidden_states, attention_mask)
    b, t = hidden_states.shape[:2]
    heads = (b, t, -1, self.head_dim)
    mixed = torch.cat([self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)], dim=-1)
    if cache_params is not None:
        cache_params.update_conv_state(mixed.transpose(1, 2), self.layer_idx, conv_kernel_size=self.conv_kernel_size)
    mixed = ops.kda_short_conv(mixed, self.conv1d.weight.squeeze(1))
    q, k, v = (part.reshape(heads) for part in mixed.split(self.qkv_dim, dim=-1))
    g = self.forget_gate(hidden_states)
    q, k, beta = kda_prologue(self, q, k, self.b_proj(hidden_states))
    o, final_state = ops.kda(q, k, v, g.to(v.dtype), beta.to(v.dtype), self.head_dim ** -0.5, None)
    if cache_params is not None:
        cache_params.update_recurrent_state(final_state.to(torch.float32), self.layer_idx)
    return self.o_proj(self.o_norm(o, kda_output_gate(self, hidden_states).view(heads)).reshape(b, t, -1))


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
    hidden_states = padding_zeroed(hidden_states, attention_mask)
    b = hidden_states.shape[0]
    x = hidden_states[:, 0]
    slots = torch.arange(b, device=x.device)
    mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
    mixed, _ = ops.kda_short_conv_decode(mixed, self.conv1d.weight.squeeze(1), conv_state, slots)
    q, k, v = (part.reshape(b, -1, self.head_dim) for part in mixed.split(self.qkv_dim, dim=-1))
    g = self.forget_gate(hidden_states)[:, 0]
    q, k, beta = kda_prologue(self, q, k, self.b_proj(x))
    o, _ = ops.kda_decode(q, k, v, g.to(v.dtype), beta.to(v.dtype), self.head_dim ** -0.5, recurrent_state, slots)
    gate = kda_output_gate(self, hidden_states).view(b, 1, -1, self.head_dim)
    return self.o_proj(self.o_norm(o[:, None], gate).reshape(b, 1, -1))


def patch_kda_layer(patcher, path: str, module: nn.Module) -> None:
    """A KDA layer by kda_short_conv + kda, and its decode steps by their serving forms where both are promoted and
    requested; or left alone with the reason."""
    why = kda_layer_supported(module)
    if why:
        patcher.report.leave(path, module, why)
    elif patcher.wants(path, module, "kda_short_conv", "kda"):
        prologue = patcher.may("kda_prologue")
        blocks = ("kda_short_conv", "kda_prologue", "kda") if prologue else ("kda_short_conv", "kda")
        if patcher.may(*KDA_DECODE_BLOCKS):
            patcher.set_forward(path, module, kda_layer_forward_with_decode, *blocks, *KDA_DECODE_BLOCKS)
        else:
            patcher.set_forward(path, module, kda_layer_forward, *blocks)
        if not prologue and KDA_LEFT_IN_TORCH not in patcher.report.notes:
            patcher.report.notes.append(KDA_LEFT_IN_TORCH)
