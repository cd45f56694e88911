"""situ: the reference against the formula written out in float64 and hand cases (the soft caps, the saturated
tails), its gradients by gradcheck and against the closed forms of the block's docstring, the input factory and
suites, the templates; both templates verified through the sandbox on the Triton interpreter, a strided view on the
rows template, and one port of the block through the agent."""

from __future__ import annotations

import math

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.base import SUITES
from workbench.blocks.situ import BETA, LINEAR_BETA
from workbench.numerics import compute_dtype

SPEC = get_block("situ")
ref = SPEC.reference


def situ_f64(gate_up: torch.Tensor, beta: float, linear_beta: float) -> torch.Tensor:
    """The formula of the published Kimi K3 notes (workbench/blocks/situ.py), element by element in Python floats."""
    n = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], n, dtype=torch.float64)
    flat_in, flat_out = gate_up.double().reshape(-1, 2 * n), out.view(-1, n)
    for r in range(flat_in.shape[0]):
        for c in range(n):
            g, u = float(flat_in[r, c]), float(flat_in[r, n + c])
            flat_out[r, c] = beta * math.tanh(g / beta) / (1 + math.exp(-g)) * linear_beta * math.tanh(u / linear_beta)
    return out


def test_registered_with_signature_outputs_and_gradients():
    assert SPEC.arg_names == ("gate_up", "beta", "linear_beta")
    assert SPEC.grad_inputs == ("gate_up",) and SPEC.outputs == ("y",)
    assert (BETA, LINEAR_BETA) == (4.0, 25.0)  # Kimi K3's activation_situ_beta / activation_situ_linear_beta


def test_reference_equals_the_formula_on_random_inputs():
    x = SPEC.make_inputs({"rows": 3, "N": 7}, torch.float64, 0)["gate_up"]
    torch.testing.assert_close(ref(x, BETA, LINEAR_BETA), situ_f64(x, BETA, LINEAR_BETA), rtol=1e-12, atol=1e-12)


def test_hand_cases_and_the_soft_caps():
    x = torch.tensor([[0.0, 1.0, 0.0, 2.0]], dtype=torch.float64)  # gate (0, 1), up (0, 2)
    y = ref(x, 4.0, 25.0)
    assert y[0, 0] == 0.0  # a zero gate closes the row
    expected = 4 * math.tanh(0.25) / (1 + math.exp(-1)) * 25 * math.tanh(2 / 25)
    assert float(y[0, 1]) == pytest.approx(expected, rel=1e-14)
    huge = torch.tensor([[1e4, -1e4, 1e4, 1e4]], dtype=torch.float64)  # saturated: gate branch -> beta or 0
    torch.testing.assert_close(ref(huge, 4.0, 25.0), torch.tensor([[100.0, 0.0]], dtype=torch.float64))
    wide = SPEC.make_inputs({"rows": 64, "N": 64}, torch.float32, 1)["gate_up"]
    y = ref(wide, BETA, LINEAR_BETA)
    assert torch.isfinite(y).all() and y.abs().max() <= BETA * LINEAR_BETA  # bounded by both caps


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_returns_input_dtype_with_one_rounding(dtype):
    x = SPEC.make_inputs({"rows": 5, "N": 33}, dtype, 2)["gate_up"]
    y = ref(x, BETA, LINEAR_BETA)
    assert y.dtype == dtype and compute_dtype(x) == torch.float32
    assert torch.equal(y, situ_f64(x.double(), BETA, LINEAR_BETA).float().to(dtype)) or \
        (y.double() - situ_f64(x.double(), BETA, LINEAR_BETA)).abs().max() <= 1e-2 * BETA * LINEAR_BETA


def test_gradcheck_float64_and_the_closed_forms():
    x = SPEC.make_inputs({"rows": 2, "N": 5}, torch.float64, 3)["gate_up"] / 4
    assert torch.autograd.gradcheck(lambda t: ref(t, BETA, LINEAR_BETA), (x.clone().requires_grad_(),))
    x = x.clone().requires_grad_()
    dy = torch.randn(2, 5, dtype=torch.float64)
    (grad,) = torch.autograd.grad(ref(x, BETA, LINEAR_BETA), x, dy)
    gate, up = x.detach().chunk(2, dim=-1)
    s, tg, tu = torch.sigmoid(gate), torch.tanh(gate / BETA), torch.tanh(up / LINEAR_BETA)
    d_gate = dy * LINEAR_BETA * tu * ((1 - tg ** 2) * s + BETA * tg * s * (1 - s))
    d_up = dy * BETA * tg * s * (1 - tu ** 2)
    torch.testing.assert_close(grad, torch.cat([d_gate, d_up], dim=-1), rtol=1e-12, atol=1e-12)


def test_make_inputs_shapes_tails_and_determinism():
    inputs = SPEC.make_inputs({"rows": 8, "N": 100}, torch.float16, 5)
    assert inputs["gate_up"].shape == (8, 200) and inputs["gate_up"].dtype == torch.float16
    assert (inputs["beta"], inputs["linear_beta"]) == (BETA, LINEAR_BETA)
    gate, up = inputs["gate_up"].float().chunk(2, dim=-1)
    assert gate.abs().max() > 3 * BETA and up.abs().max() > 2 * LINEAR_BETA  # past both caps
    again = SPEC.make_inputs({"rows": 8, "N": 100}, torch.float16, 5)["gate_up"]
    assert torch.equal(inputs["gate_up"], again)
    assert not torch.equal(inputs["gate_up"], SPEC.make_inputs({"rows": 8, "N": 100}, torch.float16, 6)["gate_up"])


def test_suites():
    assert set(SPEC.shapes) == set(SUITES) - {"model"}
    assert any(s["N"] == 4097 for s in SPEC.shapes["edge"]) and any(s["N"] == 1 for s in SPEC.shapes["edge"])


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("situ")


# --- on the interpreter -------------------------------------------------------------------------------------------


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["flat", "rows"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "situ", template, base_seed=11)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:y", "grad:gate_up"}
    assert {c.dtype for c in result.checks if c.suite != "integrity"} == {"float32", "float16"}


@pytest.mark.interpreter
def test_port_promotes_a_candidate_that_verifies(settings):
    from workbench.agent.run import port_block

    outcome = port_block("situ", settings, seeds=1, budget=3)
    assert outcome.status == "promoted", outcome.reason
