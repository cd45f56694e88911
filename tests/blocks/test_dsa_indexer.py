"""dsa_indexer: the reference against a loop formulation and hand-computed cases, its selection rules (ties, padding),
gradients, the two input distributions, the indices comparator, and one port on the Triton interpreter."""

from __future__ import annotations

import random

import pytest
import torch

from workbench.blocks import get_block
from workbench.blocks._dsa import causal_topk, selection_counts
from workbench.blocks.dsa_indexer import GRID, MIN_OVERLAP, SHAPES, compare_indices, hidden_shapes, make_inputs
from workbench.numerics import default_tolerance

SPEC = get_block("dsa_indexer")
ALL_SHAPES = SHAPES["smoke"] + SHAPES["edge"]
INF = float("inf")


def loop_indexer(q, k, w, topk):
    """Independent formulation: python loops over (b, t, s, j) in float64 and a sort by (-score, s)."""
    B, T, HI, _ = q.shape
    scores = torch.full((B, T, T), -INF, dtype=torch.float64)
    indices = torch.full((B, T, topk), -1, dtype=torch.int64)
    for b in range(B):
        for t in range(T):
            row = []
            for s in range(t + 1):
                value = sum(float(w[b, t, j]) * max(0.0, float(q[b, t, j].double() @ k[b, s].double()))
                            for j in range(HI))
                scores[b, t, s] = value
                row.append((-value, s))
            chosen = [s for _, s in sorted(row)[:topk]]
            indices[b, t, :len(chosen)] = torch.tensor(chosen, dtype=torch.int64)
    return scores, indices


def f64(inputs: dict) -> dict:
    return {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


# --- the reference ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [{"B": 2, "T": 9, "HI": 3, "DI": 5, "topk": 4, "tie_free": 0},
                                   {"B": 1, "T": 7, "HI": 1, "DI": 4, "topk": 10, "tie_free": 0},
                                   {"B": 1, "T": 8, "HI": 2, "DI": 4, "topk": 3, "tie_free": 1}])
def test_reference_matches_loop_formulation(shape):
    inputs = f64(make_inputs(shape, torch.float32, seed=3))
    scores, indices = SPEC.reference(**inputs)
    want_scores, want_indices = loop_indexer(inputs["q_idx"], inputs["k_idx"], inputs["w"], inputs["topk"])
    torch.testing.assert_close(scores, want_scores, rtol=1e-12, atol=1e-12)
    assert torch.equal(indices, want_indices)


def test_hand_computed_case():
    # T = 3, two index heads, DI = 2. q.k per (t, s, j), relu, weighted by w[t]:
    q = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]],
                       [[1.0, 1.0], [-1.0, 0.0]],
                       [[0.0, 2.0], [1.0, -1.0]]]], dtype=torch.float64)
    k = torch.tensor([[[2.0, 1.0], [-1.0, 3.0], [0.5, 0.5]]], dtype=torch.float64)
    w = torch.tensor([[[1.0, 2.0], [0.5, -1.0], [1.0, 1.0]]], dtype=torch.float64)
    scores, indices = SPEC.reference(q, k, w, 2)
    # t=0: s=0: 1*relu(2) + 2*relu(1) = 4
    # t=1: s=0: 0.5*relu(3) - relu(-2) = 1.5;  s=1: 0.5*relu(2) - relu(1) = 0
    # t=2: s=0: relu(2) + relu(1) = 3;  s=1: relu(6) + relu(-4) = 6;  s=2: relu(1) + relu(0) = 1
    want = torch.tensor([[[4.0, -INF, -INF], [1.5, 0.0, -INF], [3.0, 6.0, 1.0]]], dtype=torch.float64)
    torch.testing.assert_close(scores, want, rtol=0, atol=1e-12)
    assert indices.tolist() == [[[0, -1], [0, 1], [1, 0]]]
    assert scores.dtype == torch.float64 and indices.dtype == torch.int64


def test_ties_go_to_the_smaller_position_and_negative_zero_ties_with_zero():
    scores = torch.tensor([[[0.0, -INF, -INF, -INF],
                            [0.0, -0.0, -INF, -INF],
                            [1.0, 2.0, 1.0, -INF],
                            [-0.0, 5.0, 0.0, 5.0]]])
    assert causal_topk(scores, 2).tolist() == [[[0, -1], [0, 1], [1, 0], [1, 3]]]
    # keys past the diagonal are never chosen, whatever they hold
    assert causal_topk(torch.full((1, 3, 3), 7.0), 3).tolist() == [[[0, -1, -1], [0, 1, -1], [0, 1, 2]]]


