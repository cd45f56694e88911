"""nn.Module layers over the kernels library's ops, with constructors like torch's and Liger-Kernel's.

    RMSNorm(hidden_size, eps=1e-6)                          x [..., D] -> [..., D]            (workbench::rmsnorm)
    SiTUMLP(hidden_size, intermediate_size, beta, linear_beta) x [..., D] -> [..., D]          (workbench::situ)
    SwiGLUMLP(hidden_size, intermediate_size)               x [..., D] -> [..., D]            (workbench::swiglu)
    LinearCrossEntropyLoss(ignore_index=-100, reduction="mean", block="vocab_blockwise_ce")
        (hidden [..., D], weight [V, D], target [...] int64) -> 0-dim float32 loss   (workbench::<block>)

The MLPs hold gate_proj, up_proj and down_proj (nn.Linear without bias, the Hugging Face names); the loss takes the
unembedding weight as an argument, as Liger's LigerFusedLinearCrossEntropyLoss does, and never holds the logits.
Weights and activations share one dtype (the operators take the weight in the input's dtype).
"""

from __future__ import annotations

import torch
from torch import nn

from workbench.blocks._linear_ce import IGNORE_INDEX, REDUCTIONS
from workbench.blocks.situ import BETA, LINEAR_BETA
from workbench.kernels._ops import OPS

rmsnorm, seq_chunked_ce, situ, swiglu, vocab_blockwise_ce = (
    OPS[b] for b in ("rmsnorm", "seq_chunked_ce", "situ", "swiglu", "vocab_blockwise_ce"))

LOSS_OPS = {"vocab_blockwise_ce": vocab_blockwise_ce, "seq_chunked_ce": seq_chunked_ce}


class RMSNorm(nn.Module):
    """y = weight * x / sqrt(mean(x^2, -1) + eps), float32 math, one cast to x's dtype; weight [hidden_size] ones."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rmsnorm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class _GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        factory = {"bias": False, "device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **factory)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **factory)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **factory)


class SiTUMLP(_GatedMLP):
    """down_proj(situ([gate_proj(x) | up_proj(x)], beta, linear_beta)): Kimi K3's MLP (hidden_act "situ")."""

    def __init__(self, hidden_size: int, intermediate_size: int, beta: float = BETA, linear_beta: float = LINEAR_BETA,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__(hidden_size, intermediate_size, device, dtype)
        self.beta, self.linear_beta = beta, linear_beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = torch.cat([self.gate_proj(x), self.up_proj(x)], dim=-1)
        return self.down_proj(situ(gate_up, self.beta, self.linear_beta))


class SwiGLUMLP(_GatedMLP):
    """down_proj(silu(gate_proj(x)) * up_proj(x)): the Llama / DeepSeek MLP."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class LinearCrossEntropyLoss(nn.Module):
    """Cross-entropy of hidden @ weight^T against target without the [N, V] logits: targets equal to ignore_index
    count for nothing; "mean" divides by the number of the others (at least 1), "sum" does not."""

    def __init__(self, ignore_index: int = IGNORE_INDEX, reduction: str = "mean", block: str = "vocab_blockwise_ce"):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        if block not in LOSS_OPS:
            raise ValueError(f"block must be one of {tuple(LOSS_OPS)}, got {block!r}")
        self.ignore_index, self.reduction, self.block = ignore_index, reduction, block

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = hidden.reshape(-1, hidden.shape[-1])
        return LOSS_OPS[self.block](h, weight, target.reshape(-1), self.ignore_index, self.reduction)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, block={self.block!r}"
