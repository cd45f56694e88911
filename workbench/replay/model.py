"""The replay model: a small model of the target architecture assembled from the block catalog.

    x_0 = embed(tokens)                                                       sources = [x_0]
    per layer (KDA or gated DSA attention), per sub-layer (attention, then MoE):
        h = rmsnorm(attnres(stack(sources)))                                  AttnRes mixing over depth, pre-norm
        sources.append(sublayer(h))
    logits head: loss = <loss block>(rmsnorm(attnres(stack(sources))), W_lm, targets)

Every catalog block is called through ``ops`` (its reference or an operator with the same signature); the glue
between blocks (projections, L2 norms of q and k, gates) is plain torch. In LoRA mode the attention projections
(q, k, v, output) and the shared expert's projections run through the lora_linear block with the base weights frozen.
Shapes: tokens, targets [B, T] int64; hidden states [B*T, D] in the preset's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from workbench.blocks.situ import BETA as SITU_BETA
from workbench.blocks.situ import LINEAR_BETA as SITU_LINEAR_BETA
from workbench.replay.presets import Preset

EPS = 1e-6
GATE_NORMALIZER = 16.0  # KDA log-decay = logsigmoid(x W_g) / 16 (GLA's normalizer): decays of a few percent per token
INIT_STD = 0.02


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
    """Kimi Delta Attention: q, k L2-normalized per head, per-channel log decay g, beta = sigmoid; the output is
    RMS-normed per head and gated by sigmoid(x W_og) (Kimi Linear's output gate)."""

    def __init__(self, p: Preset):
        super().__init__()
        d, hk = p.hidden, p.heads * p.head_dim
        self.heads, self.head_dim = p.heads, p.head_dim
        self.q, self.k, self.v, self.o = Projection(d, hk), Projection(d, hk), Projection(d, hk), Projection(hk, d)
        self.w_gate = _param(hk, d, std=1 / math.sqrt(d))
        self.w_beta = _param(p.heads, d, std=1 / math.sqrt(d))
        self.w_out_gate = _param(hk, d, std=1 / math.sqrt(d))
        self.o_norm = _param(p.head_dim, fill=1.0)

    def forward(self, x: torch.Tensor, batch: int, ops: dict[str, Callable]) -> torch.Tensor:
        n, _ = x.shape
        shape = (batch, n // batch, self.heads, self.head_dim)
        q = F.normalize(self.q(x, ops).view(shape), dim=-1)
        k = F.normalize(self.k(x, ops).view(shape), dim=-1)
        v = self.v(x, ops).view(shape)
        g = F.logsigmoid(x @ self.w_gate.T).view(shape) / GATE_NORMALIZER
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


class MoE(nn.Module):
    """Sigmoid top-k routing with an aux-loss-free selection bias (a buffer, updated by the trainer), permute,
    grouped SwiGLU experts, weighted combine; plus one shared SwiGLU expert through the swiglu block."""

    def __init__(self, p: Preset):
        super().__init__()
        d, f, e = p.hidden, p.expert_ffn, p.experts
        self.experts, self.active, self.route_scale = e, p.active, p.route_scale
        self.router = _param(e, d, std=1 / math.sqrt(d))
        self.register_buffer("bias", torch.zeros(e, dtype=torch.float32))
        self.w1, self.w3 = _param(e, f, d, std=1 / math.sqrt(d)), _param(e, f, d, std=1 / math.sqrt(d))
        self.w2 = _param(e, d, f, std=1 / math.sqrt(f))
        self.shared_gate, self.shared_up, self.shared_down = Projection(d, f), Projection(d, f), Projection(f, d)
        self.last_counts: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, ops: dict[str, Callable]) -> torch.Tensor:
        weights, ids, counts = ops["moe_router"](x, self.router, self.bias, self.active, "sigmoid", None, True,
                                                 self.route_scale)
        self.last_counts = counts.detach()
        x_perm, _token_of_row, row_of_slot, _counts, offsets = ops["moe_permute"](x, ids, self.experts)
        y = ops["moe_grouped_gemm"](x_perm, offsets, self.w1, self.w3, self.w2, "swiglu", SITU_BETA,
                                    SITU_LINEAR_BETA)
        routed = ops["moe_combine"](y, weights, row_of_slot)
        shared = ops["swiglu"](self.shared_gate(x, ops), self.shared_up(x, ops))
        return routed + self.shared_down(shared, ops)


class ReplayModel(nn.Module):
    """Token embedding, the preset's layers (attention + MoE, each behind AttnRes + RMSNorm), final AttnRes + RMSNorm,
    and the large-vocabulary loss head (W_lm [V, D], not tied)."""

    def __init__(self, p: Preset):
        super().__init__()
        self.preset = p
        self.embed = _param(p.vocab, p.hidden, std=1.0)
        attention = {"K": KDAAttention, "D": GatedDSA}
        self.attention = nn.ModuleList(attention[kind](p) for kind in p.layers)
        self.moe = nn.ModuleList(MoE(p) for _ in p.layers)
        self.mix = nn.ModuleList(AttnResNorm(p.hidden) for _ in range(2 * len(p.layers) + 1))
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
        """Freeze every parameter, attach adapters to the attention and shared-expert projections; returns them
        by name ("<projection>.lora_a" / ".lora_b")."""
        for param in self.parameters():
            param.requires_grad_(False)
        g = torch.Generator().manual_seed(seed)
        adapters = {}
        for name, module in self.named_modules():
            if isinstance(module, Projection):
                module.add_lora(rank, alpha, g)
                adapters.update({f"{name}.lora_a": module.lora_a, f"{name}.lora_b": module.lora_b})
        return adapters

    def route_counts(self) -> list[torch.Tensor]:
        return [m.last_counts for m in self.moe if m.last_counts is not None]
