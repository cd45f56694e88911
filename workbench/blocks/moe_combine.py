"""moe_combine: weighted un-permute of the expert outputs back to token order (Megatron-LM moe_utils.unpermute
with probs; TransformerEngine moe_unpermute).

    out[t] = sum_j  w[t, j] * y[row_of_slot[t, j]]      over the slots j with row_of_slot[t, j] >= 0

accumulated in float32 (float64 for float64 inputs) and cast to y's dtype once; the routing weight scales the
expert's output, never its input. Dropped slots (row -1) contribute nothing and get no weight gradient.

Shapes: y [M, D] (M = N*k expert-major rows, e.g. moe_grouped_gemm's output), weights [N, k] float32 (the router's
output dtype), row_of_slot [N, k] int64 (moe_permute's map: distinct rows in [0, M), or -1); out [N, D] in y's
dtype. Gradients: y (dy[row_of_slot[t, j]] = w[t, j] * dout[t]; zero for rows no slot points at) and weights
(dw[t, j] = <dout[t], y[row_of_slot[t, j]]>, float32, held to the float32 tolerance in every trial).

Inputs: routing from workbench.blocks._moe (Zipf skew, empty experts, optional hot expert and capacity drops);
expert outputs y ~ N(0, 1) (the tail rows of dropped slots too: nothing may read them); weights as a sigmoid
router returns them: sigmoid scores of N(0, 1) logits, renormalized over the token's k slots, times 2.827.
"""

from __future__ import annotations

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._moe import (
    ROUTED_ROWS_SUITES,
    compare_float32_quantity,
    permutation,
    routed_rows_found,
    routed_rows_hidden_shapes,
    routing_ids,
)
from workbench.blocks.base import BF16, F32, I64, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype

ROUTE_SCALE = 2.827


def reference(y: torch.Tensor, weights: torch.Tensor, row_of_slot: torch.Tensor) -> torch.Tensor:
    ct = compute_dtype(y)
    n, k = row_of_slot.shape
    out = torch.zeros(n, y.shape[1], dtype=ct, device=y.device)
    for j in range(k):
        rows = row_of_slot[:, j]
        w = torch.where(rows >= 0, weights[:, j].to(ct), 0.0)
        out = out + w[:, None] * y.to(ct).index_select(0, rows.clamp(min=0))
    return out.to(y.dtype)


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """make_inputs' shapes and dtypes on the meta device (its routing is data-dependent)."""
    n, d, k = shape["N"], shape["D"], shape["k"]
    meta = {"device": "meta"}
    return {"y": torch.empty(n * k, d, dtype=dtype, **meta), "weights": torch.empty(n, k, **meta),
            "row_of_slot": torch.empty(n, k, dtype=torch.int64, **meta)}


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """y [N*k, D] ~ N(0, 1); weights [N, k] float32, renormalized sigmoid scores times 2.827; row_of_slot from
    routing_ids (with -1 for capacity-dropped slots)."""
    g = torch.Generator().manual_seed(seed)
    n, d, e, k = shape["N"], shape["D"], shape["E"], shape["k"]
    ids = routing_ids(n, e, k, g, hot=bool(shape["hot"]), drop=bool(shape["drop"]))
    row_of_slot = permutation(ids, e)["row_of_slot"]
    y = torch.randn(n * k, d, generator=g)
    s = torch.sigmoid(torch.randn(n, k, generator=g))
    weights = (s / s.sum(-1, keepdim=True) * ROUTE_SCALE).clone(memory_format=torch.contiguous_format)
    return {"y": y.to(device, dtype), "weights": weights.to(device), "row_of_slot": row_of_slot.to(device)}


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """Y [N k, D], weights [N, k] -> out [N, D]."""
    nk = s["N"] * s["k"]
    return Work(BF16 * (nk * s["D"] + s["N"] * s["D"]) + (F32 + I64) * nk, vector_flops=2 * nk * s["D"]), \
        Work(BF16 * (s["N"] * s["D"] + 2 * nk * s["D"]) + (2 * F32 + I64) * nk, vector_flops=4 * nk * s["D"])


def onboard(model: ModelConfig) -> list[Found]:
    """Every MoE layer."""
    return routed_rows_found(model, "weighted unpermute back to token order")


SPEC = BlockSpec(
    name="moe_combine",
    family="moe",
    summary="weighted per-token sum of its k expert-output rows, float32 accumulation, deterministic",
    reference=reference,
    make_inputs=make_inputs,
    abstract_inputs=abstract_inputs,
    grad_inputs=("y", "weights"),
    outputs=("out",),
    shapes=ROUTED_ROWS_SUITES,
    comparators={"grad:weights": compare_float32_quantity},
    hidden_shapes=routed_rows_hidden_shapes,
    work=work,
    onboard=onboard,
    replay="moe",
)
