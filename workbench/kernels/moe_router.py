"""workbench::moe_router(x, weight, bias, topk, score_func, norm_lambda, renormalize, route_scale, n_group=1,
topk_group=1) -> weights, ids, counts: top-k expert routing (group-limited when n_group > 1), as
workbench/blocks/moe_router.py defines it, backed by the newest promoted moe_router operator; gradients for x and
weight (through the weights)."""

import torch

from workbench.kernels._ops import BlockOp
from workbench.numerics import compute_dtype


def fake(x, weight, bias, topk, score_func, norm_lambda, renormalize, route_scale, n_group=1, topk_group=1):
    """weights [N, k] in the compute dtype, ids [N, k] int64, counts [E] int64."""
    n, e = x.shape[0], weight.shape[0]
    return (x.new_empty(n, topk, dtype=compute_dtype(x)), x.new_empty(n, topk, dtype=torch.int64),
            x.new_empty(e, dtype=torch.int64))


moe_router = BlockOp("moe_router", fake=fake)
