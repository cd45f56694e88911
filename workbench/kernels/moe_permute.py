"""workbench::moe_permute(x, expert_ids, num_experts) -> x_perm, token_of_row, row_of_slot, counts, offsets: the
expert-major permutation of token rows, as workbench/blocks/moe_permute.py defines it, backed by the newest promoted
moe_permute operator; gradient for x."""

import torch

from workbench.kernels._ops import BlockOp


def fake(x, expert_ids, num_experts):
    """x_perm [N*k, D] in x's dtype, token_of_row [N*k], row_of_slot [N, k], counts [E], offsets [E + 1] int64."""
    n, k = expert_ids.shape
    index = {"dtype": torch.int64}
    return (x.new_empty(n * k, x.shape[1]), x.new_empty(n * k, **index), x.new_empty(n, k, **index),
            x.new_empty(num_experts, **index), x.new_empty(num_experts + 1, **index))


moe_permute = BlockOp("moe_permute", fake=fake)
