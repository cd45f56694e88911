"""moe_router: token-choice top-k routing of a Mixture-of-Experts layer (DeepSeek-V3 / Kimi K2 sigmoid routing with
an aux-loss-free selection bias; DeepSeek-V4's sqrt(softplus) scores; softmax routing of Mixtral / Qwen3 /
DeepSeek-V2; Skywork-MoE gating-logit normalization).

    logits = x.float() @ W.T                                   # [N, E], float32 always (float64 for float64 inputs)
    z      = (logits - mean_e) / std_e * lambda                # Skywork normalization, only when norm_lambda is set
    s      = sigmoid(z)   or   softmax(z, over e)   or   sqrt(softplus(z))   # score_func
    sel    = s + bias                                          # the bias steers selection only
    sel    = -inf outside the topk_group best of n_group groups   # group-limited, only when n_group > 1
    ids    = topk(sel, k)                                      # sorted descending
    w      = s.gather(ids)
    w      = w / (w.sum(-1) + 1e-20)                           # when renormalize
    w      = w * route_scale
    counts = bincount(ids, E)

std is the unbiased (E - 1) standard deviation over the experts, as torch.std and Skywork's code compute it.
Group-limited routing (DeepSeek-V3's ``n_group`` / ``topk_group``, its noaux_tc method): the E experts form n_group
contiguous groups of E / n_group (at least 2); a group's score is the sum of its two best ``sel``; the topk_group best
groups stay and the top k is taken inside them. The route scale is the config's ``routed_scaling_factor``, an
argument (the modes below only give the suites a default).

Shapes: x [N, D] (any float dtype), weight [E, D] (same dtype), bias [E] float32 (DeepSeek-V3 keeps its correction
bias in float32); outputs weights [N, k] float32 (float64 for float64 inputs), ids [N, k] int64 in descending order
of s + bias, counts [E] int64. Gradients: x and weight, through the weights (ids and counts are discrete; the bias is
updated by the balancing rule below, not by gradients). The weights, float32 by contract, are held to the float32
tolerance in every trial.

Discrete outputs are verified exactly, so inputs are tie-free by construction: rows whose top-(k+1) selection
scores come closer than 1e-4 of their scale are redrawn (the role of TransformerEngine's arange-based logits).
Modes (shape dim ``mode``): 0 sigmoid + renormalize, scale 2.827 (Kimi K2 / DeepSeek-V3); 1 softmax + renormalize
(Mixtral, Qwen3); 2 softmax with Skywork normalization, lambda 1, renormalize (Skywork-MoE); 3 softmax without
renormalization, scale 16 (DeepSeek-V2); 4 sqrt(softplus) + renormalize, scale 1.5 (DeepSeek-V4's learned router;
its hash-routed first layers choose by token id, another variant). Optional shape dims: ``scale`` (the route scale,
replacing the mode's), ``G`` and ``kg`` (n_group and topk_group, default 1).

The balancing statistics a trainer needs around the router are plain torch functions here: the Switch
auxiliary loss, the router z-loss, the aux-loss-free bias update and Skywork-MoE's adaptive aux-loss coefficient.
"""

from __future__ import annotations

import math
import random

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._moe import compare_exact, compare_float32_quantity, compare_id_sets, draw_routing_shape
from workbench.blocks.base import BF16, F32, I64, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype

RENORM_EPS = 1e-20
MODES: dict[int, tuple[str, float | None, bool, float]] = {
    # mode: (score_func, norm_lambda, renormalize, route_scale)
    0: ("sigmoid", None, True, 2.827),
    1: ("softmax", None, True, 1.0),
    2: ("softmax", 1.0, True, 1.0),
    3: ("softmax", None, False, 16.0),
    4: ("sqrtsoftplus", None, True, 1.5),
}
SCORE_FUNCS = tuple(dict.fromkeys(func for func, *_ in MODES.values()))
"""The score functions the modes compute, as configs name them: sigmoid, softmax, sqrtsoftplus."""
TIE_GAP = 1e-4
"""Tie-free inputs: consecutive top-(k+1) selection scores differ by at least TIE_GAP * max|score| of the row."""


