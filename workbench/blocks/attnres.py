"""attnres: Attention Residuals, a softmax over depth of earlier residual sources (arXiv 2603.15031;
fla/ops/attnres/naive.py).

Each sub-layer mixes the L residual sources v_1..v_L (the embedding and the earlier block outputs) with one learned
pseudo-query w [D] (zero init = the uniform average):

    k_i = RMSNorm(v_i) * g = v_i / sqrt(mean(v_i^2) + eps) * g      keys, g: key-norm weight [D]
    p   = softmax_i(scale * k_i . w)                                 softmax over depth, per token
    h   = sum_i p_i v_i                                              values are the raw sources
    h   = sum_i p_i v_i / sqrt(mean(v_i^2) + eps)                    or, normalized_values, the RMS-normalised
                                                                     sources (unweighted: Inkling2's
                                                                     BlockAttentionResidual, with g = 1)
    h   = RMSNorm(h) * g_out                                         optional, fused (out_weight None: skipped)

All math in float32 (float64 for float64 inputs), one downcast of h and of p at the end. The same eps serves both
norms.

Shapes: sources [L, N, D] (N tokens), query [D], key_weight [D], out_weight [D] or None -> h [N, D], p [L, N];
shape dim ``vnorm`` 1 sets normalized_values.
Gradients: sources, query, key_weight, out_weight (both outputs are differentiable: dp flows into the softmax).
Inputs: sources of different magnitudes across depth (the residual stream grows with depth) sharing a few massive
activation channels, so a kernel that accumulates sum(v^2) in float16 overflows as it would on a real model; a trained
(non-zero) query with scale = 1/sqrt(D), so the logits spread over a few units and the softmax is neither one-hot
nor uniform.
"""

from __future__ import annotations