def test_padding_when_topk_exceeds_the_causal_keys():
    inputs = make_inputs({"B": 2, "T": 5, "HI": 2, "DI": 16, "topk": 8, "tie_free": 0}, torch.float32, 0)
    _, indices = SPEC.reference(**inputs)
    assert indices.shape == (2, 5, 8)
    counts = (indices >= 0).sum(-1)
    assert torch.equal(counts, selection_counts(5, 8).expand(2, 5)) and counts.tolist()[0] == [1, 2, 3, 4, 5]
    for t in range(5):  # the valid entries are exactly the causal keys, padding at the end
        assert sorted(indices[0, t, : t + 1].tolist()) == list(range(t + 1))
        assert indices[0, t, t + 1:].eq(-1).all()


def test_float16_inputs_give_float32_scores_from_float32_math():
    inputs = make_inputs({"B": 1, "T": 12, "HI": 3, "DI": 16, "topk": 5, "tie_free": 0}, torch.float16, 1)
    scores, indices = SPEC.reference(**inputs)
    assert scores.dtype == torch.float32 and indices.dtype == torch.int64
    truth, _ = SPEC.reference(**f64(inputs))
    finite = torch.isfinite(truth)
    assert torch.equal(finite, torch.isfinite(scores))
    # grid inputs: every head dot product is exact in float32, only the weighted head sum rounds
    assert float((scores.double() - truth)[finite].abs().max()) < 1e-5


