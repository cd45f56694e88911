"""Shared pieces of the four MoE blocks (moe_router, moe_permute, moe_grouped_gemm, moe_combine).

Routing input generation:
    routing_ids: expert ids [N, k] int64 the way a trained router hands them out: Zipf-skewed expert popularity
        (a random permutation of ranks, p_e ~ 1 / (rank + 1)^1.1), a quarter of the experts never chosen (empty
        groups), k distinct experts per token (Gumbel top-k); optionally one hot expert taken by every token, and
        optionally capacity dropping (capacity factor 1.25: slots past ceil(1.25 * N * k / E) per expert, in token
        order, are dropped and marked -1, Megatron-LM's "position" drop policy).
    permutation: the expert-major layout of those ids (stable argsort of the flat ids, dropped slots last), the
        ground truth that moe_permute computes and that moe_grouped_gemm / moe_combine take as inputs.

Comparators (the signature of workbench.numerics.compare): for discrete outputs exact equality and per-row
equality of id sets (order-insensitive); for float32-by-contract quantities of low-precision trials the float32
tolerance. Shape suites and hidden shape draws shared by moe_permute and moe_combine
(dims N, D, E, k, hot, drop).
"""

from __future__ import annotations

import math
import random

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.numerics import DEFAULT_TOLERANCES, Tolerance, compare, contract_problem

ZIPF_S = 1.1
"""Zipf exponent of expert popularity: the most popular expert gets about 3x the load of the 3rd, 10x the 10th."""
CAPACITY_FACTOR = 1.25


def routing_ids(n: int, e: int, k: int, g: torch.Generator, *, hot: bool = False, drop: bool = False
                ) -> torch.Tensor:
    """Expert ids [n, k] int64 in [0, e) (or -1 for a dropped slot), k distinct experts per token, see the module
    docstring. Needs k <= e."""
    if not 1 <= k <= e:
        raise ValueError(f"need 1 <= k <= E, got k={k}, E={e}")
    ranks = torch.randperm(e, generator=g)
    logp = -ZIPF_S * torch.log(ranks.double() + 1)
    empty = e // 4 if e - e // 4 >= k + 1 else 0  # keep enough live experts for k distinct choices
    if empty:
        logp[ranks >= e - empty] = -math.inf  # the least popular quarter is never chosen
    if hot:
        logp[ranks == 0] = math.inf  # the most popular expert is every token's first choice
    gumbel = -torch.log(-torch.log(torch.rand(n, e, generator=g, dtype=torch.float64).clamp_min(1e-300)))
    ids = torch.topk(logp + gumbel, k, dim=-1).indices  # Gumbel top-k: k distinct draws without replacement
    if drop and n > 0:
        capacity = math.ceil(CAPACITY_FACTOR * n * k / e)
        flat = ids.flatten()
        order = torch.sort(flat, stable=True).indices
        counts = torch.bincount(flat, minlength=e)
        arrival = torch.empty_like(flat)  # 0-based arrival order of each slot at its expert, in token order
        arrival[order] = torch.arange(flat.numel()) - (counts.cumsum(0) - counts)[flat[order]]
        ids = torch.where(arrival >= capacity, -1, flat).view(n, k)
    return ids.to(torch.int64)


