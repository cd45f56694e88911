"""kda_prologue: hand cases (a zero row, eps), gradients and their closed form, the inputs, the onboarding rule and
both templates verified on the Triton interpreter. The published l2norms it is held to (Kimi Linear's, Qwen3-Next's)
are in workbench.integrations.references."""

from __future__ import annotations

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.kda_prologue import EPS, SHAPES, make_inputs

SPEC = get_block("kda_prologue")


def test_hand_cases_a_zero_row_and_the_eps():
    q = torch.tensor([[[[3.0, 4.0], [0.0, 0.0]]]], dtype=torch.float64)  # [1, 1, 2, 2]
    k = torch.tensor([[[[1e-3, 0.0], [0.0, -2.0]]]], dtype=torch.float64)
    q_n, k_n, beta = SPEC.reference(q, k, torch.tensor([[[0.0, 2.0]]], dtype=torch.float64), 1e-6)
    want = torch.tensor([[[[3.0, 4.0], [0.0, 0.0]]]], dtype=torch.float64) / (25 + 1e-6) ** 0.5
    torch.testing.assert_close(q_n, want, rtol=1e-15, atol=0)
    torch.testing.assert_close(k_n[0, 0, 0, 0], torch.tensor(1e-3 / (2e-6) ** 0.5, dtype=torch.float64))  # eps ~ x^2
    torch.testing.assert_close(beta, torch.tensor([[[0.5, 1 / (1 + 2.718281828459045 ** -2)]]], dtype=torch.float64))


def test_gradients_gradcheck_float64_and_the_closed_form():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 3, 2, 5, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(1, 3, 2, 5, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(1, 3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, b: SPEC.reference(q, k, b, 1e-6), (q, k, b))
    dy = torch.randn(q.shape, dtype=torch.float64, generator=g)
    (dq,) = torch.autograd.grad(SPEC.reference(q, k, b, 1e-6)[0], q, dy)
    r = ((q * q).sum(-1, keepdim=True) + 1e-6).rsqrt()
    y = q * r
    torch.testing.assert_close(dq, r * (dy - y * (y * dy).sum(-1, keepdim=True)))  # the kernels' form


@pytest.mark.parametrize("shape", SHAPES["smoke"] + SHAPES["edge"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_make_inputs_shapes_dtypes_and_the_rows_that_test_the_eps(shape, dtype):
    a, b = make_inputs(shape, dtype, 5), make_inputs(shape, dtype, 5)
    B, T, H, K, HV = (shape[n] for n in ("B", "T", "H", "K", "HV"))
    assert a["q"].shape == a["k"].shape == (B, T, H, K) and a["beta_logits"].shape == (B, T, HV)
    assert all(torch.equal(a[n], b[n]) and a[n].dtype == dtype for n in ("q", "k", "beta_logits"))
    norms = a["q"].float().pow(2).sum(-1)
    assert float(norms.min()) == 0.0 and (B * T * H < 8 or float(norms.max()) > 1)  # a zero row; ordinary rows
    assert a["eps"] == EPS


def test_spec_and_the_onboarding_rule():
    from transformers import KimiLinearConfig

    from workbench.blocks._config import Config, ModelConfig

    assert SPEC.arg_names == ("q", "k", "beta_logits", "eps") and SPEC.outputs == ("q_n", "k_n", "beta")
    assert SPEC.grad_inputs == ("q", "k", "beta_logits")
    fields = KimiLinearConfig().to_dict()
    model = ModelConfig(cfg=Config(fields), hidden=2304, hidden_field="hidden_size", layers=27, vocab=None,
                        vocab_field=None, heads=None, heads_field=None, head_dim=None, kda_layers=20, full_layers=7,
                        linear={}, linear_field=None, kda_heads=32, kda_head_dim=128)
    (found,) = SPEC.onboard(model)
    assert found.layers == 20 and found.shapes == [{"B": 1, "T": 8192, "H": 32, "K": 128, "HV": 32}]
    assert SPEC.onboard(ModelConfig(**{**model.__dict__, "kda_layers": 0})) == []


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("kda_prologue")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["rows", "tokens"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "kda_prologue", template, base_seed=3)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:q_n", "forward:k_n", "forward:beta", "grad:q", "grad:k",
                                          "grad:beta_logits"}