def mode_of(score_func: str, renormalize: bool) -> int | None:
    """The mode (no logit normalization) that scores with ``score_func`` and renormalizes as asked; None if none."""
    return next((m for m, (f, lam, r, _) in MODES.items() if (f, lam, r) == (score_func, None, renormalize)), None)


def scores(logits: torch.Tensor, score_func: str, norm_lambda: float | None) -> torch.Tensor:
    """Routing scores [N, E] from logits [N, E] (differentiable; same dtype as logits)."""
    z = logits
    if norm_lambda is not None and z.shape[0] > 0:  # (torch.std warns on an empty batch)
        z = (z - z.mean(-1, keepdim=True)) / z.std(-1, keepdim=True) * norm_lambda
    if score_func == "sigmoid":
        return torch.sigmoid(z)
    if score_func == "softmax":
        return torch.softmax(z, dim=-1)
    if score_func == "sqrtsoftplus":
        return torch.nn.functional.softplus(z).sqrt()
    raise ValueError(f"score_func must be 'sigmoid', 'softmax' or 'sqrtsoftplus', got {score_func!r}")


def check_groups(experts: int, topk: int, n_group: int, topk_group: int) -> None:
    """ValueError unless the E experts split into n_group groups of at least 2 and the kept groups hold k."""
    if n_group == 1:
        return
    if n_group < 1 or experts % n_group or experts // n_group < 2 or not 1 <= topk_group <= n_group \
            or topk > topk_group * (experts // n_group):
        raise ValueError(f"group-limited routing needs E % n_group == 0, E / n_group >= 2, 1 <= topk_group <= "
                         f"n_group and k <= topk_group * E / n_group; got E={experts}, k={topk}, n_group={n_group}, "
                         f"topk_group={topk_group}")


def kept_groups(sel: torch.Tensor, n_group: int, topk_group: int) -> torch.Tensor:
    """sel [N, E] selection scores -> [N, E] bool: the experts of the topk_group groups whose two best scores sum
    highest (DeepSeek-V3's noaux_tc)."""
    n, e = sel.shape
    group_scores = sel.view(n, n_group, e // n_group).topk(2, dim=-1).values.sum(-1)
    keep = torch.topk(group_scores, topk_group, dim=-1).indices
    mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
    return mask.repeat_interleave(e // n_group, dim=1)


def select(sel: torch.Tensor, topk: int, n_group: int, topk_group: int) -> torch.Tensor:
    """ids [N, k] int64: the top k of sel [N, E] in descending order, inside the kept groups when n_group > 1."""
    if n_group > 1:
        sel = sel.masked_fill(~kept_groups(sel, n_group, topk_group), float("-inf"))
    return torch.topk(sel, topk, dim=-1, sorted=True).indices


def route(logits: torch.Tensor, bias: torch.Tensor, topk: int, score_func: str, norm_lambda: float | None,
          renormalize: bool, route_scale: float, n_group: int = 1, topk_group: int = 1
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Everything after the logits [N, E] (differentiable, in their dtype): (weights [N, k], ids [N, k] int64,
    counts [E] int64), as the module docstring writes it."""
    check_groups(logits.shape[-1], topk, n_group, topk_group)
    s = scores(logits, score_func, norm_lambda)
    ids = select(s.detach() + bias.detach().to(logits.dtype), topk, n_group, topk_group)
    w = s.gather(-1, ids)
    if renormalize:
        w = w / (w.sum(-1, keepdim=True) + RENORM_EPS)
    counts = torch.bincount(ids.reshape(-1), minlength=logits.shape[-1])
    return w * route_scale, ids, counts


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, topk: int, score_func: str,
              norm_lambda: float | None, renormalize: bool, route_scale: float, n_group: int = 1,
              topk_group: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ct = compute_dtype(x)
    return route(x.to(ct) @ weight.to(ct).T, bias, topk, score_func, norm_lambda, renormalize, route_scale, n_group,
                 topk_group)


# --- inputs ------------------------------------------------------------------------------------------------------


def _close(values: torch.Tensor, count: int, scale: torch.Tensor) -> torch.Tensor:
    """Rows [N] bool whose top-``count`` values [N, M] have two within TIE_GAP * scale [N, 1] of each other."""
    top = torch.topk(values, min(count, values.shape[-1]), dim=-1).values
    if top.shape[-1] < 2:
        return torch.zeros(values.shape[0], dtype=torch.bool)
    return (top[:, :-1] - top[:, 1:] < TIE_GAP * scale).any(-1)


def near_ties(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, topk: int, score_func: str,
              norm_lambda: float | None, n_group: int = 1, topk_group: int = 1) -> torch.Tensor:
    """Rows [N] bool whose top-(k+1) selection scores (float64, inside the kept groups), or top-(kg+1) group
    scores, are not separated by TIE_GAP of their scale."""
    return near_tie_logits(x.double() @ weight.double().T, bias, topk, score_func, norm_lambda, n_group, topk_group)


def near_tie_logits(logits: torch.Tensor, bias: torch.Tensor, topk: int, score_func: str, norm_lambda: float | None,
                    n_group: int = 1, topk_group: int = 1) -> torch.Tensor:
    """near_ties from the logits [N, E] (any float dtype; judged in float64)."""
    with torch.no_grad():
        sel = scores(logits.double(), score_func, norm_lambda) + bias.double()
        scale = sel.abs().amax(-1, keepdim=True)
        bad = ~torch.isfinite(sel).all(-1)
        if n_group > 1:
            n, e = sel.shape
            group_scores = sel.view(n, n_group, e // n_group).topk(2, dim=-1).values.sum(-1)
            bad |= _close(group_scores, topk_group + 1, scale)
            sel = sel.masked_fill(~kept_groups(sel, n_group, topk_group), float("-inf"))
        return bad | _close(sel, topk + 1, scale)


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """make_inputs' shapes and dtypes on the meta device (its near-tie redraws are data-dependent)."""
    n, d, e = shape["N"], shape["D"], shape["E"]
    meta = {"device": "meta"}
    return {"x": torch.empty(n, d, dtype=dtype, **meta), "weight": torch.empty(e, d, dtype=dtype, **meta),
            "bias": torch.empty(e, **meta), **routing_args(shape)}


def routing_args(shape: Shape) -> dict:
    """The non-tensor arguments of a shape: its mode's score function, normalization and renormalization, the
    route scale (``scale``, else the mode's), the groups (``G``, ``kg``)."""
    score_func, norm_lambda, renormalize, route_scale = MODES[shape["mode"]]
    return {"topk": shape["k"], "score_func": score_func, "norm_lambda": norm_lambda, "renormalize": renormalize,
            "route_scale": float(shape.get("scale", route_scale)), "n_group": shape.get("G", 1),
            "topk_group": shape.get("kg", 1)}


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [N, D] ~ N(0, 1) plus a shared mean direction (hidden states are not centred: it skews expert popularity);
    weight [E, D] ~ N(0, 1/D) with row norms varying by up to 1.5x (some experts are hot); bias [E] float32,
    N(0, 0.05^2), scaled by 1/E for softmax scores. Near-tie rows are redrawn."""
    g = torch.Generator().manual_seed(seed)
    n, d, e, k = shape["N"], shape["D"], shape["E"], shape["k"]
    args = routing_args(shape)
    score_func, norm_lambda, groups = args["score_func"], args["norm_lambda"], (args["n_group"], args["topk_group"])
    check_groups(e, k, *groups)
    mean_dir = 0.5 * torch.randn(d, generator=g)
    weight = torch.randn(e, d, generator=g) / math.sqrt(d) * (1 + 0.5 * torch.rand(e, 1, generator=g))
    bias = 0.05 * torch.randn(e, generator=g) / (e if score_func == "softmax" else 1)
    x = torch.randn(n, d, generator=g) + mean_dir
    wc = weight.to(dtype)
    redo = torch.arange(n)
    for _ in range(200):
        bad = redo[near_ties(x[redo].to(dtype), wc, bias, k, score_func, norm_lambda, *groups)]
        if not len(bad):
            break
        x[bad] = torch.randn(len(bad), d, generator=g) + mean_dir
        redo = bad
    else:
        raise RuntimeError(f"moe_router: could not draw tie-free inputs for {dict(shape)}")
    return {"x": x.to(device, dtype), "weight": wc.to(device), "bias": bias.to(device), **args}


# --- balancing statistics (plain torch, for trainers and replays) ----------------------------------------------


def switch_aux_loss(probs: torch.Tensor, counts: torch.Tensor, topk: int, alpha: float) -> torch.Tensor:
    """Switch Transformer load-balancing loss ``alpha * E * sum_i f_i * P_i`` (Megatron-LM
    switch_load_balancing_loss_func): f_i = counts_i / (N * k) the fraction of routed slots that went to expert i,
    P_i = mean over tokens of probs[:, i]. probs [N, E] (differentiable), counts [E]. Equals alpha under uniform
    routing and uniform probabilities."""
    n, e = probs.shape
    f = counts.to(probs.dtype) / max(n * topk, 1)
    p = probs.mean(0) if n else torch.zeros_like(f)
    return alpha * e * (f * p).sum()


def z_loss(logits: torch.Tensor, coeff: float) -> torch.Tensor:
    """Router z-loss (ST-MoE): ``coeff * mean_t(logsumexp_e(logits)^2)``; logits [N, E]."""
    return coeff * torch.logsumexp(logits, dim=-1).square().mean()


def update_bias(bias: torch.Tensor, counts: torch.Tensor, gamma: float = 1e-3) -> torch.Tensor:
    """Aux-loss-free balancing (DeepSeek-V3): ``b + gamma * sign(mean(c) - c)``: overloaded experts lose selection
    bias, underloaded ones gain it. Returns a new tensor in bias's dtype."""
    c = counts.to(torch.float64)
    return bias + gamma * torch.sign(c.mean() - c).to(bias.dtype)


def adaptive_aux_coeff(coeff: float, drop_rate: float, beta: float = 0.99, xi: float = 0.2, coeff_max: float = 0.01
                       ) -> float:
    """Skywork-MoE's adaptive auxiliary-loss coefficient for the next step:
    ``beta * a + (1 - beta) * min(xi * drop_rate, a_max)`` (xi = 1/5, a_max = 0.01, beta = 0.99)."""
    return beta * coeff + (1 - beta) * min(xi * drop_rate, coeff_max)


# --- shapes ----------------------------------------------------------------------------------------------------------

SHAPES = {
    "smoke": [
        {"N": 32, "D": 32, "E": 16, "k": 4, "mode": 0},
        {"N": 24, "D": 64, "E": 8, "k": 2, "mode": 1},
        {"N": 32, "D": 32, "E": 16, "k": 4, "mode": 0, "G": 4, "kg": 2, "scale": 2.5},  # DeepSeek-V3's recipe
    ],
    # no tokens, one token with k = 1 (unnormalized: renormalizing a single weight makes it a constant without
    # gradient), Skywork normalization on odd sizes, unnormalized softmax, k = E; groups: the kept groups hold
    # exactly k experts, groups of two, one group kept, softmax scores
    "edge": [
        {"N": 0, "D": 16, "E": 8, "k": 2, "mode": 0},
        {"N": 1, "D": 16, "E": 8, "k": 1, "mode": 3},
        {"N": 37, "D": 48, "E": 12, "k": 3, "mode": 2},
        {"N": 19, "D": 24, "E": 16, "k": 4, "mode": 3},
        {"N": 5, "D": 20, "E": 3, "k": 3, "mode": 1},
        {"N": 13, "D": 20, "E": 12, "k": 6, "mode": 0, "G": 4, "kg": 2},
        {"N": 17, "D": 24, "E": 16, "k": 3, "mode": 1, "G": 8, "kg": 3},
        {"N": 9, "D": 16, "E": 12, "k": 2, "mode": 3, "G": 3, "kg": 1},
        {"N": 11, "D": 24, "E": 16, "k": 4, "mode": 4},  # DeepSeek-V4's sqrt(softplus) scores
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Four draws: routing sizes (k <= E), D in [16, 64], a mode that is not degenerate there (Skywork
    normalization needs E >= 2; with k = 1 only the unnormalized mode leaves the weight a gradient); where E splits
    into groups of at least 2 that can hold k, half the draws route group-limited."""
    out = []
    for _ in range(4):
        shape = draw_routing_shape(rng)
        e, k = shape["E"], shape["k"]
        modes = [m for m, (_, lam, renorm, _) in MODES.items() if (e >= 2 or lam is None) and (k >= 2 or not renorm)]
        out.append(with_groups(rng, {"N": shape["N"], "D": rng.randint(16, 64), "E": e, "k": k,
                                     "mode": rng.choice(modes)}))
    return out


def with_groups(rng: random.Random, draw: Shape) -> Shape:
    """``draw`` routed group-limited half the time where its E splits into groups of at least 2 that can hold k:
    ``G`` and ``kg`` drawn among those."""
    e, k = draw["E"], draw["k"]
    groups = [(g, kg) for g in range(2, e // 2 + 1) if e % g == 0 for kg in range(1, g + 1) if k <= kg * e // g]
    if groups and rng.random() < 0.5:
        draw["G"], draw["kg"] = rng.choice(groups)
    return draw


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """X [N, D], weight [E, D] -> scores, top-k."""
    n, d, e = s["N"], s["D"], s["E"]
    fwd = Work(BF16 * (n * d + e * d) + (F32 + I64) * n * s["k"], 2 * n * d * e)
    return fwd, Work(BF16 * (n * d + e * d) * 2 + F32 * n * e, 4 * n * d * e)


def abstract_outputs(x, weight, bias, topk, score_func, norm_lambda, renormalize, route_scale, n_group=1,
                     topk_group=1):
    """weights [N, k] in the compute dtype, ids [N, k] int64, counts [E] int64: the library op's fake
    implementation (the reference's selection is data-dependent)."""
    n, e = x.shape[0], weight.shape[0]
    return (x.new_empty(n, topk, dtype=compute_dtype(x)), x.new_empty(n, topk, dtype=torch.int64),
            x.new_empty(e, dtype=torch.int64))


def onboard(model: ModelConfig) -> list[Found]:
    """Every MoE layer's router, in the mode whose score function (moe_router_activation_func or scoring_func, default
    softmax) and renormalization (moe_renormalize or norm_topk_prob, default on) the config names, with its route
    scale and expert groups, at a training step's and a decode step's tokens; a score function no mode computes is
    marked ``differs``."""
    if not model.routed:
        return []
    func, func_field = model.field("moe_router_activation_func", "scoring_func")
    func = str(func or "softmax").lower()
    renorm, renorm_field = model.field("moe_renormalize", "norm_topk_prob")
    renorm = True if renorm is None else bool(renorm)  # Mixtral and the sigmoid routers renormalize the top k
    scale, scale_field = model.field("routed_scaling_factor")
    groups, groups_field = model.integer("n_group", "num_expert_group")
    kept, kept_field = model.integer("topk_group")
    fields = [model.experts_field, model.active_field, func_field, renorm_field, scale_field, groups_field, kept_field]
    role = f"{func} routing, {model.active} of {model.experts} experts"
    mode = mode_of(func, renorm)
    if mode is None:
        *others, last = SCORE_FUNCS
        computed = f"{', '.join(others)} or {last}"
        return [Found(role, model.moe_layers, [], fields, differs=f"the catalog's router scores with {computed}; the "
                      f"config's uses {func} scores (renormalize={renorm})")]
    shape = {"D": model.hidden, "E": model.experts, "k": model.active, "mode": mode}
    if scale is not None:
        shape["scale"] = float(scale)
    if groups and groups > 1:
        shape.update(G=groups, kg=kept or 1)
        role += f" in the best {kept or 1} of {groups} groups"
    return [Found(role, model.moe_layers, [{"N": n, **shape} for n in model.step_tokens], fields)]


SPEC = BlockSpec(
    name="moe_router",
    family="moe",
    summary="top-k expert routing: float32 logits, sigmoid/softmax scores, selection bias, renormalized weights",
    reference=reference,
    make_inputs=make_inputs,
    abstract_inputs=abstract_inputs,
    grad_inputs=("x", "weight"),
    outputs=("weights", "ids", "counts"),
    shapes=SHAPES,
    comparators={"forward:weights": compare_float32_quantity, "forward:ids": compare_id_sets,
                 "forward:counts": compare_exact},
    hidden_shapes=hidden_shapes,
    work=work,
    abstract_outputs=abstract_outputs,
    onboard=onboard,
    replay="moe",
)
