"""moe_permute: token rows to expert-major order (Megatron-LM moe_utils.permute; TransformerEngine moe_permute).

    order        = stable_argsort(where(ids < 0, E, ids).flatten())   # [M], M = N*k; dropped slots (-1) last
    token_of_row = order // k          (-1 for rows holding a dropped slot)
    x_perm[r]    = x[token_of_row[r]]  (zeros for those rows)          # a copy: exact
    row_of_slot[t, j] = the row r with order[r] == t*k + j  (-1 when dropped)   # TransformerEngine's row_id_map
    counts[e]    = #{(t, j): ids[t, j] == e};   offsets = [0, cumsum(counts)]  (offsets[E] = routed rows)

Rows of one expert are contiguous and keep token order (the sort is stable), which is what a grouped GEMM over
offsets and a per-token combine (via row_of_slot) need.

Shapes: x [N, D]; expert_ids [N, k] int64 in [0, E) or -1 (dropped by capacity), k distinct experts per token;
num_experts E. Outputs x_perm [N*k, D] (x's dtype), token_of_row [N*k] int64, row_of_slot [N, k] int64,
counts [E] int64, offsets [E + 1] int64. Gradient: x only, dx[t] = sum_j dx_perm[row_of_slot[t, j]] (a per-token
gather of its k rows, summed in float32). Every output but the gradient is compared exactly.

Inputs: Zipf-skewed routing with a quarter of the experts empty (workbench.blocks._moe.routing_ids); shape dims
``hot`` (every token's first choice is one expert; with k = 1 all tokens land on it) and ``drop`` (capacity
factor 1.25: overflow slots are dropped as -1).
"""

from __future__ import annotations

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._moe import (
    ROUTED_ROWS_SUITES,
    compare_exact,
    permutation,
    routed_rows_found,
    routed_rows_hidden_shapes,
    routing_ids,
)
from workbench.blocks.base import BF16, I64, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def reference(x: torch.Tensor, expert_ids: torch.Tensor, num_experts: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    p = permutation(expert_ids, num_experts)
    tok = p["token_of_row"]
    kept = (tok >= 0).to(compute_dtype(x))[:, None]
    x_perm = x.to(compute_dtype(x)).index_select(0, tok.clamp(min=0)) * kept
    return x_perm.to(x.dtype), tok, p["row_of_slot"], p["counts"], p["offsets"]


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [N, D] ~ N(0, 1); expert_ids from routing_ids (Zipf-skewed, empty experts, optional hot expert and
    capacity drops)."""
    g = torch.Generator().manual_seed(seed)
    n, d, e, k = shape["N"], shape["D"], shape["E"], shape["k"]
    x = torch.randn(n, d, generator=g)
    ids = routing_ids(n, e, k, g, hot=bool(shape["hot"]), drop=bool(shape["drop"]))
    return {"x": x.to(device, dtype), "expert_ids": ids.to(device), "num_experts": e}


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """X [N, D] -> x_perm [N k, D] and the index maps."""
    nk = s["N"] * s["k"]
    return Work(BF16 * (s["N"] * s["D"] + nk * s["D"]) + I64 * 3 * nk), \
        Work(BF16 * (nk * s["D"] + s["N"] * s["D"]) + I64 * nk)


def abstract_outputs(x, expert_ids, num_experts):
    """x_perm [N*k, D] in x's dtype, token_of_row [N*k], row_of_slot [N, k], counts [E], offsets [E + 1] int64: the
    library op's fake implementation (the reference's counts are data-dependent)."""
    n, k = expert_ids.shape
    index = {"dtype": torch.int64}
    return (x.new_empty(n * k, x.shape[1]), x.new_empty(n * k, **index), x.new_empty(n, k, **index),
            x.new_empty(num_experts, **index), x.new_empty(num_experts + 1, **index))


def onboard(model: ModelConfig) -> list[Found]:
    """Every MoE layer."""
    return routed_rows_found(model, "tokens to expert-major order")


SPEC = BlockSpec(
    name="moe_permute",
    family="moe",
    summary="stable expert-major permutation of token rows with row maps, counts and offsets",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x",),
    outputs=("x_perm", "token_of_row", "row_of_slot", "counts", "offsets"),
    shapes=ROUTED_ROWS_SUITES,
    comparators={f"forward:{name}": compare_exact
                 for name in ("x_perm", "token_of_row", "row_of_slot", "counts", "offsets")},
    hidden_shapes=routed_rows_hidden_shapes,
    work=work,
    abstract_outputs=abstract_outputs,
    onboard=onboard,
    replay="moe",
)