import collections
import math

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def _rms_norm(x: torch.Tensor, weight: torch.Tensor | float, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def reference(sources: torch.Tensor, query: torch.Tensor, key_weight: torch.Tensor, out_weight: torch.Tensor | None,
              eps: float, scale: float, normalized_values: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    ct = compute_dtype(sources)
    v = sources.to(ct)                                             # [L, N, D]
    k = _rms_norm(v, key_weight.to(ct), eps)                       # [L, N, D]
    logits = (k * query.to(ct)).sum(dim=-1) * scale                # [L, N]
    p = torch.softmax(logits, dim=0)                               # over depth
    values = _rms_norm(v, 1.0, eps) if normalized_values else v
    h = (p.unsqueeze(-1) * values).sum(dim=0)                      # [N, D]
    if out_weight is not None:
        h = _rms_norm(h, out_weight.to(ct), eps)
    return h.to(sources.dtype), p.to(sources.dtype)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """sources [L, N, D]: source i ~ N(0, s_i^2) with s_i log-uniform in [0.5, 4], and max(1, D // 64) channels shared
    by all sources scaled by 10-40 (massive activations); query [D] ~ N(0, 4) with scale = 1/sqrt(D) (logits of a few
    units); key_weight, out_weight [D] ~ 1 + N(0, 0.1); out_weight None when shape["norm"] == 0; eps 1e-6."""
    g = torch.Generator().manual_seed(seed)
    n_src, n, d = shape["L"], shape["N"], shape["D"]
    depth_scale = torch.exp(math.log(0.5) + math.log(8.0) * torch.rand(n_src, 1, 1, generator=g))
    sources = torch.randn(n_src, n, d, generator=g) * depth_scale
    outliers = torch.randperm(d, generator=g)[: max(1, d // 64)]
    sources[..., outliers] *= 10 + 30 * torch.rand(len(outliers), generator=g)
    query = 2 * torch.randn(d, generator=g)
    key_weight = 1 + 0.1 * torch.randn(d, generator=g)
    out_weight = 1 + 0.1 * torch.randn(d, generator=g)
    return {
        "sources": sources.to(device, dtype),
        "query": query.to(device, dtype),
        "key_weight": key_weight.to(device, dtype),
        "out_weight": out_weight.to(device, dtype) if shape.get("norm", 1) else None,
        "eps": 1e-6,
        "scale": 1.0 / math.sqrt(d),
        "normalized_values": bool(shape.get("vnorm", 0)),
    }


SHAPES = {
    # norm: 1 fuses the output RMSNorm (out_weight given), 0 returns the plain mixture (out_weight None)
    "smoke": [{"L": 4, "N": 4, "D": 64, "norm": 0}, {"L": 3, "N": 8, "D": 128, "norm": 1},
              {"L": 5, "N": 4, "D": 48, "norm": 0, "vnorm": 1}],  # Inkling2: normalised values
    # one source (p = 1), one token, a width of three, non-power-of-two depths and widths, the model's depth (12)
    "edge": [
        {"L": 1, "N": 3, "D": 33, "norm": 1},
        {"L": 5, "N": 1, "D": 3, "norm": 0},
        {"L": 12, "N": 2, "D": 200, "norm": 1},
        {"L": 7, "N": 3, "D": 1000, "norm": 0},
        {"L": 2, "N": 5, "D": 123, "norm": 1},
        {"L": 1, "N": 2, "D": 20, "norm": 1, "vnorm": 1},
        {"L": 9, "N": 3, "D": 200, "norm": 1, "vnorm": 1},
    ],
}


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """Sources [L, N, D] -> h [N, D], p [N, L]: a softmax over L of the sources' scores, their mix."""
    lnd, nd, nl = s["L"] * s["N"] * s["D"], s["N"] * s["D"], s["N"] * s["L"]
    return Work(BF16 * (lnd + nd + nl), vector_flops=4 * lnd), \
        Work(BF16 * (2 * lnd + nd + nl), vector_flops=8 * lnd)


def block_sources(layers: int, block_size: int) -> tuple[collections.Counter[int], int]:
    """How many sources each AttnRes call of Block AttnRes mixes (Kimi K3's grouping, vLLM's ``KimiDecoderLayer``):
    ({sources: sub-layer calls}, sources of the final AttnRes). Before layer l's attention the completed blocks are
    the embedding and the sums of layers 0 .. S * floor(l / S) - 1 in blocks of S, plus the current block's partial
    sum unless l starts a block; before its MLP, the blocks and the partial sum with the attention's output in it;
    the final one mixes every completed block and the last partial sum."""
    calls: collections.Counter[int] = collections.Counter()
    for layer in range(layers):
        completed = layer // block_size + 1
        calls[completed if layer % block_size == 0 else completed + 1] += 1  # attention
        calls[completed + 1] += 1  # MLP
    return calls, (layers - 1) // block_size + 2


def onboard(model: ModelConfig) -> list[Found]:
    """Block AttnRes in every layer of a config with attn_res_block_size: one shape per number of sources a call
    mixes, with the number of such calls (``calls``) and the pre-norm fused (``norm`` 1), and the final AttnRes
    before the output norm (``norm`` 0)."""
    size, size_field = model.integer("attn_res_block_size")
    if not size:
        return []
    calls, final = block_sources(model.layers, size)
    shapes = [{"L": sources, "N": model.tokens, "D": model.hidden, "norm": 1, "calls": count}
              for sources, count in sorted(calls.items())]
    return [Found(f"Block AttnRes before each sub-layer (blocks of {size} layers; 1 to {max(calls)} sources, "
                  f"{_mean(calls, final):.1f} on average) and before the output norm", model.layers,
                  shapes + [{"L": final, "N": model.tokens, "D": model.hidden, "norm": 0, "calls": 1}],
                  [size_field, model.hidden_field])]


def _mean(calls: collections.Counter[int], final: int) -> float:
    return (sum(sources * count for sources, count in calls.items()) + final) / (sum(calls.values()) + 1)


SPEC = BlockSpec(
    name="attnres",
    family="residual",
    summary="softmax-over-depth mixing of residual sources (raw or RMS-normalised values) with RMSNorm keys, "
            "optional fused output RMSNorm",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("sources", "query", "key_weight", "out_weight"),
    outputs=("h", "p"),
    shapes=SHAPES,
    work=work,
    onboard=onboard,
    replay="layer",
)