def test_gradients_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 5, 2, 3, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(1, 5, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(1, 5, 2, dtype=torch.float64, generator=g, requires_grad=True)

    def finite_scores(q, k, w):
        scores, _ = SPEC.reference(q, k, w, 3)
        return scores.masked_fill(torch.isinf(scores), 0.0)

    assert torch.autograd.gradcheck(finite_scores, (q, k, w), eps=1e-6, atol=1e-7)


def test_masked_scores_take_no_gradient_and_indices_none():
    inputs = make_inputs({"B": 1, "T": 6, "HI": 2, "DI": 16, "topk": 3, "tie_free": 0}, torch.float64, 2)
    leaves = {n: inputs[n].clone().requires_grad_(True) for n in SPEC.grad_inputs}
    scores, indices = SPEC.reference(**{**inputs, **leaves})
    assert not indices.requires_grad
    upstream = torch.zeros_like(scores)
    upstream[0, 0, 1:] = 1.0  # only above the diagonal
    grads = torch.autograd.grad(scores, list(leaves.values()), upstream)
    assert all(float(gr.abs().max()) == 0.0 for gr in grads)


# --- inputs and shapes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ALL_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_make_inputs_shapes_dtypes_and_determinism(shape, dtype):
    a, b = make_inputs(shape, dtype, 5), make_inputs(shape, dtype, 5)
    B, T, HI, DI = shape["B"], shape["T"], shape["HI"], shape["DI"]
    assert a["q_idx"].shape == (B, T, HI, DI) and a["k_idx"].shape == (B, T, DI) and a["w"].shape == (B, T, HI)
    assert a["topk"] == shape["topk"]
    for name in SPEC.grad_inputs:
        assert a[name].dtype == dtype and torch.equal(a[name], b[name])
    assert not torch.equal(make_inputs(shape, dtype, 6)["k_idx"], a["k_idx"]) or T * DI == 0


def test_random_inputs_lie_on_the_grid_and_are_realistic():
    inputs = make_inputs({"B": 2, "T": 64, "HI": 4, "DI": 32, "topk": 8, "tie_free": 0}, torch.float32, 0)
    for name in ("q_idx", "k_idx"):
        x = inputs[name]
        assert torch.equal(x * GRID, torch.round(x * GRID)) and float(x.abs().max()) <= 4
        assert 0.8 < float(x.std()) < 1.2
    scores, _ = SPEC.reference(**inputs)
    finite = scores[torch.isfinite(scores)]
    assert (finite < 0).any() and (finite > 0).any()  # signed weights
    assert 0.02 < float((finite == 0).float().mean()) < 0.2  # ~2^-4 of the pairs: every head clipped by relu


@pytest.mark.parametrize("shape", [s for s in ALL_SHAPES if s["tie_free"]])
def test_tie_free_inputs_separate_every_row(shape):
    for dtype in (torch.float32, torch.float16):
        inputs = make_inputs(shape, dtype, 11)
        truth, want = SPEC.reference(**f64(inputs))
        _, got = SPEC.reference(**inputs)
        assert torch.equal(got, want)
        for t in range(1, shape["T"]):
            row = torch.sort(truth[:, t, : t + 1], dim=-1).values
            assert float(row.diff(dim=-1).min()) > 0.01  # distinct scores, far apart
        assert float(inputs["w"].min()) > 0


def test_hidden_shapes_stay_within_the_suites():
    rng = random.Random(7)
    for _ in range(50):
        shapes = hidden_shapes(rng)
        assert {s["tie_free"] for s in shapes} == {0, 1}
        for s in shapes:
            assert 1 <= s["T"] <= 80 and 1 <= s["HI"] <= 4 and 16 <= s["DI"] <= 32 and s["B"] in (1, 2)
            assert 1 <= s["topk"] <= s["T"] + 16


def test_spec_contract():
    assert SPEC.arg_names == ("q_idx", "k_idx", "w", "topk")
    assert SPEC.outputs == ("scores", "indices") and SPEC.grad_inputs == ("q_idx", "k_idx", "w")
    assert set(SPEC.comparators) == {"forward:indices"}
    assert {"smoke", "edge"} <= set(SPEC.shapes) and any(s["tie_free"] for s in SPEC.shapes["smoke"])


# --- the indices comparator ------------------------------------------------------------------------------------


@pytest.fixture
def trial():
    inputs = make_inputs({"B": 1, "T": 40, "HI": 2, "DI": 16, "topk": 10, "tie_free": 0}, torch.float16, 4)
    low_scores, low_indices = SPEC.reference(**inputs)
    scores, indices = SPEC.reference(**f64(inputs))
    context = {"truth_outputs": {"scores": scores, "indices": indices},
               "lowp_outputs": {"scores": low_scores, "indices": low_indices}}
    return scores, indices, low_indices, context


def check(out, trial, with_scores=True):
    _, indices, low_indices, context = trial
    kwargs = context if with_scores else {}
    return compare_indices(out, indices, low_indices, default_tolerance(torch.float16), torch.int64, **kwargs)


def test_comparator_passes_the_truth_and_any_order_within_a_row(trial):
    _, indices, _, _ = trial
    assert check(indices.clone(), trial)["passed"]
    shuffled = indices.clone()
    shuffled[0, 30] = shuffled[0, 30].flip(0)  # a full row, in reverse order: same set
    result = check(shuffled, trial)
    assert result["passed"] and result["max_abs"] == 0.0 and result["bound"] == pytest.approx(1 - MIN_OVERLAP)


def test_comparator_refuses_padding_causality_repeats_and_wrong_types(trial):
    _, indices, _, _ = trial
    bad = indices.clone()
    bad[0, 2, 5] = 0  # a padding slot filled
    assert "padding" in check(bad, trial)["reason"]
    bad = indices.clone()
    bad[0, 20, 0] = 25  # a future key
    assert "not causal" in check(bad, trial)["reason"]
    bad = indices.clone()
    bad[0, 20, 1] = bad[0, 20, 0]
    assert "twice" in check(bad, trial)["reason"]
    assert "dtype" in check(indices.to(torch.int32), trial)["reason"]
    assert "shape" in check(indices[:, :, :5], trial)["reason"]
    assert not check(None, trial)["passed"]


def test_comparator_allows_a_near_tie_swap_but_not_garbage(trial):
    scores, indices, _, _ = trial
    t = 39
    kept = set(indices[0, t].tolist())
    outside = [s for s in range(t + 1) if s not in kept]
    best_out = max(outside, key=lambda s: float(scores[0, t, s]))
    worst_out = min(outside, key=lambda s: float(scores[0, t, s]))
    last = int(indices[0, t, -1])  # the truth's k-th key
    # a swap with the best excluded key: allowed only when its score is within the allowance of the k-th score
    near = indices.clone()
    near[0, t, -1] = best_out
    gap = float(scores[0, t, last] - scores[0, t, best_out])
    assert check(near, trial)["passed"] == (gap <= 2 * default_tolerance(torch.float16).bound(
        float((trial[3]["lowp_outputs"]["scores"].double() - scores)[torch.isfinite(scores)].abs().max()),
        float(scores[torch.isfinite(scores)].abs().max())))
    far = indices.clone()
    far[0, t, -1] = worst_out
    result = check(far, trial)
    assert not result["passed"] and "below the row's k-th score" in result["reason"] and result["max_rel"] > 1
    # without the truth scores only the overlap speaks: one pair of the 355 is within 1%
    assert check(far, trial, with_scores=False)["passed"]


def test_comparator_refuses_low_overlap(trial):
    _, indices, _, _ = trial
    bad = indices.clone()
    for t in range(15, 40):  # replace the k-th choice of 25 rows by the best excluded key: ~7% of pairs missed
        kept = set(bad[0, t].tolist())
        bad[0, t, -1] = next(s for s in range(t + 1) if s not in kept)
    result = check(bad, trial, with_scores=False)
    assert not result["passed"] and "overlap" in result["reason"] and result["max_abs"] > result["bound"]


# --- a port on the Triton interpreter --------------------------------------------------------------------------


@pytest.mark.interpreter
def test_port_promotes_a_candidate_that_verifies(settings):
    from workbench.agent.run import port_block
    from workbench.verify.harness import verify_candidate

    outcome = port_block("dsa_indexer", settings, seeds=1, budget=2)
    assert outcome.status == "promoted", outcome.reason
    result = verify_candidate(outcome.operator_path, seeds=1, suites=["smoke"], base_seed=99)
    assert result.passed, result.message
    directions = {c.direction for c in result.checks}
    assert {"forward:scores", "forward:indices", "grad:q_idx", "grad:k_idx", "grad:w"} <= directions
