"""moe_topk: the reference is moe_router's routing on the gate's logits (held to moe_router, which is held to
transformers' routers, and in the vLLM stage to vLLM's own router), hand cases, tie-free inputs in every dtype, the
onboarding rule, and both templates verified on the Triton interpreter, with a selection that ignores the groups
refused."""

from __future__ import annotations

import random

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.moe_topk import MODES, hidden_shapes, make_inputs, reference

SPEC = get_block("moe_topk")
ROUTER = get_block("moe_router")


@pytest.mark.parametrize("shape", SPEC.shapes["smoke"] + SPEC.shapes["edge"], ids=str)
def test_the_reference_is_moe_routers_routing_on_the_gates_logits(shape):
    """moe_router(x, W) == moe_topk(x W^T) exactly in float64, at every suite shape's routing arguments."""
    g = torch.Generator().manual_seed(3)
    args = make_inputs(shape, torch.float64, 1)
    x = torch.randn(shape["N"], 24, dtype=torch.float64, generator=g)
    w = torch.randn(shape["E"], 24, dtype=torch.float64, generator=g)
    routing = {k: v for k, v in args.items() if k not in ("logits", "bias")}
    ours = reference(x @ w.T, args["bias"], **routing)
    theirs = ROUTER.reference(x, w, args["bias"], routing["topk"], routing["score_func"], None,
                              routing["renormalize"], routing["route_scale"], routing["n_group"], routing["topk_group"])
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


def test_hand_case_the_bias_steers_selection_and_groups_limit_it():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 3.0, -2.0]], dtype=torch.float64)
    bias = torch.tensor([0.0, 0.0, 0.0, 0.5, 0.0, 0.0])
    _, ids, _ = reference(logits, bias, 2, "sigmoid", True, 2.0)
    assert ids.tolist() == [[4, 0]]  # sigmoid(-1) + 0.5 = 0.77 < sigmoid(2) = 0.88
    weights, ids, counts = reference(logits, bias * 1.3, 2, "sigmoid", True, 2.0)
    assert ids.tolist() == [[4, 3]] and counts.tolist() == [0, 0, 0, 1, 1, 0]  # 0.27 + 0.65 = 0.92 > 0.88
    s = torch.sigmoid(logits[0, [4, 3]])  # the weights are the unbiased scores
    torch.testing.assert_close(weights[0], 2.0 * s / s.sum())
    # three groups of two, scored by the sum of their two softmax scores: (3, -2) holds the most mass, so with one
    # group kept expert 5 (logit -2) is chosen over expert 0 (logit 2)
    _, ids, _ = reference(logits, torch.zeros(6), 2, "softmax", True, 1.0, n_group=3, topk_group=1)
    assert ids.tolist() == [[4, 5]]


def test_softmax_without_renormalization_is_the_full_softmax_scaled():
    logits = torch.tensor([[1.0, 2.0, 0.0, -1.0]], dtype=torch.float64)
    weights, ids, _ = reference(logits, torch.zeros(4), 2, "softmax", False, 16.0)
    assert ids.tolist() == [[1, 0]]
    torch.testing.assert_close(weights[0], 16.0 * torch.softmax(logits[0], -1)[[1, 0]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_inputs_are_tie_free_in_their_dtype_and_route_in_float32(dtype):
    from workbench.blocks.moe_router import near_tie_logits

    for shape in SPEC.shapes["smoke"] + SPEC.shapes["edge"]:
        a, b = make_inputs(shape, dtype, 7), make_inputs(shape, dtype, 7)
        assert a["logits"].dtype == dtype and a["logits"].shape == (shape["N"], shape["E"])
        assert torch.equal(a["logits"], b["logits"]) and a["bias"].dtype == torch.float32
        assert not near_tie_logits(a["logits"], a["bias"], shape["k"], a["score_func"], None, a["n_group"],
                                   a["topk_group"]).any()
        weights, ids, counts = reference(**a)
        assert weights.dtype == torch.float32 and ids.dtype == counts.dtype == torch.int64
        assert int(counts.sum()) == shape["N"] * shape["k"]


def test_hidden_shapes_route_in_every_mode_and_hold_their_groups():
    rng = random.Random(0)
    draws = [s for _ in range(40) for s in hidden_shapes(rng)]
    assert {s["mode"] for s in draws} == set(MODES) and any("G" in s for s in draws)
    for s in draws:
        make_inputs(s, torch.float32, 0)  # every draw is routable (groups checked) and tie-free


def test_spec_and_the_onboarding_rule_follow_moe_routers():
    from workbench.models import get_model

    assert SPEC.arg_names == ("logits", "bias", "topk", "score_func", "renormalize", "route_scale", "n_group",
                              "topk_group")
    assert SPEC.grad_inputs == () and 2 not in MODES  # no Skywork normalization: no serving router computes it
    card = get_model("kimi-k3")
    router, topk = card.blocks["moe_router"], card.blocks["moe_topk"]
    assert topk["shapes"] == [{k: v for k, v in s.items() if k != "D"} for s in router["shapes"]]
    assert topk["layers"] == router["layers"] == 92 and "serving" in topk["role"]


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("moe_topk")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["rounds", "bitonic"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "moe_topk", template, base_seed=3, forward_only=True)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:weights", "forward:ids", "forward:counts"}


@pytest.mark.interpreter
def test_the_verifier_refuses_a_selection_that_ignores_the_groups(tmp_path):
    from workbench.templating import load_template
    from workbench.verify.harness import verify_candidate

    template = load_template("moe_topk", "bitonic")
    source = template.render(next(template.points()))
    assert source.count("    if GROUPED:\n") == 1
    path = tmp_path / "moe_topk_no_groups.py"
    path.write_text(source.replace("    if GROUPED:\n", "    if False:\n"))
    result = verify_candidate(path, suites=["smoke"], dtypes=["float32"], seeds=1, base_seed=3)
    assert result.verdict == "fail" and "forward:ids" in {c.direction for c in result.failing()}
