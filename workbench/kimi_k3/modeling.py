"""Kimi K3's text model as its published serving code computes it (vLLM 0.32 ``vllm/models/kimi_k3``, the ROCm path
``amd/`` read beside ``nvidia/``), with the parameter names vLLM's loader reads from K3's checkpoint.

    x_0 = embed_tokens(ids)                                                     Block AttnRes (amd/linear.py
    per layer l (KDA where (l + 1) in kda_layers, else MLA; K3.1 Pro's DSA     KimiDecoderLayer.forward_attn_residual,
    layers from its release notes):                                             amd/ops/attn_res.py):
        at l % S == 0: the running partial sum becomes a block                    blocks = [x_0, b_1, b_2, ...],
        h = AttnRes(blocks + [partial]) fused with input_layernorm                b_j = the sum of the sub-layer
        partial += self_attn(h)                                                   outputs of layers S(j-1)..Sj-1
        h = AttnRes(blocks + [partial]) fused with post_attention_layernorm     logit_i = sum(v_i * g_key * w) *
        partial += mlp(h)                    (dense SiTU MLP below              rsqrt(mean(v_i^2) + eps), no scale,
                                              first_k_dense_replace, then       softmax over the sources, the raw
                                              latent MoE)                        sources mixed, the pre-norm fused
    h = AttnRes(blocks + [partial])          (no norm fused)
    logits = lm_head(norm(h))                (compute_logits applies the final norm: MTP reads h before it)

Attention: KDA (amd/kda.py KimiK3DeltaAttention): q, k, v each through a causal depthwise conv (kernel 4) with SiLU,
q and k L2-normalised (x * rsqrt(sum x^2 + 1e-6)), q scaled by K^-0.5; beta = sigmoid(b_proj x); the forget gate low
rank, f = f_b_proj(f_a_proj(x)) (rank head_dim), g = -5 * sigmoid(exp(A_log) * (f + dt_bias)); the delta rule;
the output RMSNorm(o) * w * sigmoid(g_proj(x)) (FusedRMSNormGated, eps 1e-5; g_proj full rank with
use_full_rank_gate), then o_proj. MLA (amd/linear.py KimiMLAAttention): no rotary embedding (mla_use_nope), the
output gate o * sigmoid(g_proj(x)) per head before o_proj, scale (nope + rope)^-0.5.
Latent MoE (amd/linear.py KimiMoE, KimiRoutedOutputTransform): the router on x (fp32 logits, sigmoid, the correction
bias for the choice only, renormalised top-k, routed_scaling_factor); x_lat = routed_expert_down_proj(x) with no norm;
the experts (SiTU) at the latent width; y_lat = sum_k p_k E_k(x_lat); routed_expert_up_proj(routed_expert_norm(y_lat));
plus the shared experts (one SiTU MLP of num_shared_experts x moe_intermediate_size) on x.
MTP (common/mtp.py, amd/mtp.py): eh_proj([enorm(embed(next token)) ; hnorm(h)]), the embedding half first and zeroed
at position 0, h the hidden state before the final norm; one pre-norm decoder layer without AttnRes (MLA + MoE);
shared_head.norm and its own shared_head.head.

Every catalog block is called through ``self.ops`` of the module that computes it ({block: callable with the block
reference's signature}): the blocks' references by default (the model in torch), a promoted operator, a candidate
file or the kernels library's op (``use_ops``, ``workbench.integrations.families.kimi_k3``). The glue between blocks
(projections, MLA's absorbed products in serving) is plain torch.

Two paths: training (``forward`` on [B, T] ids without a cache: the blocks' training forms, gradients everywhere)
and serving (with a ``KimiK3Cache``: the packed prefill forms, then one decode step per call, over the caches as vLLM
keeps them; workbench.kimi_k3.serving). Hidden states are rows [N, D] on both paths.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workbench.blocks import REGISTRY
from workbench.kimi_k3.config import KimiK3Config
from workbench.kimi_k3.serving import KimiK3Cache, Packing, pack

L2NORM_EPS = 1e-6  # q and k: x * rsqrt(sum x^2 + 1e-6) (vLLM's fused_recurrent_kda, fla's l2norm): kda_prologue
GATED_NORM_EPS = 1e-5  # FusedRMSNormGated's default: K3's o_norm is built without an eps


def reference_ops() -> dict[str, Callable]:
    """Every catalog block on its reference (its exact training form where it has one): the model in torch."""
    return {name: spec.training_reference or spec.reference for name, spec in REGISTRY.items()}


class OpsModule(nn.Module):
    """A module that computes catalog blocks: ``self.ops`` maps each block it calls to the callable that computes it.
    ``TRAINING`` are the blocks of its training forward, ``SERVING`` those of its prefill and decode steps."""

    TRAINING: tuple[str, ...] = ()
    SERVING: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, Callable] = reference_ops()

    def blocks(self) -> tuple[str, ...]:
        """The blocks this instance calls (the training and serving forms of its configuration)."""
        return self.TRAINING + self.SERVING


@dataclass
class Rows:
    """How the hidden-state rows [N, D] of a call are laid out: a training batch (``batch`` sequences of
    ``length``), or serving (``packing`` of the new tokens, ``cache`` the state they continue)."""

    batch: int
    length: int
    packing: Packing | None = None
    cache: KimiK3Cache | None = None


def _linear(d_in: int, d_out: int) -> nn.Linear:
    return nn.Linear(d_in, d_out, bias=False)


def wide(x: torch.Tensor) -> torch.Tensor:
    """x in float32 (float64 stays float64): the precision K3's code computes its glue in."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class LoRALinear(OpsModule):
    """A frozen projection with LoRA adapters through the lora_linear block: y = x W^T + x A^T B^T * scaling, with
    PEFT's initialisation (A [r, IN] kaiming-uniform of bound 1/sqrt(IN), B [OUT, r] zeros, scaling alpha / r).
    Parameters: weight (the base's, frozen), lora_a, lora_b."""

    TRAINING = ("lora_linear",)

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator):
        super().__init__()
        self.weight = base.weight
        self.weight.requires_grad_(False)
        d_out, d_in = self.weight.shape
        bound = 1 / math.sqrt(d_in)
        self.lora_a = nn.Parameter(((torch.rand(rank, d_in, generator=generator) * 2 - 1) * bound)
                                   .to(self.weight.dtype))
        self.lora_b = nn.Parameter(torch.zeros(d_out, rank, dtype=self.weight.dtype))
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ops["lora_linear"](x.reshape(-1, x.shape[-1]), self.weight, self.lora_a, self.lora_b, self.scaling)
        return y.reshape(*x.shape[:-1], y.shape[-1])


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "g_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
                "gate_proj", "up_proj", "down_proj", "routed_expert_down_proj", "routed_expert_up_proj")
