"""moe_topk: a serving engine's expert selection from the gate's logits (vLLM's ``fused_topk`` / ``grouped_topk``
granularity: the gate GEMM is the model's own linear layer, and the fused-MoE layer receives its logits). The
routing half of moe_router, forward only:

    s      = sigmoid(logits)   or   softmax(logits, over e)   or   sqrt(softplus(logits))   # float32 (float64 in)
    sel    = s + bias                                          # the bias steers selection only
    sel    = -inf outside the topk_group best of n_group groups   # group-limited, only when n_group > 1
    ids    = topk(sel, k)                                      # sorted descending, the lowest index wins a tie
    w      = s.gather(ids)
    w      = w / (w.sum(-1) + 1e-20)                           # when renormalize
    w      = w * route_scale
    counts = bincount(ids, E)

A group's score is the sum of its two best ``sel`` (DeepSeek-V3's noaux_tc, which vLLM's grouped top-k computes
where the layer has a correction bias). Shapes: logits [N, E] float32, float16 or bfloat16 (vLLM hands the gate's
output in the model's dtype, DeepSeek's in float32), bias [E] float32; outputs weights [N, k] float32 (float64 for
float64 logits), ids [N, k] int64, counts [E] int64. No gradients: training routes through moe_router, which fuses
the gate GEMM.

Discrete outputs are verified exactly, so inputs are tie-free by construction (moe_router's rule). Modes (shape dim
``mode``) are moe_router's without its Skywork normalization, which no serving engine's router computes: 0 sigmoid
+ renormalize, scale 2.827; 1 softmax + renormalize; 3 softmax without renormalization, scale 16; 4 sqrt(softplus) +
renormalize, scale 1.5 (DeepSeek-V4). Optional shape dims: ``scale``, ``G`` and ``kg`` as moe_router's.
"""

from __future__ import annotations

import random

import torch

from workbench.blocks import moe_router
from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._moe import compare_exact, compare_float32_quantity, compare_id_sets, draw_routing_shape
from workbench.blocks.base import BF16, F32, I64, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype

MODES = {m: v for m, v in moe_router.MODES.items() if v[1] is None}
"""mode -> (score_func, None, renormalize, route_scale): moe_router's modes without a logit normalization."""