def permutation(ids: torch.Tensor, e: int) -> dict[str, torch.Tensor]:
    """The expert-major layout of ``ids`` [N, k] (-1 = dropped), M = N*k rows:

    order [M]: flat slot index (t*k + j) of each permuted row (stable argsort, dropped slots at the end);
    token_of_row [M]: source token of each row, -1 for the tail rows that hold dropped slots;
    row_of_slot [N, k]: the row holding token t's j-th choice, -1 when dropped (TransformerEngine's row_id_map);
    counts [E]: rows per expert; offsets [E + 1]: exclusive prefix of counts, offsets[E] = number of routed rows.
    """
    n, k = ids.shape
    flat = ids.reshape(-1).to(torch.int64)
    key = torch.where(flat < 0, e, flat)
    order = torch.sort(key, stable=True).indices
    valid = flat[order] >= 0
    rows = torch.arange(flat.numel(), dtype=torch.int64, device=ids.device)
    token_of_row = torch.where(valid, order // max(k, 1), -1)
    row_of_slot = torch.full_like(flat, -1)
    row_of_slot[order[valid]] = rows[valid]
    counts = torch.bincount(flat[flat >= 0], minlength=e)[:e].to(torch.int64)
    offsets = torch.zeros(e + 1, dtype=torch.int64, device=ids.device)
    offsets[1:] = counts.cumsum(0)
    return {"order": order, "token_of_row": token_of_row, "row_of_slot": row_of_slot.view(n, k),
            "counts": counts, "offsets": offsets}


# --- comparators -------------------------------------------------------------------------------------------------


def _figures(wrong: int, total: int) -> dict:
    return {"max_abs": float(wrong), "max_rel": float(wrong) / max(total, 1), "err_ratio": float(wrong) / max(total, 1),
            "ref_err": 0.0, "bound": 0.0, "nonfinite": 0}


def compare_exact(out, truth: torch.Tensor, ref_lowp: torch.Tensor, tol: Tolerance, expect_dtype: torch.dtype
                  ) -> dict:
    """Bit-for-bit equality (integer maps and counts, and copies such as a permuted activation). max_abs: the
    number of differing elements. The reference must agree with the truth too, or the inputs were not tie-free."""
    problem = contract_problem(out, truth, expect_dtype, missing="no value returned for this quantity")
    if problem:
        return {"passed": False, "reason": problem}
    o = out.detach().cpu()
    t = truth.detach().cpu().to(o.dtype)
    same = (o == t) | (torch.isnan(o) & torch.isnan(t)) if o.is_floating_point() else o == t
    wrong = int((~same).sum())
    if wrong:
        first = tuple(int(i) for i in (~same).nonzero()[0])
        return {"passed": False, **_figures(wrong, o.numel()),
                "reason": f"{wrong} of {o.numel()} elements differ (must be exact); first at {first}: "
                          f"{o[first].item()} vs {t[first].item()}"}
    return {"passed": True, **_figures(0, o.numel())}


def compare_id_sets(out, truth: torch.Tensor, ref_lowp: torch.Tensor, tol: Tolerance, expect_dtype: torch.dtype
                    ) -> dict:
    """Per row of [N, k] ids, the same set of ids (order-insensitive; the order itself is checked through the
    weights and their gradients, which are positional). max_abs: the number of rows whose set differs."""
    problem = contract_problem(out, truth, expect_dtype, missing="no value returned for this quantity")
    if problem:
        return {"passed": False, "reason": problem}
    o = out.detach().cpu().reshape(-1, truth.shape[-1] if truth.dim() else 1).sort(-1).values
    t = truth.detach().cpu().to(out.dtype).reshape(o.shape).sort(-1).values
    bad_rows = (o != t).any(-1)
    wrong = int(bad_rows.sum())
    if wrong:
        row = int(bad_rows.nonzero()[0])
        return {"passed": False, **_figures(wrong, o.shape[0]),
                "reason": f"{wrong} of {o.shape[0]} rows select a different id set; first row {row}: "
                          f"{o[row].tolist()} vs {t[row].tolist()}"}
    return {"passed": True, **_figures(0, o.shape[0])}


def compare_float32_quantity(out, truth: torch.Tensor, ref_lowp: torch.Tensor, tol: Tolerance,
                             expect_dtype: torch.dtype) -> dict:
    """The default comparison, but a quantity that is float32 by contract in a low-precision trial (the router's
    weights, the combine's weight gradient) is held to the float32 tolerance, not to the trial dtype's: its
    reference is float32 arithmetic on the same inputs, and a float16-sized floor (rtol 1e-3) would let a kernel
    that computes it in half precision through."""
    if expect_dtype == torch.float32:
        tol = DEFAULT_TOLERANCES[torch.float32]
    return compare(out, truth, ref_lowp, tol, expect_dtype)


# --- shapes --------------------------------------------------------------------------------------------------------


def draw_routing_shape(rng: random.Random, *, n_max: int = 40, e_max: int = 16, k_max: int = 4) -> dict[str, int]:
    """N in [0, n_max] (0 and 1 a tenth of the time each), E in [1, e_max], k in [1, min(k_max, E)]."""
    u = rng.random()
    n = 0 if u < 0.1 else 1 if u < 0.2 else rng.randint(2, n_max)
    e = rng.randint(1, e_max)
    k = rng.randint(1, min(k_max, e))
    return {"N": n, "E": e, "k": k}


ROUTED_ROWS_SUITES = {
    "smoke": [
        {"N": 32, "D": 32, "E": 8, "k": 2, "hot": 0, "drop": 0},
        {"N": 16, "D": 64, "E": 16, "k": 4, "hot": 0, "drop": 0},
    ],
    # no tokens, one token, every token on one expert (k = 1), a hot expert with capacity drops on odd sizes,
    # Zipf routing with drops and many empty experts
    "edge": [
        {"N": 0, "D": 16, "E": 8, "k": 2, "hot": 0, "drop": 0},
        {"N": 1, "D": 48, "E": 4, "k": 2, "hot": 0, "drop": 0},
        {"N": 40, "D": 24, "E": 8, "k": 1, "hot": 1, "drop": 0},
        {"N": 37, "D": 40, "E": 13, "k": 3, "hot": 1, "drop": 1},
        {"N": 29, "D": 16, "E": 16, "k": 4, "hot": 0, "drop": 1},
    ],
}
"""Suites of the blocks whose inputs are N tokens of width D routed to k of E experts (moe_permute, moe_combine)."""


def routed_rows_hidden_shapes(rng: random.Random) -> list[dict[str, int]]:
    """Four draws for ROUTED_ROWS_SUITES' dims: routing sizes (k <= E), D in [16, 64], hot and drop on or off."""
    return [{"N": s["N"], "D": rng.randint(16, 64), "E": s["E"], "k": s["k"], "hot": rng.randint(0, 1),
             "drop": rng.randint(0, 1)} for s in (draw_routing_shape(rng) for _ in range(4))]


def routed_rows_found(model: ModelConfig, role: str) -> list[Found]:
    """moe_permute's and moe_combine's entry: every MoE layer moves each token's k rows at the experts' width, for a
    training step's tokens and for a decode step's (a handful of rows per expert)."""
    if not model.routed:
        return []
    return [Found(role, model.moe_layers, [{"N": n, "D": model.expert_width or model.hidden, "E": model.experts,
                                             "k": model.active, "hot": 0, "drop": 0} for n in model.step_tokens],
                  [model.experts_field, model.active_field, model.expert_width_field])]
