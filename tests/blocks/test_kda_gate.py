"""kda_gate: the reference against the formula in float64 and its bounds, the unbounded form it replaces, float64
gradients against the closed forms of the block's docstring, the input factory and suites, the templates; both
templates verified through the sandbox on the Triton interpreter, and one port through the agent."""

from __future__ import annotations

import math

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.kda_gate import LOWER_BOUND

SPEC = get_block("kda_gate")
ref = SPEC.reference


def test_hand_case_and_bounds():
    f = torch.tensor([[[[0.0, 1.0, -1e4, 1e4]]]], dtype=torch.float64)  # B=T=H=1, K=4
    a_log = torch.tensor([math.log(2.0)], dtype=torch.float64)
    dt = torch.tensor([[0.5, 0.0, 0.0, 0.0]], dtype=torch.float64)
    g = ref(f, a_log, dt, -5.0).flatten()
    expected = [-5.0 / (1 + math.exp(-2 * 0.5)), -5.0 / (1 + math.exp(-2.0)), 0.0, -5.0]
    torch.testing.assert_close(g, torch.tensor(expected, dtype=torch.float64))
    wide = SPEC.make_inputs({"B": 2, "T": 30, "H": 3, "K": 40}, torch.float32, 0)
    g = ref(**wide)
    assert ((g <= 0) & (g >= LOWER_BOUND)).all() and g.min() < 0.95 * LOWER_BOUND and g.max() > 0.05 * LOWER_BOUND


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_gate_is_float32_whatever_the_input(dtype):
    inputs = SPEC.make_inputs({"B": 1, "T": 4, "H": 2, "K": 8}, dtype, 1)
    assert ref(**inputs).dtype == torch.float32
    assert ref(**SPEC.make_inputs({"B": 1, "T": 4, "H": 2, "K": 8}, torch.float64, 1)).dtype == torch.float64


def test_gradients_equal_the_closed_forms():
    inputs = SPEC.make_inputs({"B": 2, "T": 3, "H": 2, "K": 5}, torch.float64, 2)
    f, a_log, dt = (inputs[k].requires_grad_() for k in ("f", "A_log", "dt_bias"))
    assert torch.autograd.gradcheck(lambda *t: ref(*t, LOWER_BOUND), (f, a_log, dt))
    dg = torch.randn(2, 3, 2, 5, dtype=torch.float64)
    df, da, ddt = torch.autograd.grad(ref(f, a_log, dt, LOWER_BOUND), (f, a_log, dt), dg)
    a = a_log.detach().exp()[:, None]
    z = a * (f.detach() + dt.detach())
    s = torch.sigmoid(z)
    u = dg * LOWER_BOUND * s * (1 - s)
    torch.testing.assert_close(df, u * a)
    torch.testing.assert_close(ddt, (u * a).sum((0, 1)))
    torch.testing.assert_close(da, (u * z).sum((0, 1, 3)))


def test_make_inputs_and_suites():
    inputs = SPEC.make_inputs({"B": 2, "T": 5, "H": 3, "K": 7}, torch.float16, 3)
    assert inputs["f"].shape == (2, 5, 3, 7) and inputs["A_log"].shape == (3,) and inputs["dt_bias"].shape == (3, 7)
    assert inputs["lower_bound"] == LOWER_BOUND == -5.0  # Kimi K3's gate_lower_bound
    assert (inputs["A_log"].float() >= 0).all() and (inputs["A_log"].float() <= math.log(16) + 1e-3).all()
    again = SPEC.make_inputs({"B": 2, "T": 5, "H": 3, "K": 7}, torch.float16, 3)
    assert all(torch.equal(inputs[k], again[k]) for k in ("f", "A_log", "dt_bias"))
    assert any(s["K"] == 72 for s in SPEC.shapes["edge"]) and any(s["T"] == 1 for s in SPEC.shapes["edge"])


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("kda_gate")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["k_tiled", "flat"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "kda_gate", template, base_seed=7)
    assert result.passed, result.message
    assert numeric_directions(result) == \
        {"forward:g", "grad:f", "grad:A_log", "grad:dt_bias"}


@pytest.mark.interpreter
def test_port_promotes_a_candidate_that_verifies(settings):
    from workbench.agent.run import port_block

    outcome = port_block("kda_gate", settings, seeds=1, budget=3)
    assert outcome.status == "promoted", outcome.reason
