"""hyper_connection_mix: the end of a hyper-connected sub-layer (mHC, Xie et al. 2026): its output y expanded into
the N residual streams by the post weights, plus the residual streams mixed by comb (transformers'
``Glm5NextTextDecoderLayer`` and ``DeepseekV4DecoderLayer``, after each sub-layer; the weights come from
hyper_connection):

    out[n] = post[n] * y + sum_m comb[m, n] * residual[m]

computed in float32 (float64 for float64 inputs) and rounded once to the residual's dtype. The layers cast post and
comb to the residual's dtype first and round the product and the sum apart (two roundings more in bfloat16; equal in
float32).

Shapes: y [T, D], residual [T, N, D], post [T, N], comb [T, N, N] -> out [T, N, D].
Gradients: y, residual, post, comb.
Inputs: streams sharing a few massive channels, post in (0, 2) and a doubly stochastic comb (hyper_connection's
ranges), a sub-layer output of unit scale.
"""

from __future__ import annotations

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, F32, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def reference(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    ct = compute_dtype(residual)
    out = post.to(ct).unsqueeze(-1) * y.to(ct).unsqueeze(-2) + comb.to(ct).transpose(-1, -2) @ residual.to(ct)
    return out.to(residual.dtype)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """y [T, D] ~ N(0, 1); residual [T, N, D] ~ N(0, 1) with max(1, D // 64) shared channels of magnitude 20-60;
    post = 2 sigmoid(N(0, 1)); comb: a row softmax of N(0, 1) logits, then 20 Sinkhorn rounds (doubly stochastic);
    post and comb float32, as hyper_connection returns them."""
    g = torch.Generator().manual_seed(seed)
    t, n, d = shape["T"], shape["N"], shape["D"]
    y = torch.randn(t, d, generator=g)
    residual = torch.randn(t, n, d, generator=g)
    outliers = torch.randperm(d, generator=g)[: max(1, d // 64)]
    residual[..., outliers] *= 20 + 40 * torch.rand(len(outliers), generator=g)
    post = 2 * torch.sigmoid(torch.randn(t, n, generator=g))
    comb = torch.softmax(torch.randn(t, n, n, generator=g), dim=-1)
    for _ in range(20):
        comb = comb / comb.sum(dim=-2, keepdim=True)
        comb = comb / comb.sum(dim=-1, keepdim=True)
    weights = torch.float64 if dtype == torch.float64 else torch.float32
    return {"y": y.to(device, dtype), "residual": residual.to(device, dtype), "post": post.to(device, weights),
            "comb": comb.to(device, weights)}


SHAPES = {
    "smoke": [{"T": 8, "N": 4, "D": 64}, {"T": 19, "N": 4, "D": 96}],
    # one token, one to three streams, widths off the tiles, a row over several column tiles
    "edge": [{"T": 1, "N": 4, "D": 40}, {"T": 5, "N": 2, "D": 33}, {"T": 33, "N": 3, "D": 72},
             {"T": 3, "N": 1, "D": 16}, {"T": 17, "N": 4, "D": 200}, {"T": 6, "N": 4, "D": 1100}],
}


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """Forward: y and the N residual streams read, N streams written; backward: dout, y and the residual read, dy
    and dresidual written, post's and comb's gradients reduced over D."""
    t, n, d = s["T"], s["N"], s["D"]
    tnd, td, small = t * n * d, t * d, F32 * t * n * (n + 1)
    return (Work(BF16 * (2 * tnd + td) + small, vector_flops=2 * tnd * (n + 1)),
            Work(BF16 * (3 * tnd + 2 * td) + 2 * small, vector_flops=4 * tnd * (n + 1)))


def onboard(model: ModelConfig) -> list[Found]:
    """After both sub-layers of every layer of a config with hc_mult streams and Sinkhorn rounds (GLM-5-Next,
    DeepSeek-V4; hyper_connection's rule names HY-V4's form)."""
    streams, streams_field = model.integer("hc_mult")
    iters, _ = model.integer("hc_sinkhorn_iters")
    if not streams or streams < 2 or not iters:
        return []
    return [Found(f"hyper-connections: each sub-layer's output expanded into {streams} residual streams and the "
                  "streams mixed", model.layers, [{"T": model.tokens, "N": streams, "D": model.hidden, "calls": 2}],
                  [streams_field, model.hidden_field])]


SPEC = BlockSpec(
    name="hyper_connection_mix",
    family="residual",
    summary="mHC's expand and mix: post-weighted sub-layer output into N residual streams plus the comb-mixed streams",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("y", "residual", "post", "comb"),
    outputs=("out",),
    shapes=SHAPES,
    work=work,
    onboard=onboard,
)
