"""hyper_connection: manifold-constrained hyper-connections (mHC, Xie et al. 2026), the weights and the collapse of
``hc_mult`` residual streams before each sub-layer (transformers' ``Glm5NextTextHyperConnection`` and
``DeepseekV4HyperConnection``, the same forward):

    n        = x_flat / sqrt(mean(x_flat^2) + norm_eps)             x_flat [N * D]: the token's N streams, unweighted
    m        = fn @ n                                               [(2 + N) N]: pre, post and comb logits
    pre      = sigmoid(m_pre * s0 + b_pre) + hc_eps                 [N]
    post     = 2 * sigmoid(m_post * s1 + b_post)                    [N]
    comb     = softmax_rows(m_comb * s2 + b_comb) + hc_eps          [N, N], then Sinkhorn-Knopp: a column
               normalisation, then iters - 1 rounds of rows and columns, each c / (sum + hc_eps)
    collapsed = sum_n pre_n x_n                                     [D]: the sub-layer's input

All math in float32 (float64 for float64 inputs); post and comb are returned in that dtype, collapsed in x's dtype
(one rounding), as the module does. The layer then expands the sub-layer's output y back into N streams:
``post_n * y + sum_m comb[m, n] x_m``.

Shapes: x [T, N, D]; fn [(2 + N) N, N D]; base [(2 + N) N]; scale [3] -> post [T, N], comb [T, N, N],
collapsed [T, D]. Gradients: x, fn, base, scale (all three outputs are differentiable).
Inputs: streams sharing a few massive activation channels (as real residual streams do), logits of a few units
(fn's rows of norm ~2), so the sigmoids and the row softmax are neither saturated nor uniform.
"""

from __future__ import annotations

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, F32, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def reference(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, norm_eps: float,
              hc_eps: float, sinkhorn_iters: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ct = compute_dtype(x)
    n = x.shape[-2]
    xf = x.to(ct)
    flat = xf.flatten(-2)
    mixes = (flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)) @ fn.to(ct).T
    pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = base.to(ct).split([n, n, n * n])
    pre_s, post_s, comb_s = scale.to(ct).unbind(0)
    pre = torch.sigmoid(pre_w * pre_s + pre_b) + hc_eps
    post = 2 * torch.sigmoid(post_w * post_s + post_b)
    comb = torch.softmax(comb_w.unflatten(-1, (n, n)) * comb_s + comb_b.view(n, n), dim=-1) + hc_eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    collapsed = (pre.unsqueeze(-1) * xf).sum(dim=-2)
    return post, comb, collapsed.to(x.dtype)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [T, N, D] ~ N(0, 1) with max(1, D // 64) channels of magnitude 20-60 shared by the streams; fn ~ N(0, 4 / ND)
    (logits ~ N(0, 4)); base ~ N(0, 0.25); scale ~ U(0.5, 1.5); norm_eps 1e-5, hc_eps 1e-6, shape["iters"] rounds."""
    g = torch.Generator().manual_seed(seed)
    t, n, d = shape["T"], shape["N"], shape["D"]
    x = torch.randn(t, n, d, generator=g)
    outliers = torch.randperm(d, generator=g)[: max(1, d // 64)]
    x[..., outliers] *= 20 + 40 * torch.rand(len(outliers), generator=g)
    m = (2 + n) * n
    fn = torch.randn(m, n * d, generator=g) * (2.0 / (n * d) ** 0.5)
    base = 0.5 * torch.randn(m, generator=g)
    scale = 0.5 + torch.rand(3, generator=g)
    return {"x": x.to(device, dtype), "fn": fn.to(device, dtype), "base": base.to(device, dtype),
            "scale": scale.to(device, dtype), "norm_eps": 1e-5, "hc_eps": 1e-6, "sinkhorn_iters": shape["iters"]}


SHAPES = {
    # GLM-5-Next's and DeepSeek-V4's 4 streams and 20 rounds at small widths
    "smoke": [{"T": 8, "N": 4, "D": 64, "iters": 20}, {"T": 19, "N": 4, "D": 96, "iters": 20}],
    # one token, one round, two and three streams, widths off the tiles, one stream (a plain residual)
    "edge": [
        {"T": 1, "N": 4, "D": 40, "iters": 20},
        {"T": 5, "N": 2, "D": 33, "iters": 1},
        {"T": 33, "N": 3, "D": 72, "iters": 5},
        {"T": 3, "N": 1, "D": 16, "iters": 3},
        {"T": 17, "N": 4, "D": 200, "iters": 20},
    ],
}


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """x [T, N, D] read twice (the projection, the collapse), fn [(2 + N) N, ND] once; the backward reads x three
    times, the upstream collapsed grad twice and writes dx and dfn; the Sinkhorn rounds are vector work."""
    t, n, d = s["T"], s["N"], s["D"]
    m, tnd, td = (2 + n) * n, s["T"] * s["N"] * s["D"], s["T"] * s["D"]
    sinkhorn = 6 * t * n * n * s["iters"]
    fwd = Work(BF16 * (2 * tnd + m * n * d + td) + F32 * t * (m + 1),
               tensor_flops=2 * t * m * n * d, vector_flops=3 * tnd + sinkhorn)
    bwd = Work(BF16 * (4 * tnd + 2 * m * n * d + 2 * td) + F32 * 2 * t * (m + 1),
               tensor_flops=6 * t * m * n * d, vector_flops=6 * tnd + s["iters"] * sinkhorn)
    return fwd, bwd


def onboard(model: ModelConfig) -> list[Found]:
    """Hyper-connections around both sub-layers of every layer of a config with hc_mult streams (GLM-5-Next,
    DeepSeek-V4): the model's tokens, its streams, hidden size and Sinkhorn rounds. A config with streams and no
    Sinkhorn rounds (HY-V4's pre/post-only form) is another variant, named."""
    streams, streams_field = model.integer("hc_mult")
    if not streams or streams < 2:
        return []
    iters, iters_field = model.integer("hc_sinkhorn_iters")
    shape = {"T": model.tokens, "N": streams, "D": model.hidden, "iters": iters or 1, "calls": 2}
    if not iters:
        return [Found(f"hyper-connections of {streams} residual streams", model.layers, [shape],
                      [streams_field, model.hidden_field],
                      differs="no hc_sinkhorn_iters: pre and post weights only (HY-V4's form), no Sinkhorn-normalised "
                              "comb")]
    return [Found(f"hyper-connections: the weights and collapse of {streams} residual streams before each "
                  f"sub-layer ({iters} Sinkhorn rounds)", model.layers, [shape],
                  [streams_field, iters_field, model.hidden_field])]


SPEC = BlockSpec(
    name="hyper_connection",
    family="residual",
    summary="mHC: RMS-normalised projection of N residual streams to sigmoid pre/post weights and a "
            "Sinkhorn-normalised N x N mixing matrix, and the pre-weighted collapse",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x", "fn", "base", "scale"),
    outputs=("post", "comb", "collapsed"),
    shapes=SHAPES,
    host_ops=("aten.sum",),  # base and scale gradients: deterministic sums of per-program partials
    work=work,
    onboard=onboard,
)
