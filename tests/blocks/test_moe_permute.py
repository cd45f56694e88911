"""moe_permute: the reference against an independent expert-by-expert formulation and a hand-computed case, its
gradient, the routing generator shared by the MoE blocks, the exact comparator, and a port on the interpreter."""

from __future__ import annotations

import math
import random

import pytest
import torch

from workbench.blocks import get_block
from workbench.blocks._moe import (
    CAPACITY_FACTOR,
    ROUTED_ROWS_SUITES,
    compare_exact,
    permutation,
    routed_rows_hidden_shapes,
    routing_ids,
)
from workbench.blocks.moe_permute import make_inputs, reference
from workbench.numerics import DEFAULT_TOLERANCES

SPEC = get_block("moe_permute")
ALL_SHAPES = ROUTED_ROWS_SUITES["smoke"] + ROUTED_ROWS_SUITES["edge"]


def expert_by_expert(x, ids, e):
    """Rows appended expert after expert, each expert's slots in flat (token, slot) order, dropped slots last."""
    n, k = ids.shape
    flat = ids.reshape(-1).tolist()
    slots = [i for ex in range(e) for i in range(n * k) if flat[i] == ex] + [i for i in range(n * k) if flat[i] < 0]
    token_of_row = torch.tensor([i // k if flat[i] >= 0 else -1 for i in slots], dtype=torch.int64)
    row_of_slot = torch.full((n * k,), -1, dtype=torch.int64)
    for r, i in enumerate(slots):
        if flat[i] >= 0:
            row_of_slot[i] = r
    x_perm = torch.stack([x[i // k] if flat[i] >= 0 else torch.zeros_like(x[0]) for i in slots]) if slots else \
        x.new_zeros(0, x.shape[1])
    counts = torch.tensor([flat.count(ex) for ex in range(e)], dtype=torch.int64)
    offsets = torch.tensor([0] + [sum(counts[: ex + 1].tolist()) for ex in range(e)], dtype=torch.int64)
    return x_perm, token_of_row, row_of_slot.view(n, k), counts, offsets


@pytest.mark.parametrize("shape", ALL_SHAPES, ids=str)
def test_reference_matches_expert_by_expert(shape):
    inputs = make_inputs(shape, torch.float32, seed=4)
    got = reference(**inputs)
    want = expert_by_expert(inputs["x"], inputs["expert_ids"], inputs["num_experts"])
    for name, a, b in zip(SPEC.outputs, got, want, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_hand_case_with_a_dropped_slot():
    x = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    ids = torch.tensor([[1, 0], [0, 2], [-1, 1]])
    x_perm, token_of_row, row_of_slot, counts, offsets = reference(x, ids, 3)
    assert token_of_row.tolist() == [0, 1, 0, 2, 1, -1]
    assert row_of_slot.tolist() == [[2, 0], [1, 4], [-1, 3]]
    assert counts.tolist() == [2, 2, 1] and offsets.tolist() == [0, 2, 4, 5]
    assert x_perm.tolist() == [[1, 10], [2, 20], [1, 10], [3, 30], [2, 20], [0, 0]]


def test_gradient_is_the_sum_over_each_tokens_rows():
    inputs = make_inputs({"N": 5, "D": 3, "E": 4, "k": 2, "hot": 0, "drop": 1}, torch.float64, seed=2)
    x = inputs["x"].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a: reference(a, inputs["expert_ids"], 4)[0], (x,))
    dy = torch.randn(10, 3, dtype=torch.float64)
    (dx,) = torch.autograd.grad(reference(x, inputs["expert_ids"], 4)[0], x, dy)
    rows = reference(x, inputs["expert_ids"], 4)[2]
    want = torch.stack([sum((dy[r] for r in rows[t].tolist() if r >= 0), torch.zeros(3, dtype=torch.float64))
                        for t in range(5)])
    torch.testing.assert_close(dx, want)


def test_copy_is_exact_in_low_precision():
    inputs = make_inputs({"N": 9, "D": 16, "E": 4, "k": 2, "hot": 0, "drop": 0}, torch.float16, seed=0)
    x_perm, token_of_row = reference(**inputs)[:2]
    assert x_perm.dtype == torch.float16 and torch.equal(x_perm, inputs["x"][token_of_row])


# --- the shared routing generator --------------------------------------------------------------------------------


def test_routing_ids_are_distinct_per_token_skewed_and_leave_experts_empty():
    g = torch.Generator().manual_seed(0)
    ids = routing_ids(400, 16, 4, g)
    assert ids.dtype == torch.int64 and ids.shape == (400, 4)
    assert all(len(set(row)) == 4 for row in ids.tolist())
    counts = torch.bincount(ids.flatten(), minlength=16)
    assert int((counts == 0).sum()) == 4  # a quarter of the experts never chosen
    assert counts.max() > 2 * counts[counts > 0].double().mean()  # Zipf: the popular experts far above the mean


def test_routing_ids_hot_expert_and_capacity_drops():
    g = torch.Generator().manual_seed(1)
    ids = routing_ids(40, 8, 1, g, hot=True)
    assert ids.unique().numel() == 1  # k = 1: every token on the hot expert
    ids = routing_ids(40, 8, 3, g, hot=True, drop=True)
    capacity = math.ceil(CAPACITY_FACTOR * 40 * 3 / 8)
    counts = torch.bincount(ids[ids >= 0], minlength=8)
    assert (ids < 0).any() and int(counts.max()) == capacity
    assert routing_ids(0, 8, 2, g).shape == (0, 2)
    with pytest.raises(ValueError):
        routing_ids(4, 2, 3, g)


def test_permutation_layout_invariants():
    g = torch.Generator().manual_seed(3)
    ids = routing_ids(30, 8, 3, g, drop=True)
    p = permutation(ids, 8)
    order = p["order"]
    assert sorted(order.tolist()) == list(range(90))
    kept = int((ids >= 0).sum())
    assert int(p["offsets"][-1]) == kept and (p["token_of_row"][kept:] == -1).all()
    for ex in range(8):  # each group holds exactly its expert's slots, in token order
        lo, hi = p["offsets"][ex].item(), p["offsets"][ex + 1].item()
        assert (ids.flatten()[order[lo:hi]] == ex).all() and (order[lo:hi].diff() > 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_make_inputs_shapes_dtypes_and_determinism(dtype):
    shape = {"N": 37, "D": 40, "E": 13, "k": 3, "hot": 1, "drop": 1}
    a, b = make_inputs(shape, dtype, seed=9), make_inputs(shape, dtype, seed=9)
    assert a["x"].shape == (37, 40) and a["x"].dtype == dtype
    assert a["expert_ids"].shape == (37, 3) and a["expert_ids"].dtype == torch.int64 and a["num_experts"] == 13
    assert torch.equal(a["x"], b["x"]) and torch.equal(a["expert_ids"], b["expert_ids"])
    assert not torch.equal(a["expert_ids"], make_inputs(shape, dtype, seed=10)["expert_ids"])


def test_hidden_shapes_respect_constraints():
    for seed in range(30):
        for shape in routed_rows_hidden_shapes(random.Random(seed)):
            assert set(shape) == set(ALL_SHAPES[0]) and 1 <= shape["k"] <= shape["E"]


def test_exact_comparator_counts_differences():
    tol = DEFAULT_TOLERANCES[torch.float16]
    truth = torch.tensor([0, 3, 5, -1])
    assert compare_exact(truth.clone(), truth, truth, tol, torch.int64)["passed"]
    result = compare_exact(torch.tensor([0, 3, 4, -1]), truth, truth, tol, torch.int64)
    assert not result["passed"] and result["max_abs"] == 1 and "(2,)" in result["reason"]
    x = torch.tensor([1.0, 2.0], dtype=torch.float16)
    nudged = torch.tensor([1.0, 2.001953125], dtype=torch.float16)  # one ulp: a copy must not round
    assert not compare_exact(nudged, x.double(), x, tol, torch.float16)["passed"]
    assert not compare_exact(None, truth, truth, tol, torch.int64)["passed"]


# --- the port on the interpreter -------------------------------------------------------------------------------


@pytest.mark.interpreter
def test_port_promotes_a_verified_candidate(settings):
    from workbench.agent.run import port_block
    from workbench.verify.harness import verify_candidate

    outcome = port_block("moe_permute", settings, seeds=1)
    assert outcome.status == "promoted", outcome.reason
    result = verify_candidate(outcome.operator_path, seeds=1, suites=["smoke"], base_seed=4321)  # another seed
    assert result.passed, result.message
    assert {f"forward:{o}" for o in SPEC.outputs} | {"grad:x"} <= {c.direction for c in result.checks}


@pytest.mark.interpreter
def test_verifier_refuses_an_unstable_order_within_experts(tmp_path):
    """The exact comparator through the harness: ranking a tile's slots against the later ones instead of the
    earlier ones keeps every count and offset but reverses token order inside an expert's rows, which the exact
    row maps and the copy must refuse."""
    from workbench.templating import load_template
    from workbench.verify.harness import verify_candidate

    template = load_template("moe_permute", "scatter")
    source = template.render(next(template.points()))
    assert "(i[None, :] < i[:, None])" in source
    path = tmp_path / "moe_permute_unstable.py"
    path.write_text(source.replace("(i[None, :] < i[:, None])", "(i[None, :] > i[:, None])"))
    result = verify_candidate(path, suites=["smoke"], dtypes=["float32"], seeds=1, base_seed=3)
    assert result.verdict == "fail", result.message
    failing = {c.direction for c in result.failing()}
    assert {"forward:token_of_row", "forward:row_of_slot", "forward:x_perm"} <= failing
    assert not {"forward:counts", "forward:offsets"} & failing