def reference(logits: torch.Tensor, bias: torch.Tensor, topk: int, score_func: str, renormalize: bool,
              route_scale: float, n_group: int = 1, topk_group: int = 1
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return moe_router.route(logits.to(compute_dtype(logits)), bias, topk, score_func, None, renormalize, route_scale,
                            n_group, topk_group)


def routing_args(shape: Shape) -> dict:
    """The non-tensor arguments of a shape: its mode's score function and renormalization, the route scale
    (``scale``, else the mode's), the groups (``G``, ``kg``)."""
    score_func, _, renormalize, route_scale = MODES[shape["mode"]]
    return {"topk": shape["k"], "score_func": score_func, "renormalize": renormalize,
            "route_scale": float(shape.get("scale", route_scale)), "n_group": shape.get("G", 1),
            "topk_group": shape.get("kg", 1)}


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """logits [N, E] ~ N(0, 1.5^2) plus a per-expert offset N(0, 0.5^2) (hot and cold experts), in ``dtype``; bias
    [E] float32 as moe_router draws it. Rows whose selection (in ``dtype``'s logits) comes near a tie are redrawn."""
    g = torch.Generator().manual_seed(seed)
    n, e, k = shape["N"], shape["E"], shape["k"]
    args = routing_args(shape)
    groups = (args["n_group"], args["topk_group"])
    moe_router.check_groups(e, k, *groups)
    offset = 0.5 * torch.randn(e, generator=g)
    bias = 0.05 * torch.randn(e, generator=g) / (e if args["score_func"] == "softmax" else 1)
    logits = 1.5 * torch.randn(n, e, generator=g) + offset
    redo = torch.arange(n)
    for _ in range(200):
        near = moe_router.near_tie_logits(logits[redo].to(dtype), bias, k, args["score_func"], None, *groups)
        bad = redo[near]
        if not len(bad):
            break
        logits[bad] = 1.5 * torch.randn(len(bad), e, generator=g) + offset
        redo = bad
    else:
        raise RuntimeError(f"moe_topk: could not draw tie-free inputs for {dict(shape)}")
    return {"logits": logits.to(device, dtype), "bias": bias.to(device), **args}


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """make_inputs' shapes and dtypes on the meta device (its near-tie redraws are data-dependent)."""
    return {"logits": torch.empty(shape["N"], shape["E"], dtype=dtype, device="meta"),
            "bias": torch.empty(shape["E"], device="meta"), **routing_args(shape)}


def abstract_outputs(logits, bias, topk, score_func, renormalize, route_scale, n_group=1, topk_group=1):
    """weights [N, k] in the compute dtype, ids [N, k] int64, counts [E] int64."""
    n, e = logits.shape
    return (logits.new_empty(n, topk, dtype=compute_dtype(logits)), logits.new_empty(n, topk, dtype=torch.int64),
            logits.new_empty(e, dtype=torch.int64))


SHAPES = {
    "smoke": [
        {"N": 32, "E": 16, "k": 4, "mode": 0},
        {"N": 24, "E": 8, "k": 2, "mode": 1},
        {"N": 32, "E": 16, "k": 4, "mode": 0, "G": 4, "kg": 2, "scale": 2.5},  # DeepSeek-V3's recipe
    ],
    # no tokens, one token with k = 1, E not a power of two, unnormalized softmax, k = E, DeepSeek-V2-Lite's 64
    # experts on 6; groups: the kept groups hold exactly k experts, groups of two, one group kept, softmax scores
    "edge": [
        {"N": 0, "E": 8, "k": 2, "mode": 0},
        {"N": 1, "E": 8, "k": 1, "mode": 3},
        {"N": 37, "E": 12, "k": 3, "mode": 1},
        {"N": 19, "E": 16, "k": 4, "mode": 3},
        {"N": 5, "E": 3, "k": 3, "mode": 1},
        {"N": 7, "E": 64, "k": 6, "mode": 1},
        {"N": 13, "E": 12, "k": 6, "mode": 0, "G": 4, "kg": 2},
        {"N": 17, "E": 16, "k": 3, "mode": 1, "G": 8, "kg": 3},
        {"N": 9, "E": 12, "k": 2, "mode": 3, "G": 3, "kg": 1},
        {"N": 11, "E": 16, "k": 4, "mode": 4},  # DeepSeek-V4's sqrt(softplus) scores
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Four draws: routing sizes (k <= E) in any mode; where E splits into groups of at least 2 that can hold k,
    half the draws route group-limited."""
    out = []
    for _ in range(4):
        shape = draw_routing_shape(rng)
        out.append(moe_router.with_groups(rng, {"N": shape["N"], "E": shape["E"], "k": shape["k"],
                                                "mode": rng.choice(sorted(MODES))}))
    return out


def work(s: Shape) -> tuple[Work, Work]:
    """logits [N, E] read once; weights and ids [N, k] written; a compare per expert per selection round."""
    n, e, k = s["N"], s["E"], s["k"]
    return Work(BF16 * n * e + F32 * e + (F32 + I64) * n * k + I64 * e, 4 * n * e * k), Work(0, 0)


def onboard(model: ModelConfig) -> list[Found]:
    """Where moe_router routes a MoE layer, a serving engine selects from the gate's logits: the same mode, scale
    and groups at a prefill's and a decode step's tokens."""
    found = []
    for entry in moe_router.onboard(model):
        shapes = [{key: value for key, value in shape.items() if key != "D"} for shape in entry.shapes]
        found.append(Found(f"{entry.role}, selected from the gate's logits (serving)", entry.layers, shapes,
                           entry.fields, differs=entry.differs))
    return found


SPEC = BlockSpec(
    name="moe_topk",
    family="moe",
    summary="serving's expert selection from the gate's logits: sigmoid/softmax scores, selection bias, expert "
            "groups, renormalized top-k weights, counts",
    reference=reference,
    make_inputs=make_inputs,
    abstract_inputs=abstract_inputs,
    grad_inputs=(),
    outputs=("weights", "ids", "counts"),
    shapes=SHAPES,
    comparators={"forward:weights": compare_float32_quantity, "forward:ids": compare_id_sets,
                 "forward:counts": compare_exact},
    hidden_shapes=hidden_shapes,
    work=work,
    abstract_outputs=abstract_outputs,
    onboard=onboard,
)
