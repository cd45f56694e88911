"""moe_router: the reference against an independent per-token formulation and hand-computed cases, tie-free
(TransformerEngine-style) discrete outputs, gradients, input factory, comparators, the balancing statistics, and a
port on the interpreter."""

from __future__ import annotations

import math
import random

import pytest
import torch

from workbench.blocks import get_block
from workbench.blocks._moe import compare_float32_quantity, compare_id_sets
from workbench.blocks.moe_router import (
    MODES,
    adaptive_aux_coeff,
    hidden_shapes,
    make_inputs,
    near_ties,
    reference,
    switch_aux_loss,
    update_bias,
    z_loss,
)
from workbench.numerics import DEFAULT_TOLERANCES

SPEC = get_block("moe_router")
ALL_SHAPES = SPEC.shapes["smoke"] + SPEC.shapes["edge"]


def per_token_router(x, weight, bias, topk, score_func, norm_lambda, renormalize, route_scale, n_group=1,
                     topk_group=1):
    """The same routing written token by token in float64 with Python sorting (independent of the reference); with
    groups, DeepSeek-V3's recipe as its paper states it: rank the groups by the sum of their two best scores."""
    xs, ws, bs = x.double().tolist(), weight.double().tolist(), bias.double().tolist()
    n, e = len(xs), len(ws)
    weights, ids = torch.zeros(n, topk, dtype=torch.float64), torch.zeros(n, topk, dtype=torch.int64)
    counts = [0] * e
    for t in range(n):
        z = [math.fsum(a * b for a, b in zip(xs[t], ws[j], strict=True)) for j in range(e)]
        if norm_lambda is not None:
            mu = sum(z) / e
            sd = math.sqrt(sum((v - mu) ** 2 for v in z) / (e - 1))
            z = [(v - mu) / sd * norm_lambda for v in z]
        if score_func == "sigmoid":
            s = [1 / (1 + math.exp(-v)) for v in z]
        elif score_func == "sqrtsoftplus":
            s = [math.sqrt(math.log1p(math.exp(v))) for v in z]
        else:
            mx = max(z)
            p = [math.exp(v - mx) for v in z]
            s = [v / sum(p) for v in p]
        sel = [s[j] + bs[j] for j in range(e)]
        size = e // n_group
        best_two = [sum(sorted(sel[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(n_group)]
        kept = sorted(range(n_group), key=lambda g: -best_two[g])[:topk_group] if n_group > 1 else [0]
        chosen = sorted((j for j in range(e) if j // size in kept), key=lambda j: -sel[j])[:topk]
        w = [s[j] for j in chosen]
        if renormalize:
            w = [v / (sum(w) + 1e-20) for v in w]
        weights[t] = torch.tensor([v * route_scale for v in w], dtype=torch.float64)
        ids[t] = torch.tensor(chosen)
        for j in chosen:
            counts[j] += 1
    return weights, ids, torch.tensor(counts)


def call(inputs: dict):
    return reference(**{name: inputs[name] for name in SPEC.arg_names})


# --- reference ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ALL_SHAPES, ids=str)
def test_reference_matches_per_token_formulation(shape):
    inputs = make_inputs(shape, torch.float64, seed=3)
    w, ids, counts = call(inputs)
    w2, ids2, counts2 = per_token_router(**{name: inputs[name] for name in SPEC.arg_names})
    assert torch.equal(ids, ids2)
    assert torch.equal(counts, counts2)
    assert int(counts.sum()) == shape["N"] * shape["k"]
    torch.testing.assert_close(w, w2, rtol=1e-12, atol=1e-12)


def test_sigmoid_hand_case_and_bias_steers_selection_only():
    x = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    eye = torch.eye(4)
    s = [1 / (1 + math.exp(-v)) for v in (0.0, 1.0, 2.0, -1.0)]
    w, ids, counts = reference(x, eye, torch.zeros(4), 2, "sigmoid", None, True, 2.827)
    assert ids.tolist() == [[2, 1]] and counts.tolist() == [0, 1, 1, 0]
    expected = torch.tensor([[s[2], s[1]]]) / (s[2] + s[1]) * 2.827
    torch.testing.assert_close(w, expected)
    # a bias of 0.5 on expert 3 (score 0.269 + 0.5 = 0.769 > 0.731) wins it expert 1's slot, but its weight is its
    # unbiased score
    w, ids, counts = reference(x, eye, torch.tensor([0.0, 0.0, 0.0, 0.5]), 2, "sigmoid", None, True, 2.827)
    assert ids.tolist() == [[2, 3]] and counts.tolist() == [0, 0, 1, 1]
    torch.testing.assert_close(w, torch.tensor([[s[2], s[3]]]) / (s[2] + s[3]) * 2.827)


def test_group_limited_hand_case():
    """Four groups of two; selection scores (sigmoid, no bias) by group: [.9 .1] [.8 .7] [.85 .05] [.6 .55]. Two
    groups kept: by top-2 sums (1.0, 1.5, 0.9, 1.15) groups 1 and 3, although experts 0 (0.9) and 4 (0.85) score
    higher than any of group 3; k = 3 picks experts 2, 3 and 6 (0.8, 0.7, 0.6)."""
    probs = torch.tensor([[0.9, 0.1, 0.8, 0.7, 0.85, 0.05, 0.6, 0.55]], dtype=torch.float64)
    x = torch.log(probs / (1 - probs))  # logits whose sigmoid is probs
    eye = torch.eye(8, dtype=torch.float64)
    w, ids, counts = reference(x, eye, torch.zeros(8), 3, "sigmoid", None, True, 2.5, 4, 2)
    assert ids.tolist() == [[2, 3, 6]] and counts.tolist() == [0, 0, 1, 1, 0, 0, 1, 0]
    torch.testing.assert_close(w, torch.tensor([[0.8, 0.7, 0.6]], dtype=torch.float64) / 2.1 * 2.5)
    _, ungrouped, _ = reference(x, eye, torch.zeros(8), 3, "sigmoid", None, True, 2.5)
    assert ungrouped.tolist() == [[0, 4, 2]]  # one group: the global top 3


@pytest.mark.parametrize("groups", [(3, 2), (4, 0), (4, 5)], ids=str)
def test_group_settings_that_cannot_route_are_refused(groups):
    with pytest.raises(ValueError, match="group-limited routing needs"):
        reference(torch.zeros(1, 4), torch.zeros(8, 4), torch.zeros(8), 2, "sigmoid", None, True, 1.0, *groups)


def test_softmax_hand_cases_with_and_without_renormalization():
    x = torch.tensor([[0.0, math.log(2.0), math.log(5.0)]], dtype=torch.float64)
    eye = torch.eye(3, dtype=torch.float64)
    w, ids, _ = reference(x, eye, torch.zeros(3), 2, "softmax", None, False, 1.0)  # probabilities 1/8, 2/8, 5/8
    assert ids.tolist() == [[2, 1]]
    torch.testing.assert_close(w, torch.tensor([[5 / 8, 2 / 8]], dtype=torch.float64))
    w, _, _ = reference(x, eye, torch.zeros(3), 2, "softmax", None, True, 3.0)
    torch.testing.assert_close(w, torch.tensor([[5 / 7 * 3, 2 / 7 * 3]], dtype=torch.float64))


def test_skywork_normalization_hand_case():
    """logits [1, 2, 3]: mean 2, unbiased std 1, lambda 2 -> z = [-2, 0, 2] before the softmax."""
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    w, ids, _ = reference(x, torch.eye(3, dtype=torch.float64), torch.zeros(3), 3, "softmax", 2.0, False, 1.0)
    p = torch.softmax(torch.tensor([-2.0, 0.0, 2.0], dtype=torch.float64), 0)
    assert ids.tolist() == [[2, 1, 0]]
    torch.testing.assert_close(w, p.flip(0)[None])


@pytest.mark.parametrize("mode", sorted(MODES))
def test_tie_free_arange_logits_route_exactly(mode):
    """TransformerEngine's tie-free logits (e - E/2) * 1e-2 + (t - T/2) * 1e-4, shuffled per token: the chosen
    experts are known exactly, in float32 too, and so are the counts."""
    n, e, k = 24, 16, 4
    g = torch.Generator().manual_seed(0)
    base = (torch.arange(e) - e / 2)[None, :] * 1e-2 + (torch.arange(n) - n / 2)[:, None] * 1e-4
    perm = torch.stack([torch.randperm(e, generator=g) for _ in range(n)])
    logits = torch.empty(n, e).scatter_(1, perm, base)  # token t gives base value i to expert perm[t, i]
    score_func, norm_lambda, renormalize, route_scale = MODES[mode]
    w, ids, counts = reference(logits, torch.eye(e), torch.zeros(e), k, score_func, norm_lambda, renormalize,
                               route_scale)
    expected = perm[:, -k:].flip(1)  # the k largest base values, largest first
    assert torch.equal(ids, expected)
    assert torch.equal(counts, torch.bincount(expected.flatten(), minlength=e))
    assert w.dtype == torch.float32 and (w > 0).all()


@pytest.mark.parametrize("mode", sorted(MODES))
def test_gradcheck_float64(mode):
    shape = {"N": 2, "D": 4, "E": 5, "k": 2, "mode": mode}
    inputs = make_inputs(shape, torch.float64, seed=1)
    x = inputs["x"].clone().requires_grad_(True)
    weight = inputs["weight"].clone().requires_grad_(True)
    rest = [inputs[name] for name in SPEC.arg_names[2:]]
    assert torch.autograd.gradcheck(lambda a, b: reference(a, b, *rest)[0], (x, weight))


def test_low_precision_inputs_route_in_float32():
    inputs = make_inputs({"N": 8, "D": 16, "E": 8, "k": 2, "mode": 0}, torch.float16, seed=2)
    w, ids, counts = call(inputs)
    assert w.dtype == torch.float32 and ids.dtype == torch.int64 and counts.dtype == torch.int64
    w64, ids64, _ = call({**inputs, "x": inputs["x"].double(), "weight": inputs["weight"].double()})
    assert torch.equal(ids, ids64)  # tie-free: float32 selects what float64 selects
    torch.testing.assert_close(w.double(), w64, rtol=1e-5, atol=1e-6)


# --- inputs and shapes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_make_inputs_shapes_dtypes_and_determinism(dtype):
    shape = {"N": 19, "D": 24, "E": 16, "k": 4, "mode": 3}
    a, b = make_inputs(shape, dtype, seed=5), make_inputs(shape, dtype, seed=5)
    assert a["x"].shape == (19, 24) and a["x"].dtype == dtype
    assert a["weight"].shape == (16, 24) and a["weight"].dtype == dtype
    assert a["bias"].shape == (16,) and a["bias"].dtype == torch.float32
    assert (a["topk"], a["score_func"], a["norm_lambda"], a["renormalize"], a["route_scale"]) == (4, *MODES[3])
    for name in ("x", "weight", "bias"):
        assert torch.equal(a[name], b[name])
    assert not torch.equal(a["x"], make_inputs(shape, dtype, seed=6)["x"])
    assert not near_ties(a["x"], a["weight"], a["bias"], 4, "softmax", None).any()


def test_make_inputs_skews_expert_load():
    inputs = make_inputs({"N": 512, "D": 32, "E": 16, "k": 2, "mode": 0}, torch.float32, seed=0)
    counts = call(inputs)[2].double()
    assert counts.max() > 2 * counts.mean()  # popular experts well above the mean, as trained routers show


def test_hidden_shapes_respect_constraints():
    for seed in range(30):
        for shape in hidden_shapes(random.Random(seed)):
            assert set(shape) - {"G", "kg"} == set(ALL_SHAPES[0])
            if "G" in shape:
                assert shape["E"] % shape["G"] == 0 and shape["k"] <= shape["kg"] * shape["E"] // shape["G"]
            assert 1 <= shape["k"] <= shape["E"]
            assert shape["E"] >= 2 or MODES[shape["mode"]][1] is None
            assert shape["k"] >= 2 or not MODES[shape["mode"]][2]


# --- comparators -----------------------------------------------------------------------------------------------


def test_id_set_comparator_ignores_order_and_catches_a_wrong_expert():
    tol = DEFAULT_TOLERANCES[torch.float16]
    truth = torch.tensor([[3, 1, 2], [0, 4, 5]])
    assert compare_id_sets(truth.flip(1), truth, truth, tol, torch.int64)["passed"]
    wrong = torch.tensor([[3, 1, 2], [0, 4, 6]])
    result = compare_id_sets(wrong, truth, truth, tol, torch.int64)
    assert not result["passed"] and result["max_abs"] == 1 and "row 1" in result["reason"]
    assert not compare_id_sets(truth.int(), truth, truth, tol, torch.int64)["passed"]  # dtype is part of it


def test_float32_quantity_is_held_to_the_float32_tolerance():
    truth = torch.linspace(0.5, 2.0, 10, dtype=torch.float64)
    ref = truth.float()
    off_by_1e4 = (truth * (1 + 1e-4)).float()  # fine for a float16 output, too coarse for a float32 one
    tol16 = DEFAULT_TOLERANCES[torch.float16]
    assert not compare_float32_quantity(off_by_1e4, truth, ref, tol16, torch.float32)["passed"]
    assert compare_float32_quantity(ref, truth, ref, tol16, torch.float32)["passed"]


# --- balancing statistics --------------------------------------------------------------------------------------


def test_switch_aux_loss_uniform_is_alpha_and_hand_case():
    n, e, k = 8, 4, 2
    assert switch_aux_loss(torch.full((n, e), 1 / e), torch.full((e,), n * k // e), k, 0.01).item() == \
        pytest.approx(0.01)
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2]], requires_grad=True)
    loss = switch_aux_loss(probs, torch.tensor([2, 0]), 1, 0.5)  # f = [1, 0], P = [0.85, 0.15]
    assert loss.item() == pytest.approx(0.5 * 2 * 0.85)
    loss.backward()
    torch.testing.assert_close(probs.grad, torch.tensor([[0.5, 0.0], [0.5, 0.0]]))  # alpha * E * f_i / N


def test_z_loss_hand_case():
    assert z_loss(torch.zeros(3, 8), 1e-3).item() == pytest.approx(1e-3 * math.log(8) ** 2)
    logits = torch.tensor([[0.0, math.log(3.0)]])  # logsumexp = log 4
    assert z_loss(logits, 2.0).item() == pytest.approx(2.0 * math.log(4.0) ** 2)


def test_update_bias_moves_against_the_load():
    bias = torch.tensor([0.1, 0.0, -0.2, 0.05])
    new = update_bias(bias, torch.tensor([1, 2, 3, 6]), gamma=1e-3)  # mean 3
    torch.testing.assert_close(new, bias + 1e-3 * torch.tensor([1.0, 1.0, 0.0, -1.0]))
    assert new.dtype == bias.dtype and torch.equal(bias, torch.tensor([0.1, 0.0, -0.2, 0.05]))


def test_adaptive_aux_coeff_hand_values_and_fixed_point():
    assert adaptive_aux_coeff(0.005, 0.02) == pytest.approx(0.99 * 0.005 + 0.01 * 0.004)
    assert adaptive_aux_coeff(0.005, 0.5) == pytest.approx(0.99 * 0.005 + 0.01 * 0.01)  # clipped at a_max
    a = 0.0
    for _ in range(3000):
        a = adaptive_aux_coeff(a, 0.03)
    assert a == pytest.approx(0.2 * 0.03, rel=1e-6)


# --- the port on the interpreter -------------------------------------------------------------------------------


@pytest.mark.interpreter
def test_port_promotes_a_verified_candidate(settings):
    from workbench.agent.run import port_block
    from workbench.verify.harness import verify_candidate

    outcome = port_block("moe_router", settings, seeds=1)
    assert outcome.status == "promoted", outcome.reason
    result = verify_candidate(outcome.operator_path, seeds=1, suites=["smoke"], base_seed=4321)  # another seed
    assert result.passed, result.message
    directions = {c.direction for c in result.checks}
    assert {"forward:weights", "forward:ids", "forward:counts", "grad:x", "grad:weight"} <= directions


@pytest.mark.interpreter
def test_verifier_refuses_a_router_that_ignores_the_selection_bias(tmp_path):
    """The id-set comparator through the harness: dropping the bias from the selection changes which experts some
    tokens get, and the verification fails on forward:ids (and on the positional weights)."""
    from workbench.templating import load_template
    from workbench.verify.harness import verify_candidate

    template = load_template("moe_router", "two_pass")
    source = template.render(next(template.points()))
    assert "sel = s + b[None, :]" in source
    path = tmp_path / "moe_router_no_bias.py"
    path.write_text(source.replace("sel = s + b[None, :]", "sel = s + 0.0 * b[None, :]"))
    result = verify_candidate(path, suites=["smoke"], dtypes=["float32"], seeds=1, base_seed=3)
    assert result.verdict == "fail"
    failing = {c.direction for c in result.failing()}
    assert "forward:ids" in failing and "forward:counts" in failing


@pytest.mark.interpreter
def test_verifier_refuses_a_router_that_ignores_the_groups(tmp_path):
    """Group-limited routing through the harness: a router that takes the global top k (the groups ignored) gives
    some tokens experts outside their kept groups (the smoke suite's DeepSeek-V3 shape), and fails on forward:ids."""
    from workbench.templating import load_template
    from workbench.verify.harness import verify_candidate

    template = load_template("moe_router", "fused")
    source = template.render(next(template.points()))
    assert source.count("    if GROUPED:\n") == 1
    path = tmp_path / "moe_router_no_groups.py"
    path.write_text(source.replace("    if GROUPED:\n", "    if False:\n"))
    result = verify_candidate(path, suites=["smoke"], dtypes=["float32"], seeds=1, base_seed=3)
    assert result.verdict == "fail"
    failing = {c.direction for c in result.failing()}
    assert "forward:ids" in failing
