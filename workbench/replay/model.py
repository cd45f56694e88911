"""The replay model: a small model of the card's architecture (workbench/replay/arch.py) assembled from the block
catalog.

    x_0 = embed(tokens)                                                       sources = [x_0]
    per layer (KDA, MLA or gated DSA attention), per sub-layer (attention, then MoE):
        h = rmsnorm(attnres(stack(sources)))                                  AttnRes mixing over depth, pre-norm
        sources.append(sublayer(h))
    logits head: loss = <loss block>(rmsnorm(attnres(stack(sources))), W_lm, targets)

Every catalog block is called through ``ops`` (its reference or an operator with the same signature); the glue
between blocks (projections, L2 norms of q and k, gates) is plain torch. In LoRA mode the attention projections
(q, k, v, output), MLA's, the latent MoE's and the shared expert's projections run through the lora_linear block with
the base weights frozen.
Shapes: tokens, targets [B, T] int64; hidden states [B*T, D] in the preset's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from workbench.blocks.kda_gate import LOWER_BOUND
from workbench.blocks.situ import BETA as SITU_BETA
from workbench.blocks.situ import LINEAR_BETA as SITU_LINEAR_BETA
from workbench.replay.arch import Architecture
from workbench.replay.presets import Preset

EPS = 1e-6
GATE_NORMALIZER = 16.0  # KDA log-decay = logsigmoid(x W_g) / 16 (GLA's normalizer): decays of a few percent per token
INIT_STD = 0.02
CONV_WIDTH = 4  # KDA's short_conv_kernel_size


def _param(*shape: int, std: float = INIT_STD, fill: float | None = None) -> nn.Parameter:
    data = torch.full(shape, fill) if fill is not None else torch.randn(*shape) * std
    return nn.Parameter(data)


class Projection(nn.Module):
    """y = x W^T, or through lora_linear (W frozen, adapters A [r, IN] and B [OUT, r]) once ``add_lora`` is called."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = _param(d_out, d_in, std=1 / math.sqrt(d_in))
        self.lora_a: nn.Parameter | None = None
        self.lora_b: nn.Parameter | None = None
        self.scaling = 0.0

    def add_lora(self, rank: int, alpha: float, generator: torch.Generator) -> None:
        """PEFT's initialization: A kaiming-uniform (bound 1/sqrt(IN)), B zero, scaling alpha / r."""
        d_out, d_in = self.weight.shape
        bound = 1 / math.sqrt(d_in)
        a = (torch.rand(rank, d_in, generator=generator) * 2 - 1) * bound
        self.lora_a = nn.Parameter(a.to(self.weight.dtype))
        self.lora_b = nn.Parameter(torch.zeros(d_out, rank, dtype=self.weight.dtype))
        self.scaling = alpha / rank
        self.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor, ops: dict[str, Callable]) -> torch.Tensor:
        if self.lora_a is None:
            return x @ self.weight.T
        return ops["lora_linear"](x, self.weight, self.lora_a, self.lora_b, self.scaling)


class AttnResNorm(nn.Module):
    """AttnRes mixing of the sources [L, N, D] with a zero-initialized pseudo-query, and the next sub-layer's RMSNorm
    fused at its end (the block's out_weight, as the model card runs it): [N, D]."""

    def __init__(self, d: int):
        super().__init__()
        self.query = _param(d, fill=0.0)
        self.key_weight = _param(d, fill=1.0)
        self.norm_weight = _param(d, fill=1.0)

    def forward(self, sources: list[torch.Tensor], ops: dict[str, Callable]) -> torch.Tensor:
        d = self.query.shape[0]
        h, _depth_weights = ops["attnres"](torch.stack(sources), self.query, self.key_weight, self.norm_weight, EPS,
                                           1 / math.sqrt(d))
        return h


