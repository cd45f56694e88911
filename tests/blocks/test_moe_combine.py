"""moe_combine: the reference against an independent slot-by-slot formulation and a hand-computed case with a
dropped slot, gradients, the input factory, and a port on the interpreter."""

from __future__ import annotations

import pytest
import torch

from workbench.blocks import get_block
from workbench.blocks._moe import ROUTED_ROWS_SUITES
from workbench.blocks.moe_combine import ROUTE_SCALE, make_inputs, reference

SPEC = get_block("moe_combine")
ALL_SHAPES = ROUTED_ROWS_SUITES["smoke"] + ROUTED_ROWS_SUITES["edge"]


def slot_by_slot(y, weights, row_of_slot):
    """out[t] accumulated one (token, slot) at a time in float64, skipping dropped slots."""
    n, k = row_of_slot.shape
    out = torch.zeros(n, y.shape[1], dtype=torch.float64)
    for t in range(n):
        for j in range(k):
            r = int(row_of_slot[t, j])
            if r >= 0:
                out[t] += float(weights[t, j]) * y[r].double()
    return out


@pytest.mark.parametrize("shape", ALL_SHAPES, ids=str)
def test_reference_matches_slot_by_slot(shape):
    inputs = make_inputs(shape, torch.float64, seed=8)
    torch.testing.assert_close(reference(**inputs), slot_by_slot(**inputs), rtol=1e-12, atol=1e-12)


def test_hand_case_with_a_dropped_slot_and_its_gradients():
    y = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([[0.5, 2.0], [1.0, 3.0]], dtype=torch.float64, requires_grad=True)
    rows = torch.tensor([[2, 0], [-1, 1]])  # token 1's first slot was dropped: its weight must not count
    out = reference(y, w, rows)
    torch.testing.assert_close(out, torch.tensor([[4.5, 7.0], [9.0, 12.0]], dtype=torch.float64))
    dout = torch.tensor([[1.0, -1.0], [2.0, 0.5]], dtype=torch.float64)
    dy, dw = torch.autograd.grad(out, (y, w), dout)
    torch.testing.assert_close(dy, torch.tensor([[2.0, -2.0], [6.0, 1.5], [0.5, -0.5]], dtype=torch.float64))
    torch.testing.assert_close(dw, torch.tensor([[5 - 6, 1 - 2], [0.0, 6 + 2]], dtype=torch.float64))


def test_gradcheck_float64():
    inputs = make_inputs({"N": 5, "D": 3, "E": 4, "k": 2, "hot": 1, "drop": 1}, torch.float64, seed=1)
    y = inputs["y"].clone().requires_grad_(True)
    w = inputs["weights"].double().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: reference(a, b, inputs["row_of_slot"]), (y, w))


def test_rows_no_slot_points_at_get_no_gradient():
    inputs = make_inputs({"N": 29, "D": 16, "E": 16, "k": 4, "hot": 0, "drop": 1}, torch.float32, seed=0)
    y = inputs["y"].clone().requires_grad_(True)
    (dy,) = torch.autograd.grad(reference(y, inputs["weights"], inputs["row_of_slot"]).sum(), y)
    used = torch.zeros(y.shape[0], dtype=torch.bool)
    used[inputs["row_of_slot"][inputs["row_of_slot"] >= 0]] = True
    assert not used.all() and (dy[~used] == 0).all() and (dy[used] != 0).any()


def test_low_precision_accumulates_in_float32():
    inputs = make_inputs({"N": 16, "D": 64, "E": 16, "k": 4, "hot": 0, "drop": 0}, torch.float16, seed=2)
    out = reference(**inputs)
    assert out.dtype == torch.float16
    want = slot_by_slot(**inputs)
    assert (out.double() - want).abs().max() <= want.abs().max() * 2**-11  # one rounding, at the end


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_make_inputs_shapes_dtypes_and_determinism(dtype):
    shape = {"N": 37, "D": 40, "E": 13, "k": 3, "hot": 1, "drop": 1}
    a, b = make_inputs(shape, dtype, seed=6), make_inputs(shape, dtype, seed=6)
    assert a["y"].shape == (111, 40) and a["y"].dtype == dtype
    assert a["weights"].shape == (37, 3) and a["weights"].dtype == torch.float32
    torch.testing.assert_close(a["weights"].sum(-1), torch.full((37,), ROUTE_SCALE))
    rows = a["row_of_slot"]
    assert rows.dtype == torch.int64 and (rows < 0).any()  # capacity drops
    live = rows[rows >= 0]
    assert live.unique().numel() == live.numel() and int(live.max()) < 111  # distinct rows, in range
    for name in ("y", "weights", "row_of_slot"):
        assert torch.equal(a[name], b[name])
    assert not torch.equal(a["y"], make_inputs(shape, dtype, seed=7)["y"])


# --- the port on the interpreter -------------------------------------------------------------------------------


@pytest.mark.interpreter
def test_port_promotes_a_verified_candidate(settings):
    from workbench.agent.run import port_block
    from workbench.verify.harness import verify_candidate

    outcome = port_block("moe_combine", settings, seeds=1)
    assert outcome.status == "promoted", outcome.reason
    result = verify_candidate(outcome.operator_path, seeds=1, suites=["smoke"], base_seed=4321)  # another seed
    assert result.passed, result.message
    assert {"forward:out", "grad:y", "grad:weights"} <= {c.direction for c in result.checks}
