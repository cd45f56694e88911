"""The share of a forward left in torch (workbench.integrations.torch_share): ops charged to the innermost module,
plain projections and views left out, a ported op's work not counted as torch's, and the modelled figures."""

from __future__ import annotations

import torch
from torch import nn

from workbench.integrations.torch_share import op_flops, tally, torch_share

N, D = 4, 8


@torch.library.custom_op("wbshare::gate", mutates_args=())
def ported_gate(x: torch.Tensor) -> torch.Tensor:
    """A stand-in for a ported block: x * sigmoid(x) in one opaque op."""
    return x * torch.sigmoid(x)


@ported_gate.register_fake
def _(x):
    return torch.empty_like(x)


class Gate(nn.Module):
    def __init__(self, ported: bool):
        super().__init__()
        self.ported = ported

    def forward(self, x):
        return ported_gate(x) if self.ported else x * torch.sigmoid(x)


class Tiny(nn.Module):
    """Embedding, a projection, a gate, a residual add in the model itself, and a view."""

    def __init__(self, ported: bool = False):
        super().__init__()
        self.embed = nn.Embedding(16, D)
        self.proj = nn.Linear(D, D)
        self.gate = Gate(ported)

    def forward(self, input_ids):
        h = self.embed(input_ids)
        return (self.gate(self.proj(h)) + h).transpose(0, 1)


def test_ops_are_charged_to_the_innermost_module_and_projections_and_views_are_left_out():
    ids = torch.arange(N).reshape(1, N)
    found = tally(Tiny(), ids, ported=("wbshare",))
    # the gate: sigmoid and mul over [1, N, D]: one FLOP an element each; bytes: inputs and outputs, float32
    gate = found.torch[("Gate", "gate")]
    assert (gate["flops"], gate["bytes"], gate["op:sigmoid"], gate["op:mul"]) == (2 * N * D, 5 * N * D * 4, 1, 1)
    # the residual add is the model's own; its transpose (a view) is not counted; embed and proj are not either
    assert set(found.torch) == {("Gate", "gate"), ("Tiny", "")}
    assert found.torch[("Tiny", "")]["flops"] == N * D and "op:transpose" not in found.torch[("Tiny", "")]
    assert not found.ported


def test_the_share_is_what_the_patched_forward_still_runs_in_torch():
    ids = torch.arange(N).reshape(1, N)
    shipped, patched = Tiny(), Tiny(ported=True)
    patched.load_state_dict(shipped.state_dict())
    share = torch_share(shipped, patched, ids, ported=("wbshare",))
    # the shipped model: gate (2 N D) and the add (N D) outside projections; the patched one keeps the add alone
    assert (share["flops_total"], share["flops_torch"]) == (3 * N * D, N * D)
    assert share["flops_share"] == 1 / 3 and 0 < share["bytes_share"] < 1
    assert share["ported_calls"] == {"gate": 1}
    assert [row["class"] for row in share["left"]] == ["Tiny"]
    assert share["left"][0] | {"ops": None} == {"class": "Tiny", "example": "(the model)", "modules": 1,
                                                 "flops": N * D, "bytes": 3 * N * D * 4, "ops": None}
    assert torch_share(shipped, shipped, ids)["flops_share"] == 1.0


def test_matmuls_and_attention_are_counted_by_their_multiply_adds():
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    assert op_flops(torch.ops.aten.mm.default, (a, b), {}, a @ b) == 2 * 3 * 5 * 7
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 10, 8), torch.randn(2, 4, 10, 8)
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
    assert op_flops(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, (q, k, v), {}, out) == \
        2 * 2 * 4 * 6 * 10 * (8 + 8)
    x = torch.randn(6, 9)
    assert op_flops(torch.ops.aten.sum.dim_IntList, (x, [1]), {}, x.sum(1)) == 54  # a reduction: its input


def test_an_op_on_no_tensor_is_not_counted():
    class Promotes(nn.Module):
        def forward(self, input_ids):
            torch.promote_types(torch.float16, torch.float32)  # a dispatched op on dtypes alone
            return input_ids.float() * 2

    found = tally(Promotes(), torch.arange(N).reshape(1, N))
    assert set(found.torch[("Promotes", "")]) == {"flops", "bytes", "op:_to_copy", "op:mul"}


def test_a_gemm_against_a_whole_parameter_is_a_projection_and_one_against_a_slice_is_not():
    """A weight a module holds outside an nn.Linear (Inkling2's rel_logits_proj.proj) is a plain projection's, even
    through a matmul that folds a 3-D input (its reshape's _unsafe_view aliases, moving nothing); an expert's slice
    of stacked experts is a grouped GEMM's, which counts."""

    class Held(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Parameter(torch.randn(D, D))
            self.experts = nn.Parameter(torch.randn(2, D, D))

        def forward(self, input_ids):
            x = input_ids.float()[..., None].expand(*input_ids.shape, D)  # [1, N, D]
            folded = torch.ops.aten._unsafe_view(x @ self.proj, (N, D))  # as matmul's own reshape returns it
            return folded + x[0] @ self.experts[1]

    found = tally(Held(), torch.arange(N).reshape(1, N))
    ops = {k for k in found.torch[("Held", "")] if k.startswith("op:")}
    assert ops == {"op:_to_copy", "op:mm", "op:add"}, ops
    assert found.torch[("Held", "")]["op:mm"] == 1  # the expert's; the projection's is not counted