class KDAAttention(nn.Module):
    """Kimi Delta Attention: q, k, v through the causal short convolution with SiLU (when the card has it), q, k
    L2-normalized per head, per-channel log decay g (the bounded full-rank gate, or logsigmoid / 16), beta = sigmoid;
    the output is RMS-normed per head and gated by sigmoid(x W_og) (Kimi Linear's output gate)."""

    def __init__(self, p: Preset, arch: Architecture):
        super().__init__()
        d, hk = p.hidden, p.heads * p.head_dim
        self.heads, self.head_dim = p.heads, p.head_dim
        self.q, self.k, self.v, self.o = Projection(d, hk), Projection(d, hk), Projection(d, hk), Projection(hk, d)
        self.w_gate = _param(hk, d, std=1 / math.sqrt(d))
        self.w_beta = _param(p.heads, d, std=1 / math.sqrt(d))
        self.w_out_gate = _param(hk, d, std=1 / math.sqrt(d))
        self.o_norm = _param(p.head_dim, fill=1.0)
        # fla's ShortConvolution: one depthwise filter per channel, Conv1d's default init (std of U(-1/2, 1/2))
        self.conv = nn.ParameterList(_param(hk, CONV_WIDTH, std=0.29) for _ in range(3)) if arch.short_conv else None
        self.lower_bound = LOWER_BOUND if arch.gate == "bounded" else None  # None: the softplus gate
        if arch.gate:  # fla's KDA gate parameters: A_log = log U(1, 16) per head, dt_bias per channel
            self.a_log = nn.Parameter(torch.log(1 + 15 * torch.rand(p.heads)))
            self.dt_bias = _param(p.heads, p.head_dim, std=0.1)
        else:
            self.a_log = self.dt_bias = None

    def _inputs(self, x: torch.Tensor, batch: int, ops: dict[str, Callable]) -> list[torch.Tensor]:
        """q, k, v [B, T, H*K]: the projections, each through its short convolution when there is one."""
        n = x.shape[0]
        qkv = [proj(x, ops).view(batch, n // batch, -1) for proj in (self.q, self.k, self.v)]
        return [ops["kda_short_conv"](t, w) for t, w in zip(qkv, self.conv, strict=True)] if self.conv else qkv

    def forward(self, x: torch.Tensor, batch: int, ops: dict[str, Callable]) -> torch.Tensor:
        n, _ = x.shape
        shape = (batch, n // batch, self.heads, self.head_dim)
        q, k, v = (t.view(shape) for t in self._inputs(x, batch, ops))
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        f = (x @ self.w_gate.T).view(shape)
        g = ops["kda_gate"](f, self.a_log, self.dt_bias, self.lower_bound) if self.a_log is not None else \
            F.logsigmoid(f) / GATE_NORMALIZER
        beta = torch.sigmoid(x @ self.w_beta.T).view(shape[:3])
        o, _state = ops["kda"](q, k, v, g, beta, self.head_dim ** -0.5, None)
        o = ops["rmsnorm"](o.reshape(-1, self.head_dim), self.o_norm, EPS).view(n, -1)
        return self.o(o * torch.sigmoid(x @ self.w_out_gate.T), ops)


class GatedDSA(nn.Module):
    """Gated DeepSeek Sparse Attention: the lightning indexer picks top-k causal keys per query (on a detached input:
    its selection takes no gradient), then attention over them with one shared kv head and a sigmoid output gate."""

    def __init__(self, p: Preset):
        super().__init__()
        d, hd = p.hidden, p.heads * p.head_dim
        self.heads, self.head_dim, self.topk = p.heads, p.head_dim, p.dsa_topk
        self.index_heads, self.index_dim = p.index_heads, p.index_dim
        self.q, self.o = Projection(d, hd), Projection(hd, d)
        self.k, self.v = Projection(d, p.head_dim), Projection(d, p.head_dim)
        self.w_gate = _param(hd, d, std=1 / math.sqrt(d))
        self.w_index_q = _param(p.index_heads * p.index_dim, d, std=1 / math.sqrt(d))
        self.w_index_k = _param(p.index_dim, d, std=1 / math.sqrt(d))
        self.w_index_w = _param(p.index_heads, d, std=1 / math.sqrt(d))

    def forward(self, x: torch.Tensor, batch: int, ops: dict[str, Callable]) -> torch.Tensor:
        n, _ = x.shape
        t = n // batch
        xd = x.detach()
        q_idx = (xd @ self.w_index_q.T).view(batch, t, self.index_heads, self.index_dim)
        k_idx = (xd @ self.w_index_k.T).view(batch, t, self.index_dim)
        w_idx = (xd @ self.w_index_w.T).view(batch, t, self.index_heads) / math.sqrt(self.index_heads * self.index_dim)
        _scores, indices = ops["dsa_indexer"](q_idx.detach(), k_idx.detach(), w_idx.detach(), self.topk)
        q = self.q(x, ops).view(batch, t, self.heads, self.head_dim)
        k = self.k(x, ops).view(batch, t, 1, self.head_dim)
        v = self.v(x, ops).view(batch, t, 1, self.head_dim)
        gate = (x @ self.w_gate.T).view(batch, t, self.heads, self.head_dim)
        o = ops["dsa_sparse_attention"](q, k, v, indices, gate, self.head_dim ** -0.5)
        return self.o(o.reshape(n, -1), ops)


class LatentAttention(nn.Module):
    """Multi-head latent attention (MLA) with Kimi's output gate: c_q = RMSNorm(x W_dq) (rank = hidden), q = c_q W_uq
    per head (nope part head_dim, rope part head_dim / 2); c_kv = RMSNorm(x W_dkv) (rank ``mla_rank``), one rope key
    x W_kr for every head, the per-head up-projections W_uk, W_uv inside the mla block; no rotary embedding."""

    def __init__(self, p: Preset):
        super().__init__()
        d, h, dn = p.hidden, p.heads, p.head_dim
        self.heads, self.dn, self.dr, self.rank = h, dn, dn // 2, p.mla_rank
        self.q_down, self.q_up = Projection(d, d), Projection(d, h * (dn + self.dr))
        self.kv_down, self.k_rope = Projection(d, self.rank), Projection(d, self.dr)
        self.q_norm, self.kv_norm = _param(d, fill=1.0), _param(self.rank, fill=1.0)
        self.w_uk = _param(h, dn, self.rank, std=1 / math.sqrt(self.rank))
        self.w_uv = _param(h, dn, self.rank, std=1 / math.sqrt(self.rank))
        self.w_gate = _param(h * dn, d, std=1 / math.sqrt(d))
        self.o = Projection(h * dn, d)

    def forward(self, x: torch.Tensor, batch: int, ops: dict[str, Callable]) -> torch.Tensor:
        n, _ = x.shape
        t = n // batch
        c_q = ops["rmsnorm"](self.q_down(x, ops), self.q_norm, EPS)
        q = self.q_up(c_q, ops).view(batch, t, self.heads, self.dn + self.dr)
        c_kv = ops["rmsnorm"](self.kv_down(x, ops), self.kv_norm, EPS).view(batch, t, self.rank)
        k_rope = self.k_rope(x, ops).view(batch, t, self.dr)
        gate = (x @ self.w_gate.T).view(batch, t, self.heads, self.dn)
        o = ops["mla"](q, c_kv, k_rope, self.w_uk, self.w_uv, gate, (self.dn + self.dr) ** -0.5)
        return self.o(o.reshape(n, -1), ops)


class MoE(nn.Module):
    """Sigmoid top-k routing with an aux-loss-free selection bias (a buffer, updated by the trainer), permute,
    grouped experts (SwiGLU or SiTU), weighted combine; in latent MoE the experts run at half the width, between a
    down projection with its RMSNorm and an up projection; plus one shared expert through the swiglu or situ block."""

    def __init__(self, p: Preset, arch: Architecture):
        super().__init__()
        d, f, e = p.hidden, p.expert_ffn, p.experts
        dx = d // 2 if arch.latent else d  # the experts' width
        self.experts, self.active, self.route_scale = e, p.active, arch.route_scale
        self.expert_act, self.shared_act = arch.experts, arch.shared
        self.router = _param(e, d, std=1 / math.sqrt(d))
        self.register_buffer("bias", torch.zeros(e, dtype=torch.float32))
        self.w1, self.w3 = _param(e, f, dx, std=1 / math.sqrt(dx)), _param(e, f, dx, std=1 / math.sqrt(dx))
        self.w2 = _param(e, dx, f, std=1 / math.sqrt(f))
        if arch.latent:
            self.down, self.up, self.latent_norm = Projection(d, dx), Projection(dx, d), _param(dx, fill=1.0)
        else:
            self.down = self.up = self.latent_norm = None
        self.shared_gate, self.shared_up, self.shared_down = Projection(d, f), Projection(d, f), Projection(f, d)
        self.last_counts: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, ops: dict[str, Callable]) -> torch.Tensor:
        weights, ids, counts = ops["moe_router"](x, self.router, self.bias, self.active, "sigmoid", None, True,
                                                 self.route_scale)
        self.last_counts = counts.detach()
        xe = ops["rmsnorm"](self.down(x, ops), self.latent_norm, EPS) if self.down is not None else x
        routed = self.routed(xe, weights, ids, ops)
        if self.up is not None:
            routed = self.up(routed, ops)
        gate, up = self.shared_gate(x, ops), self.shared_up(x, ops)
        shared = ops["swiglu"](gate, up) if self.shared_act == "swiglu" else \
            ops["situ"](torch.cat([gate, up], dim=-1), SITU_BETA, SITU_LINEAR_BETA)
        return routed + self.shared_down(shared, ops)

    def routed(self, xe: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, ops: dict[str, Callable]
               ) -> torch.Tensor:
        """The routed experts' weighted sum per token: xe [n, Dx], weights [n, k] float32, ids [n, k] -> [n, Dx].
        The step an expert-parallel layout overrides (workbench.replay.distributed.ExpertParallelMoE)."""
        x_perm, _token_of_row, row_of_slot, _counts, offsets = ops["moe_permute"](xe, ids, self.experts)
        y = ops["moe_grouped_gemm"](x_perm, offsets, self.w1, self.w3, self.w2, self.expert_act, SITU_BETA,
                                    SITU_LINEAR_BETA)
        return ops["moe_combine"](y, weights, row_of_slot)


class ReplayModel(nn.Module):
    """Token embedding, the architecture's layers (attention + MoE, each behind AttnRes + RMSNorm), final AttnRes +
    RMSNorm, and the large-vocabulary loss head (W_lm [V, D], not tied)."""

    def __init__(self, p: Preset, arch: Architecture):
        super().__init__()
        self.preset, self.arch = p, arch
        self.embed = _param(p.vocab, p.hidden, std=1.0)
        attention = {"K": lambda: KDAAttention(p, arch), "D": lambda: GatedDSA(p), "M": lambda: LatentAttention(p)}
        self.attention = nn.ModuleList(attention[kind]() for kind in arch.layers)
        self.moe = nn.ModuleList(MoE(p, arch) for _ in arch.layers)
        self.mix = nn.ModuleList(AttnResNorm(p.hidden) for _ in range(2 * len(arch.layers) + 1))
        self.lm_head = _param(p.vocab, p.hidden, std=1 / math.sqrt(p.hidden))

    def hidden(self, tokens: torch.Tensor, ops: dict[str, Callable]) -> torch.Tensor:
        """The final normed hidden states [B*T, D]."""
        batch = tokens.shape[0]
        sources = [self.embed[tokens.reshape(-1)]]
        for i, (attention, moe) in enumerate(zip(self.attention, self.moe, strict=True)):
            sources.append(attention(self.mix[2 * i](sources, ops), batch, ops))
            sources.append(moe(self.mix[2 * i + 1](sources, ops), ops))
        return self.mix[-1](sources, ops)

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor, ops: dict[str, Callable]) -> torch.Tensor:
        """Mean cross-entropy over every target token (a 0-dim float32 tensor)."""
        head = ops.get("seq_chunked_ce") or ops["vocab_blockwise_ce"]
        return head(self.hidden(tokens, ops), self.lm_head, targets.reshape(-1), -100, "mean")

    def logprobs(self, tokens: torch.Tensor, ops: dict[str, Callable]) -> torch.Tensor:
        """Log-probabilities [B*T, V] (float32) of the next token, for evaluation."""
        return torch.log_softmax((self.hidden(tokens, ops) @ self.lm_head.T).float(), dim=-1)

    def add_lora(self, rank: int, alpha: float, seed: int) -> dict[str, nn.Parameter]:
        """Freeze every parameter, attach adapters to every projection (attention, latent MoE, shared expert);
        returns them by name ("<projection>.lora_a" / ".lora_b")."""
        for param in self.parameters():
            param.requires_grad_(False)
        g = torch.Generator().manual_seed(seed)
        adapters = {}
        for name, module in self.named_modules():
            if isinstance(module, Projection):
                module.add_lora(rank, alpha, g)
                adapters.update({f"{name}.lora_a": module.lora_a, f"{name}.lora_b": module.lora_b})
        return adapters
