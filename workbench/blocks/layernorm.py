"""layernorm: layer normalization with a learned weight and bias (torch's nn.LayerNorm, which transformers' modules
call: the DSA indexers' key norm in DeepSeek-V3.2, GLM-5 and GLM-5-Next).

    y = (x - mean(x, -1)) / sqrt(var(x, -1) + eps) * weight + bias          (var: the biased variance)

computed in float32 (float64 for float64 inputs) and cast to x.dtype once, at the end.

Shapes: x [..., N], weight [N], bias [N], y [..., N]. Gradients: x, weight and bias. With xhat the normalised row and
rstd = 1 / sqrt(var + eps):
    dx = rstd * (w*dy - mean(w*dy) - xhat * mean(xhat * w*dy)),  dweight = sum_rows(dy * xhat),  dbias = sum_rows(dy)
Inputs carry a row offset (a mean far from zero, which a kernel that does not centre gets wrong) and "massive
activations" (a few channels of magnitude 50-120, as real hidden states do).
"""

from __future__ import annotations

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._rows import ROW_SUITES
from workbench.blocks.base import BF16, F32, BlockSpec, Peer, Shape, Work
from workbench.numerics import compute_dtype


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    ct = compute_dtype(x)
    xf = x.to(ct)
    centred = xf - xf.mean(dim=-1, keepdim=True)
    y = centred * torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (y * weight.to(ct) + bias.to(ct)).to(x.dtype)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [rows, N] ~ N(offset, 1), a per-row offset ~ N(0, 4), with N // 64 outlier channels (at least one) of
    magnitude 50-120; weight [N] ~ 1 + N(0, 0.1); bias [N] ~ N(0, 0.1); eps 1e-6 (the indexers')."""
    g = torch.Generator().manual_seed(seed)
    rows, n = shape["rows"], shape["N"]
    x = torch.randn(rows, n, generator=g) + 4 * torch.randn(rows, 1, generator=g)
    outliers = torch.randperm(n, generator=g)[: max(1, n // 64)]
    x[:, outliers] = x[:, outliers].sign() * (50 + 70 * torch.rand(rows, len(outliers), generator=g))
    weight = 1 + 0.1 * torch.randn(n, generator=g)
    bias = 0.1 * torch.randn(n, generator=g)
    return {"x": x.to(device, dtype), "weight": weight.to(device, dtype), "bias": bias.to(device, dtype),
            "eps": 1e-6}


def work(s: Shape) -> tuple[Work, Work]:
    """Forward: x read, y written, weight and bias read, mean and rstd kept; backward: x and dy read, dx written,
    the weight's and bias's gradients."""
    rows, n = s["rows"], s["N"]
    return (Work(BF16 * (2 * rows * n + 2 * n) + F32 * 2 * rows, vector_flops=6 * rows * n),
            Work(BF16 * (3 * rows * n + 4 * n) + F32 * 2 * rows, vector_flops=10 * rows * n))


def liger_layernorm(x, weight, bias, eps):
    """Liger-Kernel's LayerNorm, with the reference's signature."""
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    return LigerLayerNormFunction.apply(x, weight, bias, eps)


def onboard(model: ModelConfig) -> list[Found]:
    """The DSA indexer's key norm (nn.LayerNorm over index_head_dim, in every layer with an indexer) of a config
    with index_topk."""
    topk, topk_field = model.integer("index_topk")
    dim, dim_field = model.integer("index_head_dim")
    if not model.full_layers or not topk or not dim:
        return []
    return [Found("the DSA indexer's key LayerNorm", model.full_layers, [{"rows": model.tokens, "N": dim}],
                  [topk_field, dim_field])]


SPEC = BlockSpec(
    name="layernorm",
    family="norm",
    summary="LayerNorm with weight and bias, float32 math, one downcast",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x", "weight", "bias"),
    outputs=("y",),
    shapes=ROW_SUITES,
    host_ops=("aten.sum",),  # the weight's and bias's gradients: deterministic sums of per-program partials
    work=work,
    peers=(Peer("liger", "liger_kernel", liger_layernorm),),
    onboard=onboard,
)