"""The projections LoRA adapts: attention (KDA's q, k, v, o and output gate; MLA's latents, o and gate), the MLPs and
shared experts, the latent MoE's projections. kv_b_proj is read as W_uk and W_uv by the MLA ops and the AttnRes
pseudo-queries as vectors, so neither is a projection whose output an adapter could change."""


class KimiK3RMSNorm(OpsModule):
    """RMSNorm (vLLM's RMSNorm, eps rms_norm_eps): rows [..., N] -> [..., N]."""

    TRAINING = ("rmsnorm",)

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops["rmsnorm"](x, self.weight, self.variance_epsilon)


class KimiK3GatedRMSNorm(OpsModule):
    """The KDA output norm, RMSNorm(o) * weight * sigmoid(gate) per head (FusedRMSNormGated(head_dim,
    activation="sigmoid")): o, gate [rows, K] -> [rows, K]."""

    TRAINING = ("rmsnorm_gated",)

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = GATED_NORM_EPS

    def forward(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.ops["rmsnorm_gated"](o, self.weight, gate, self.eps, "sigmoid")


class AttnResKey(nn.Module):
    """An AttnRes's key norm: its weight [D] and eps, read by the attnres op (vLLM's RMSNorm module whose weight the
    attn_res kernel takes; never called on its own)."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.variance_epsilon = eps


class KimiK3MLP(OpsModule):
    """gate_proj, up_proj, down_proj with SiTU over [gate | up] (SituAndMul(beta, linear_beta)) or SwiGLU
    (hidden_act silu): rows [N, D] -> [N, D]."""

    def __init__(self, hidden: int, intermediate: int, config: KimiK3Config):
        super().__init__()
        self.gate_proj, self.up_proj = _linear(hidden, intermediate), _linear(hidden, intermediate)
        self.down_proj = _linear(intermediate, hidden)
        self.act = config.hidden_act
        self.betas = (config.activation_situ_beta, config.activation_situ_linear_beta)
        self.TRAINING = (self.act if self.act == "situ" else "swiglu",)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        y = self.ops["situ"](torch.cat([gate, up], dim=-1), *self.betas) if self.act == "situ" else \
            self.ops["swiglu"](gate, up)
        return self.down_proj(y)


class KimiK3DeltaAttention(OpsModule):
    """A KDA layer (module docstring): rows [N, D] -> [N, D]. Parameters as K3's checkpoint names them: q_proj,
    k_proj, v_proj [H*K, D]; q_conv1d, k_conv1d, v_conv1d (depthwise, [H*K, 1, W]); f_a_proj [K, D], f_b_proj
    [H*K, K]; A_log [H] and dt_bias [H*K] float32 in the checkpoint; b_proj [H, D]; g_proj [H*K, D] (or g_a_proj,
    g_b_proj without use_full_rank_gate); o_norm; o_proj [D, H*K]."""

    TRAINING = ("kda_short_conv", "kda_gate", "kda_prologue", "kda")
    SERVING = ("kda_short_conv_prefill", "kda_prefill", "kda_short_conv_decode", "kda_decode")

    def __init__(self, config: KimiK3Config, layer_idx: int):
        super().__init__()
        d, h, k = config.hidden_size, config.kda_num_heads, config.kda_head_dim
        self.layer_idx, self.heads, self.head_dim, self.width = layer_idx, h, k, config.short_conv_kernel_size
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = _linear(d, h * k), _linear(d, h * k), \
            _linear(d, h * k), _linear(h * k, d)
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (
            nn.Conv1d(h * k, h * k, self.width, groups=h * k, bias=False) for _ in range(3))
        self.f_a_proj, self.f_b_proj = _linear(d, k), _linear(k, h * k)
        self.A_log = nn.Parameter(torch.log(1 + 15 * torch.rand(h)))  # fla's init: A = U(1, 16)
        self.dt_bias = nn.Parameter(0.1 * torch.randn(h * k))
        self.b_proj = _linear(d, h)
        if config.use_full_rank_gate:
            self.g_proj = _linear(d, h * k)
        else:
            self.g_a_proj, self.g_b_proj = _linear(d, k), _linear(k, h * k)
        self.o_norm = KimiK3GatedRMSNorm(k)
        self.lower_bound = config.gate_lower_bound

    def conv_weight(self) -> torch.Tensor:
        """The q, k, v taps as one depthwise filter bank [3*H*K, W] (vLLM's packed conv1d)."""
        return torch.cat([c.weight[:, 0] for c in (self.q_conv1d, self.k_conv1d, self.v_conv1d)])

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        return self.g_proj(x) if hasattr(self, "g_proj") else self.g_b_proj(self.g_a_proj(x))

    def forward(self, x: torch.Tensor, rows: Rows) -> torch.Tensor:
        n, (h, k) = x.shape[0], (self.heads, self.head_dim)
        f = self.f_b_proj(self.f_a_proj(x)).view(1, n, h, k)
        g = self.ops["kda_gate"](f, self.A_log, self.dt_bias.view(h, k), self.lower_bound)[0]  # [N, H, K] fp32
        beta_logits = self.b_proj(x)  # [N, H]
        if rows.cache is not None:  # the conv state is vLLM's, packed [3*H*K]
            mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
            o = self._serve(mixed, g, beta_logits, rows)
        else:  # one short convolution each, as fla's KimiDeltaAttention trains (the same depthwise math, no packing)
            q, k_, v = (self.ops["kda_short_conv"](proj(x).view(rows.batch, rows.length, -1), conv.weight[:, 0])
                        .reshape(n, h, k) for proj, conv in ((self.q_proj, self.q_conv1d), (self.k_proj, self.k_conv1d),
                                                             (self.v_proj, self.v_conv1d)))
            q, k_, beta = self.ops["kda_prologue"](q, k_, beta_logits, L2NORM_EPS)
            o, _ = self.ops["kda"](*(t.view(rows.batch, rows.length, h, -1) for t in (q, k_, v)),
                                   g.to(x.dtype).view(rows.batch, rows.length, h, k),
                                   beta.view(rows.batch, rows.length, h), k ** -0.5, None)
        o = self.o_norm(o.reshape(n * h, k), self.output_gate(x).reshape(n * h, k))
        return self.o_proj(o.reshape(n, h * k))

    def _serve(self, mixed: torch.Tensor, g: torch.Tensor, beta_logits: torch.Tensor, rows: Rows) -> torch.Tensor:
        """The conv and the delta rule over the cache's states (vLLM's KDA prefill and decode): [N, H, V]."""
        h, k = self.heads, self.head_dim
        cache, packing = rows.cache, rows.packing
        state = cache.kda_state(self.layer_idx, mixed.shape[-1], self.width, h, k, k)
        slots, has_state = cache.slots, cache.seq_lens > 0
        if packing.decode:
            y, state["conv"] = self.ops["kda_short_conv_decode"](mixed, self.conv_weight(), state["conv"], slots)
        else:
            y, state["conv"] = self.ops["kda_short_conv_prefill"](mixed, self.conv_weight(), state["conv"],
                                                                  packing.cu_seqlens, slots, has_state)
        q, k_, v = (part.reshape(-1, h, k) for part in y.split(h * k, dim=-1))
        q, k_, beta = self.ops["kda_prologue"](q, k_, beta_logits, L2NORM_EPS)
        g = g.to(v.dtype)
        if packing.decode:
            o, state["state"] = self.ops["kda_decode"](q, k_, v, g, beta, k ** -0.5, state["state"], slots)
        else:
            o, state["state"] = self.ops["kda_prefill"](q, k_, v, g, beta, k ** -0.5, state["state"],
                                                        packing.cu_seqlens, slots, has_state)
        return o


class KimiK3MLAAttention(OpsModule):
    """An MLA layer (module docstring): rows [N, D] -> [N, D]. q_a_proj [q_rank, D], q_a_layernorm, q_b_proj
    [H*(DN+DR), q_rank] (q_proj without q_lora_rank); kv_a_proj_with_mqa [R+DR, D], kv_a_layernorm; kv_b_proj
    [H*(DN+DV), R]; g_proj [H*DV, D] (mla_use_output_gate); o_proj [D, H*DV]. Training: the mla block over the
    decompressed heads; serving: W_uk absorbed into the query and W_uv applied to the latent output (FlashMLA's
    form, mla_prefill / mla_decode over the paged latent cache), the gate after W_uv."""

    TRAINING = ("mla",)
    SERVING = ("mla_prefill", "mla_decode")

    def __init__(self, config: KimiK3Config, layer_idx: int):
        super().__init__()
        d, h = config.hidden_size, config.num_attention_heads
        self.layer_idx, self.heads = layer_idx, h
        self.dn, self.dr, self.dv, self.rank = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim, \
            config.kv_lora_rank
        self.q_lora_rank = config.q_lora_rank
        if self.q_lora_rank:
            self.q_a_proj = _linear(d, self.q_lora_rank)
            self.q_a_layernorm = KimiK3RMSNorm(self.q_lora_rank, config.rms_norm_eps)
            self.q_b_proj = _linear(self.q_lora_rank, h * (self.dn + self.dr))
        else:
            self.q_proj = _linear(d, h * (self.dn + self.dr))
        self.kv_a_proj_with_mqa = _linear(d, self.rank + self.dr)
        self.kv_a_layernorm = KimiK3RMSNorm(self.rank, config.rms_norm_eps)
        self.kv_b_proj = _linear(self.rank, h * (self.dn + self.dv))
        if config.mla_use_output_gate:
            self.g_proj = _linear(d, h * self.dv)
        self.o_proj = _linear(h * self.dv, d)
        self.scaling = (self.dn + self.dr) ** -0.5

    def latents(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """q [N, H, DN + DR], c_kv [N, R] (normalised), k_rope [N, DR], and c_q (the normalised q latent, None
        without q_lora_rank)."""
        c_q = self.q_a_layernorm(self.q_a_proj(x)) if self.q_lora_rank else None
        q = (self.q_b_proj(c_q) if c_q is not None else self.q_proj(x)).view(-1, self.heads, self.dn + self.dr)
        c_kv, k_rope = self.kv_a_proj_with_mqa(x).split([self.rank, self.dr], dim=-1)
        return q, self.kv_a_layernorm(c_kv), k_rope, c_q

    def gate(self, x: torch.Tensor) -> torch.Tensor | None:
        """The output gate's pre-activation [N, H, DV] (None without mla_use_output_gate)."""
        return self.g_proj(x).view(-1, self.heads, self.dv) if hasattr(self, "g_proj") else None

    def w_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_uk [H, DN, R] and W_uv [H, DV, R]: views of kv_b_proj's weight."""
        w = self.kv_b_proj.weight.view(self.heads, self.dn + self.dv, self.rank)
        return w[:, :self.dn], w[:, self.dn:]

    def forward(self, x: torch.Tensor, rows: Rows) -> torch.Tensor:
        q, c_kv, k_rope, _ = self.latents(x)
        if rows.cache is not None:
            return self.o_proj(self.gated(self._serve(q, c_kv, k_rope, rows), x).reshape(x.shape[0], -1))
        b, t = rows.batch, rows.length
        gate = self.gate(x)
        out = self.ops["mla"](q.view(b, t, self.heads, -1), c_kv.view(b, t, -1).contiguous(),
                              k_rope.view(b, t, -1).contiguous(), *self.w_kv(),
                              None if gate is None else gate.view(b, t, self.heads, -1), self.scaling)
        return self.o_proj(out.reshape(b * t, -1))

    def gated(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """o [N, H, DV] times sigmoid of the output gate (in torch: the serving forms end at the latent output)."""
        gate = self.gate(x)
        return o if gate is None else (wide(o) * torch.sigmoid(wide(gate))).to(o.dtype)

    def absorbed(self, q: torch.Tensor) -> torch.Tensor:
        """[q_nope W_uk | q_rope] [N, H, R + DR]: the query of the absorbed form."""
        w_uk, _ = self.w_kv()
        return torch.cat([torch.einsum("nhd,hdr->nhr", q[..., :self.dn], w_uk), q[..., self.dn:]], dim=-1)

    def values(self, o_lat: torch.Tensor) -> torch.Tensor:
        """The latent outputs [N, H, R] through W_uv: [N, H, DV]."""
        return torch.einsum("nhr,hdr->nhd", o_lat, self.w_kv()[1])

    def _serve(self, q: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor, rows: Rows) -> torch.Tensor:
        cache, packing = rows.cache, rows.packing
        pool = cache.paged(self.layer_idx, "latent", self.rank + self.dr)
        args = (self.absorbed(q).contiguous(), c_kv.contiguous(), k_rope.contiguous(), pool["latent"],
                cache.block_table, cache.seq_lens)
        if packing.decode:
            o_lat, pool["latent"] = self.ops["mla_decode"](*args, self.scaling)
        else:
            o_lat, pool["latent"] = self.ops["mla_prefill"](*args, packing.cu_seqlens, self.scaling)
        return self.values(o_lat)


class KimiK3Indexer(OpsModule):
    """The lightning indexer of a gated-DSA layer (Kimi K3.1 Pro's release notes; DeepSeek-V3.2's indexer without
    rotary embedding, as K3's MLA has none): q_idx = wq(c_q) [N, HI, DI], k_idx = wk(x) [N, DI], weights =
    weights_proj(x) * (HI * DI)^-0.5 [N, HI]; each token's top-k keys by sum_j w_j relu(q_idx_j . k_idx). The
    selection takes no gradient from the language-model loss (DeepSeek-V3.2 trains its indexer with a loss of its
    own, which this model has not): it is computed without autograd."""

    TRAINING = ("dsa_indexer",)
    SERVING = ("dsa_indexer_prefill", "dsa_indexer_decode")

    def __init__(self, config: KimiK3Config, layer_idx: int):
        super().__init__()
        d, hi, di = config.hidden_size, config.index_n_heads, config.index_head_dim
        self.layer_idx, self.heads, self.dim, self.topk = layer_idx, hi, di, config.index_topk
        self.wq = _linear(config.q_lora_rank or d, hi * di)
        self.wk = _linear(d, di)
        self.weights_proj = _linear(d, hi)

    def inputs(self, x: torch.Tensor, c_q: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q_idx = self.wq(x if c_q is None else c_q).view(-1, self.heads, self.dim)
        return q_idx, self.wk(x), self.weights_proj(x) * (self.heads * self.dim) ** -0.5

    @torch.no_grad()
    def forward(self, x: torch.Tensor, c_q: torch.Tensor | None, rows: Rows) -> torch.Tensor:
        """The selected positions: [B, T, topk] int64 (training) or [N, topk] int32 (serving, from the cache)."""
        q_idx, k_idx, w = self.inputs(x, c_q)
        if rows.cache is None:
            b, t = rows.batch, rows.length
            return self.ops["dsa_indexer"](q_idx.view(b, t, self.heads, -1), k_idx.view(b, t, -1),
                                           w.view(b, t, -1), self.topk)[1]
        cache, packing = rows.cache, rows.packing
        pool = cache.paged(self.layer_idx, "index_keys", self.dim)
        if packing.decode:
            _, indices, pool["index_keys"] = self.ops["dsa_indexer_decode"](
                q_idx, k_idx, w, pool["index_keys"], cache.block_table, cache.seq_lens, self.topk)
        else:
            _, indices, pool["index_keys"] = self.ops["dsa_indexer_prefill"](
                q_idx, k_idx, w, pool["index_keys"], cache.block_table, cache.seq_lens, packing.cu_seqlens,
                self.topk)
        return indices


class KimiK3DSAAttention(KimiK3MLAAttention):
    """Kimi K3.1 Pro's gated DSA layer (release notes, not K3's code): K3's MLA layer, its weights and output gate,
    attending only over the keys its lightning indexer selects. Training: dsa_sparse_attention over the
    decompressed heads (keys [nope | rope] of DN + DR, values DV, one kv head per query head); serving: dsa_prefill
    and dsa_decode over the paged latent cache in the absorbed form."""

    TRAINING = ("dsa_sparse_attention",)
    SERVING = ("dsa_prefill", "dsa_decode")

    def __init__(self, config: KimiK3Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.indexer = KimiK3Indexer(config, layer_idx)

    def forward(self, x: torch.Tensor, rows: Rows) -> torch.Tensor:
        q, c_kv, k_rope, c_q = self.latents(x)
        indices = self.indexer(x, c_q, rows)
        if rows.cache is not None:
            return self.o_proj(self.gated(self._serve_sparse(q, c_kv, k_rope, indices, rows), x)
                               .reshape(x.shape[0], -1))
        b, t, h = rows.batch, rows.length, self.heads
        w_uk, w_uv = self.w_kv()
        k_nope = torch.einsum("nr,hdr->nhd", c_kv, w_uk)
        keys = torch.cat([k_nope, k_rope[:, None].expand(-1, h, -1)], dim=-1)
        values = torch.einsum("nr,hdr->nhd", c_kv, w_uv)
        gate = self.gate(x)
        out = self.ops["dsa_sparse_attention"](q.view(b, t, h, -1), keys.view(b, t, h, -1),
                                               values.view(b, t, h, -1), indices,
                                               None if gate is None else gate.view(b, t, h, -1), self.scaling)
        return self.o_proj(out.reshape(b * t, -1))

    def _serve_sparse(self, q: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor, indices: torch.Tensor,
                      rows: Rows) -> torch.Tensor:
        cache, packing = rows.cache, rows.packing
        pool = cache.paged(self.layer_idx, "latent", self.rank + self.dr)
        args = (self.absorbed(q).contiguous(), c_kv.contiguous(), k_rope.contiguous(), pool["latent"],
                cache.block_table, cache.seq_lens)
        if packing.decode:
            o_lat, pool["latent"] = self.ops["dsa_decode"](*args, indices, self.scaling)
        else:
            o_lat, pool["latent"] = self.ops["dsa_prefill"](*args, packing.cu_seqlens, indices, self.scaling)
        return self.values(o_lat)


class KimiK3Gate(OpsModule):
    """The router (GateLinear with fp32 logits and its e_score_correction_bias, a float32 buffer updated by
    balancing, not by gradients): rows [N, D] -> (None, weights [N, k] float32, ids [N, k]); the router logits are
    never built (transformers' routers return them first: None here). ``last_counts`` [E]: the tokens per expert of
    the last call."""

    TRAINING = ("moe_router",)

    def __init__(self, config: KimiK3Config):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(config.num_experts, config.hidden_size) / math.sqrt(config.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(config.num_experts, dtype=torch.float32))
        self.top_k, self.renormalize = config.num_experts_per_token, config.moe_renormalize
        self.scale, self.groups = config.routed_scaling_factor, (config.num_expert_group, config.topk_group)
        self.last_counts: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> tuple[None, torch.Tensor, torch.Tensor]:
        weights, ids, counts = self.ops["moe_router"](x, self.weight, self.e_score_correction_bias, self.top_k,
                                                      "sigmoid", None, self.renormalize, self.scale, *self.groups)
        self.last_counts = counts.detach()
        return None, weights, ids


class KimiK3Experts(OpsModule):
    """The routed experts, stacked: w1 (gate) and w3 (up) [E, F, Dx], w2 (down) [E, Dx, F] (the checkpoint's
    ``experts.{e}.w1/w3/w2.weight``); or, loaded from an mxfp4-pack-quantized checkpoint, their packed weights and
    e8m0 scales as buffers (forward only: moe_grouped_gemm_mxfp4). Rows in expert-major order [M, Dx] with offsets
    [E + 1] -> [M, Dx]."""

    TRAINING = ("moe_permute", "moe_grouped_gemm", "moe_combine")

    def __init__(self, config: KimiK3Config):
        super().__init__()
        e, f, dx = config.num_experts, config.moe_intermediate_size, config.expert_width
        self.num_experts = e
        self.w1 = nn.Parameter(torch.randn(e, f, dx) / math.sqrt(dx))
        self.w3 = nn.Parameter(torch.randn(e, f, dx) / math.sqrt(dx))
        self.w2 = nn.Parameter(torch.randn(e, dx, f) / math.sqrt(f))
        self.act = (config.hidden_act if config.hidden_act == "situ" else "swiglu", config.activation_situ_beta,
                    config.activation_situ_linear_beta)
        self.mxfp4 = False

    def use_mxfp4(self, packed: dict[str, torch.Tensor]) -> None:
        """Hold the experts as published in MXFP4 (``packed``: w1, w1_scale, w3, w3_scale, w2, w2_scale, uint8)."""
        for name in ("w1", "w3", "w2"):
            delattr(self, name)
            self.register_buffer(name, packed[name])
            self.register_buffer(f"{name}_scale", packed[f"{name}_scale"])
        self.mxfp4 = True
        self.TRAINING = ("moe_permute", "moe_grouped_gemm_mxfp4", "moe_combine")

    def forward(self, x_perm: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        if self.mxfp4:
            return self.ops["moe_grouped_gemm_mxfp4"](x_perm, offsets, self.w1, self.w1_scale, self.w3,
                                                      self.w3_scale, self.w2, self.w2_scale, *self.act)
        return self.ops["moe_grouped_gemm"](x_perm, offsets, self.w1, self.w3, self.w2, *self.act)


class KimiK3MoE(OpsModule):
    """The latent MoE layer (module docstring): rows [N, D] -> [N, D]. gate; experts; shared_experts;
    routed_expert_down_proj [Dx, D], routed_expert_norm [Dx] (latent_moe_use_norm), routed_expert_up_proj [D, Dx]
    (latent MoE: routed_expert_hidden_size set)."""

    TRAINING = ()

    def __init__(self, config: KimiK3Config):
        super().__init__()
        d, dx = config.hidden_size, config.expert_width
        self.gate = KimiK3Gate(config)
        self.experts = KimiK3Experts(config)
        self.shared_experts = KimiK3MLP(d, config.moe_intermediate_size * config.num_shared_experts, config) \
            if config.num_shared_experts else None
        self.latent = config.routed_expert_hidden_size is not None
        if self.latent:
            self.routed_expert_down_proj, self.routed_expert_up_proj = _linear(d, dx), _linear(dx, d)
            self.routed_expert_norm = KimiK3RMSNorm(dx, config.rms_norm_eps) if config.latent_moe_use_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, weights, ids = self.gate(x)
        xe = self.routed_expert_down_proj(x) if self.latent else x
        y = self.routed(xe, weights, ids)
        if self.latent:
            if self.routed_expert_norm is not None:
                y = self.routed_expert_norm(y)
            y = self.routed_expert_up_proj(y)
        return y if self.shared_experts is None else y + self.shared_experts(x)

    def routed(self, xe: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The routed experts' weighted sum per token: xe [n, Dx], weights [n, k] float32, ids [n, k] -> [n, Dx].
        The step an expert-parallel layout overrides (workbench.replay.distributed.ExpertParallelMoE)."""
        ops = self.experts.ops
        x_perm, _token_of_row, row_of_slot, _counts, offsets = ops["moe_permute"](xe, ids, self.experts.num_experts)
        return ops["moe_combine"](self.experts(x_perm, offsets), weights, row_of_slot)


class KimiK3DecoderLayer(OpsModule):
    """One decoder layer: self_attn (KDA, MLA or gated DSA), then mlp (dense) or block_sparse_moe, each behind its
    pre-norm (input_layernorm, post_attention_layernorm); with Block AttnRes (attn_res_block_size) each pre-norm is
    fused into the sub-layer's AttnRes (self_attention_res_proj [1, D] and self_attention_res_norm; mlp_res_proj,
    mlp_res_norm), else the plain residual (the MTP layer)."""

    TRAINING = ("attnres",)

    def __init__(self, config: KimiK3Config, layer_idx: int, kind: str, attn_res: bool):
        super().__init__()
        d, eps = config.hidden_size, config.rms_norm_eps
        self.layer_idx, self.kind = layer_idx, kind
        attention = {"K": KimiK3DeltaAttention, "M": KimiK3MLAAttention, "D": KimiK3DSAAttention}[kind]
        self.self_attn = attention(config, layer_idx)
        if config.is_moe_layer(layer_idx):
            self.block_sparse_moe = KimiK3MoE(config)
        else:
            self.mlp = KimiK3MLP(d, config.intermediate_size, config)
        self.input_layernorm = KimiK3RMSNorm(d, eps)
        self.post_attention_layernorm = KimiK3RMSNorm(d, eps)
        self.attn_res = attn_res
        self.TRAINING = ("attnres",) if attn_res else ()
        if attn_res:
            self.self_attention_res_proj, self.mlp_res_proj = _linear(d, 1), _linear(d, 1)
            nn.init.zeros_(self.self_attention_res_proj.weight)  # zero pseudo-queries: the uniform average
            nn.init.zeros_(self.mlp_res_proj.weight)
            self.self_attention_res_norm, self.mlp_res_norm = AttnResKey(d, eps), AttnResKey(d, eps)

    @property
    def ffn(self) -> nn.Module:
        """The layer's feed-forward: its MoE or its dense MLP."""
        return getattr(self, "block_sparse_moe", None) or self.mlp

    def mix(self, sources: list[torch.Tensor], proj: nn.Linear, key: AttnResKey, norm: KimiK3RMSNorm | None
            ) -> torch.Tensor:
        """AttnRes over ``sources`` (each [N, D]) with the pseudo-query ``proj`` and key norm ``key``, the pre-norm
        ``norm`` fused (None: none): [N, D]."""
        return attn_res(self.ops["attnres"], sources, proj, key, norm)

    def forward(self, blocks: list[torch.Tensor], partial: torch.Tensor | None, rows: Rows
                ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Block AttnRes: ``blocks`` the completed block sums (block 0 the embedding), ``partial`` the current
        block's running sum (None at a block's first layer) -> both after this layer."""
        h = self.mix(blocks + ([partial] if partial is not None else []), self.self_attention_res_proj,
                     self.self_attention_res_norm, self.input_layernorm)
        attended = self.self_attn(h, rows)
        partial = attended if partial is None else partial + attended
        h = self.mix(blocks + [partial], self.mlp_res_proj, self.mlp_res_norm, self.post_attention_layernorm)
        return blocks, partial + self.ffn(h)

    def residual_forward(self, x: torch.Tensor, rows: Rows) -> torch.Tensor:
        """The plain pre-norm residual layer: x + attn(norm(x)), then + ffn(norm(.))."""
        x = x + self.self_attn(self.input_layernorm(x), rows)
        return x + self.ffn(self.post_attention_layernorm(x))


def attn_res(op: Callable, sources: list[torch.Tensor], proj: nn.Linear, key: AttnResKey,
             norm: KimiK3RMSNorm | None) -> torch.Tensor:
    """One AttnRes call through the attnres block: K3's logits carry no scale factor (scale 1), its values are the
    raw sources; the key norm's eps serves the fused output norm too (both rms_norm_eps in K3)."""
    h, _ = op(torch.stack(sources), proj.weight[0], key.weight, None if norm is None else norm.weight,
              key.variance_epsilon, 1.0)
    return h


class KimiK3TextModel(OpsModule):
    """embed_tokens, the decoder layers, the final AttnRes (output_attn_res_proj, output_attn_res_norm) and norm
    (applied by the head, after MTP has read the hidden state)."""

    TRAINING = ("attnres",)

    def __init__(self, config: KimiK3Config):
        super().__init__()
        d = config.hidden_size
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, d)
        self.attn_res_block_size = config.attn_res_block_size
        attn_res = self.attn_res_block_size is not None
        self.layers = nn.ModuleList(KimiK3DecoderLayer(config, i, kind, attn_res)
                                    for i, kind in enumerate(config.layer_kinds))
        self.TRAINING = ("attnres",) if attn_res else ()
        if attn_res:
            self.output_attn_res_proj = _linear(d, 1)
            nn.init.zeros_(self.output_attn_res_proj.weight)
            self.output_attn_res_norm = AttnResKey(d, config.rms_norm_eps)
        self.norm = KimiK3RMSNorm(d, config.rms_norm_eps)

    def forward(self, ids: torch.Tensor, rows: Rows) -> torch.Tensor:
        """ids [N] -> the hidden state before the final norm [N, D] (after the final AttnRes)."""
        x = self.embed_tokens(ids)
        if self.attn_res_block_size is None:
            for layer in self.layers:
                x = layer.residual_forward(x, rows)
            return x
        blocks, partial = [], x
        for i, layer in enumerate(self.layers):
            if i % self.attn_res_block_size == 0:  # the running sum becomes a block (at layer 0: the embedding)
                blocks, partial = blocks + [partial], None
            blocks, partial = layer(blocks, partial, rows)
        return attn_res(self.ops["attnres"], blocks + [partial], self.output_attn_res_proj,
                        self.output_attn_res_norm, None)


def mtp_attention(config: KimiK3Config) -> str:
    """The MTP layer's attention. vLLM builds it as layer num_hidden_layers, past the KDA layer list, so full
    attention: MLA in K3; where the schedule has DSA layers (K3.1 Pro: no published code), the kind of its last full
    layer."""
    return next((kind for kind in reversed(config.layer_kinds) if kind != "K"), "M")


class KimiK3MTPLayer(OpsModule):
    """One multi-token-prediction depth (vLLM's KimiK3MultiTokenPredictorLayer): enorm, hnorm, eh_proj [D, 2D],
    mtp_block (a decoder layer without AttnRes: full attention, ``mtp_attention``, and the MoE), shared_head.norm and
    shared_head.head [V, D]."""

    def __init__(self, config: KimiK3Config, layer_idx: int):
        super().__init__()
        d = config.hidden_size
        self.enorm, self.hnorm = KimiK3RMSNorm(d, config.rms_norm_eps), KimiK3RMSNorm(d, config.rms_norm_eps)
        self.eh_proj = _linear(2 * d, d)
        self.mtp_block = KimiK3DecoderLayer(config, layer_idx, mtp_attention(config), attn_res=False)
        self.shared_head = nn.Module()
        self.shared_head.norm = KimiK3RMSNorm(d, config.rms_norm_eps)
        self.shared_head.head = _linear(d, config.vocab_size)

    def forward(self, next_embeds: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor, rows: Rows
                ) -> torch.Tensor:
        """next_embeds [N, D] (the embedding of each position's next token), positions [N], hidden [N, D] (the main
        model's state before its final norm) -> shared_head.norm of the layer's output [N, D]."""
        e = torch.where((positions == 0)[:, None], torch.zeros_like(next_embeds), next_embeds)
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(hidden)], dim=-1))
        return self.shared_head.norm(self.mtp_block.residual_forward(x, rows))


@dataclass
class KimiK3Output:
    """What a forward returns: logits [B, T, V] (zeros at padded positions), the loss (with labels), the cache."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    past_key_values: KimiK3Cache | None = None


@dataclass
class GenerateOutput:
    """What ``generate`` returns with return_dict_in_generate: the prompts and new tokens [B, P + new], and each
    step's logits ([B, V] per new token)."""

    sequences: torch.Tensor
    logits: tuple[torch.Tensor, ...]


class KimiK3ForCausalLM(OpsModule):
    """The text model and its untied lm_head [V, D] (the head applies model.norm first, as vLLM's compute_logits
    does), and ``num_nextn_predict_layers`` MTP depths (``mtp``; vLLM's KimiK3MTP model, here beside the main one).

    forward(input_ids [B, T], attention_mask, labels, past_key_values, use_cache) -> KimiK3Output, as a transformers
    causal LM answers (the loss: mean cross-entropy of labels shifted by one). Without a cache and without padding it
    trains (every block's training form); with a cache, or padding, it serves (module docstring).
    For the replays: ``hidden``, ``loss`` (the loss block, never the [N, V] logits) and ``logprobs``."""

    def __init__(self, config: KimiK3Config, loss_block: str = "vocab_blockwise_ce"):
        super().__init__()
        self.config = config
        self.loss_block = loss_block  # the replays' loss head: vocab_blockwise_ce or seq_chunked_ce
        self.TRAINING = (loss_block,)
        self.model = KimiK3TextModel(config)
        self.lm_head = _linear(config.hidden_size, config.vocab_size)
        self.model.apply(self._init)
        self.lm_head.apply(self._init)
        first = config.num_hidden_layers  # the MTP depths drawn last: the main model starts alike with or without
        self.mtp = nn.ModuleList(KimiK3MTPLayer(config, first + i) for i in range(config.num_nextn_predict_layers))
        self.mtp.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        """Projections N(0, 1/in) (the AttnRes pseudo-queries stay zero: the uniform average), the embedding
        N(0, 1)."""
        if isinstance(module, nn.Linear) and module.weight.shape[0] > 1:
            nn.init.normal_(module.weight, std=module.weight.shape[1] ** -0.5)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=1.0)

    def use_ops(self, ops: dict[str, Callable]) -> None:
        """Every module computes its blocks with ``ops`` (one table for the whole model: the replay's choice)."""
        for module in self.modules():
            if isinstance(module, OpsModule):
                module.ops = ops

    def add_lora(self, rank: int, alpha: float, seed: int) -> dict[str, nn.Parameter]:
        """Freeze every parameter and adapt every projection named in LORA_TARGETS (LoRALinear, its adapters drawn
        from ``seed``, computing with this model's ops); returns the adapters by name ("<projection>.lora_a" /
        ".lora_b")."""
        for param in self.parameters():
            param.requires_grad_(False)
        g = torch.Generator().manual_seed(seed)
        targets = [(name, module) for name, module in self.named_modules()
                   if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in LORA_TARGETS]
        adapters = {}
        for name, linear in targets:
            parent, _, child = name.rpartition(".")
            lora = LoRALinear(linear, rank, alpha, g)
            lora.ops = self.ops
            setattr(self.get_submodule(parent), child, lora)
            adapters.update({f"{name}.lora_a": lora.lora_a, f"{name}.lora_b": lora.lora_b})
        return adapters

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> the final normed hidden states [B*T, D] (training path)."""
        b, t = tokens.shape
        return self.model.norm(self.model(tokens.reshape(-1), Rows(b, t)))

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over every target [B, T] (-100 ignored) through the model's loss block: 0-dim float32."""
        return self.ops[self.loss_block](self.hidden(tokens), self.lm_head.weight, targets.reshape(-1), -100, "mean")

    def logprobs(self, tokens: torch.Tensor) -> torch.Tensor:
        """Log-probabilities [B*T, V] (float32) of the next token, for evaluation."""
        return torch.log_softmax(self.lm_head(self.hidden(tokens)).float(), dim=-1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, past_key_values: KimiK3Cache | None = None,
                use_cache: bool = False, **_: object) -> KimiK3Output:
        b, t = input_ids.shape
        padded = attention_mask is not None and not bool(attention_mask.bool().all())
        if past_key_values is None and not use_cache and not padded:
            h = self.model(input_ids.reshape(-1), Rows(b, t))
            logits = self.lm_head(self.model.norm(h)).view(b, t, -1)
        else:
            cache = past_key_values or KimiK3Cache(b, input_ids.device, self.lm_head.weight.dtype)
            logits = self._serve(input_ids, attention_mask, cache)
            past_key_values = cache
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        return KimiK3Output(logits, loss, past_key_values if use_cache or past_key_values is not None else None)

    def _serve(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, cache: KimiK3Cache
               ) -> torch.Tensor:
        """One serving call: the real tokens packed, the cache advanced; logits [B, T, V] at their positions."""
        b, t = input_ids.shape
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        packing = pack(mask[:, -t:], cache.seq_lens)
        cache.reserve(packing.lengths)
        rows = Rows(b, t, packing, cache)
        h = self.model(input_ids.reshape(-1)[packing.rows], rows)
        cache.advance(packing.lengths)
        logits = self.lm_head(self.model.norm(h))
        out = logits.new_zeros(b * t, logits.shape[-1])
        out[packing.rows] = logits
        return out.view(b, t, -1)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, max_new_tokens: int = 16,
                 do_sample: bool = False, pad_token_id: int = 0, return_dict_in_generate: bool = False,
                 output_logits: bool = False, **_: object) -> torch.Tensor | GenerateOutput:
        """Greedy decoding over the cache (transformers' generate() signature, greedy only): the prompts [B, P]
        (left padding marked by attention_mask) prefilled once, then one decode step per new token."""
        if do_sample:
            raise ValueError("KimiK3ForCausalLM.generate decodes greedily (do_sample=False)")
        out = self(input_ids, attention_mask=attention_mask, use_cache=True)
        cache, steps, new = out.past_key_values, [], []
        last = out.logits[:, -1]
        for step in range(max_new_tokens):
            steps.append(last)
            new.append(last.argmax(-1))
            if step + 1 < max_new_tokens:
                last = self(new[-1][:, None], past_key_values=cache, use_cache=True).logits[:, -1]
        sequences = torch.cat([input_ids, torch.stack(new, dim=1)], dim=1) if new else input_ids
        return GenerateOutput(sequences, tuple(steps)) if return_dict_in_generate else sequences

    def mtp_hidden(self, tokens: torch.Tensor, hidden: torch.Tensor, depth: int = 0) -> torch.Tensor:
        """MTP depth ``depth`` on a training batch: tokens [B, T], hidden [B*T, D] the main model's state before its
        final norm -> shared_head.norm's output [B*(T-1), D] at positions 0 .. T-2, which predicts token i + 2."""
        b, t = tokens.shape
        next_embeds = self.model.embed_tokens(tokens[:, 1:].reshape(-1))
        positions = torch.arange(t - 1, device=tokens.device).repeat(b)
        h = hidden.view(b, t, -1)[:, :-1].reshape(b * (t - 1), -1)
        return self.mtp[depth](next_embeds, positions, h, Rows(b, t - 1))
