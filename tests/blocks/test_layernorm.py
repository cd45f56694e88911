"""layernorm: hand cases (a constant row, a centred offset), gradients and their closed form, the inputs, the
onboarding rule and both templates verified on the Triton interpreter. The modules it is held to (torch's
nn.LayerNorm as the DSA indexers call it) are in workbench.integrations.references."""

from __future__ import annotations

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks._rows import ROW_SUITES
from workbench.blocks.layernorm import make_inputs

SPEC = get_block("layernorm")


def test_hand_cases_a_constant_row_and_an_offset_row():
    x = torch.tensor([[5.0, 5.0, 5.0, 5.0], [101.0, 99.0, 101.0, 99.0]], dtype=torch.float64)
    w = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    b = torch.tensor([0.5, 0.0, -0.5, 1.0], dtype=torch.float64)
    y = SPEC.reference(x, w, b, 1e-6)
    torch.testing.assert_close(y[0], b, rtol=0, atol=0)  # a constant row: only the bias
    scale = 1 / (1 + 1e-6) ** 0.5  # the offset row is 100 +- 1: centred, unit variance
    torch.testing.assert_close(y[1], torch.tensor([1, -1, 1, -1], dtype=torch.float64) * scale * w + b)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (4,), w, b, 1e-6), rtol=1e-14, atol=1e-14)


def test_gradients_gradcheck_float64_and_the_closed_form():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: SPEC.reference(x, w, b, 1e-6), (x, w, b))
    dy = torch.randn(3, 7, dtype=torch.float64, generator=g)
    dx, dw, db = torch.autograd.grad(SPEC.reference(x, w, b, 1e-6), (x, w, b), dy)
    centred = x - x.mean(-1, keepdim=True)
    rstd = (centred.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()
    xhat, wdy = centred * rstd, w * dy
    torch.testing.assert_close(dx, rstd * (wdy - wdy.mean(-1, keepdim=True)
                                           - xhat * (xhat * wdy).mean(-1, keepdim=True)))  # the kernels' form
    torch.testing.assert_close(dw, (dy * xhat).sum(0)) and torch.testing.assert_close(db, dy.sum(0))


@pytest.mark.parametrize("shape", ROW_SUITES["smoke"] + ROW_SUITES["edge"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_make_inputs_shapes_dtypes_offsets_and_outliers(shape, dtype):
    a, b = make_inputs(shape, dtype, 5), make_inputs(shape, dtype, 5)
    rows, n = shape["rows"], shape["N"]
    assert a["x"].shape == (rows, n) and a["weight"].shape == a["bias"].shape == (n,)
    assert all(torch.equal(a[k], b[k]) and a[k].dtype == dtype for k in ("x", "weight", "bias"))
    assert float(a["x"].float().abs().max()) >= 50  # the massive-activation channels
    if rows >= 7:  # the row offsets: the rows' means spread well beyond a unit normal's
        assert float(a["x"].float().median(dim=-1).values.std()) > 1.5


def test_spec_and_the_onboarding_rule():
    from transformers import DeepseekV32Config

    from workbench.blocks._config import Config, ModelConfig

    assert SPEC.arg_names == ("x", "weight", "bias", "eps") and SPEC.grad_inputs == ("x", "weight", "bias")
    model = ModelConfig(cfg=Config(DeepseekV32Config().to_dict()), hidden=7168, hidden_field="hidden_size",
                        layers=61, vocab=None, vocab_field=None, heads=128, heads_field=None, head_dim=None,
                        kda_layers=0, full_layers=61, linear={}, linear_field=None)
    (found,) = SPEC.onboard(model)
    assert found.layers == 61 and found.shapes == [{"rows": 8192, "N": 128}]
    assert found.fields == ["index_topk", "index_head_dim"]
    assert SPEC.onboard(ModelConfig(**{**model.__dict__, "cfg": Config({"hidden_size": 64})})) == []


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("layernorm")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["row_block", "col_tiled"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "layernorm", template, base_seed=3)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:y", "grad:x", "grad:weight", "grad:bias"}
