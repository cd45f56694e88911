"""hyper_connection_mix: the reference against a stream-by-stream loop and GLM-5-Next's decoder layer expression,
hand cases, precision, float64 gradcheck, the input factory and suites, the templates; and d_split (its partial
gradients over several column tiles) verified on the Triton interpreter (the promoted token_block is verified by
`workbench ci`)."""

from __future__ import annotations

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.base import SUITES, shape_label

SPEC = get_block("hyper_connection_mix")
ref = SPEC.reference


def case(seed: int, t=3, n=4, d=5, dtype=torch.float64):
    return SPEC.make_inputs({"T": t, "N": n, "D": d}, dtype, seed, "cpu")


def test_registered_with_signature_outputs_and_gradients():
    assert SPEC.arg_names == ("y", "residual", "post", "comb")
    assert SPEC.outputs == ("out",) and SPEC.grad_inputs == ("y", "residual", "post", "comb")
    assert SPEC.family == "residual"


@pytest.mark.parametrize("n", [1, 2, 4])
def test_reference_equals_a_loop_over_streams(n):
    inputs = case(n, n=n)
    y, residual, post, comb = inputs.values()
    expected = torch.stack([post[:, j, None] * y + sum(comb[:, i, j, None] * residual[:, i] for i in range(n))
                            for j in range(n)], dim=1)
    torch.testing.assert_close(ref(**inputs), expected, rtol=1e-14, atol=1e-14)


def test_reference_is_the_decoder_layers_expression_in_float32():
    """Glm5NextTextDecoderLayer's (and DeepseekV4DecoderLayer's) ``post.unsqueeze(-1) * y.unsqueeze(-2) +
    comb^T @ residual`` on [B, S, ...]: the same values in float32, where its casts to the residual's dtype round
    nothing."""
    inputs = case(7, t=6, dtype=torch.float32)
    y, residual, post, comb = inputs.values()
    layer = post.view(2, 3, 4).unsqueeze(-1) * y.view(2, 3, 5).unsqueeze(-2) + torch.matmul(
        comb.view(2, 3, 4, 4).transpose(-1, -2), residual.view(2, 3, 4, 5))
    torch.testing.assert_close(ref(**inputs).view(2, 3, 4, 5), layer, rtol=1e-6, atol=1e-5)


def test_identity_comb_and_zero_post_pass_the_streams_through():
    inputs = case(2)
    out = ref(inputs["y"], inputs["residual"], torch.zeros_like(inputs["post"]),
              torch.eye(4, dtype=torch.float64).expand(3, 4, 4))
    torch.testing.assert_close(out, inputs["residual"], rtol=0, atol=0)


def test_a_doubly_stochastic_comb_keeps_the_streams_sum():
    """Columns summing to 1: sum_n out_n = sum_n post_n y + sum_m residual_m (what the Sinkhorn rounds are for)."""
    inputs = case(3)
    out = ref(**inputs)
    expected = inputs["post"].sum(-1, keepdim=True) * inputs["y"] + inputs["residual"].sum(1)
    torch.testing.assert_close(out.sum(1), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_rounds_once_to_the_residuals_dtype(dtype):
    inputs = case(4, t=8, d=64, dtype=dtype)
    out = ref(**inputs)
    assert out.dtype == dtype
    truth = ref(**{k: v.double() for k, v in inputs.items()})
    assert float((out.double() - truth).abs().max()) <= torch.finfo(dtype).eps * float(truth.abs().max())


def test_gradcheck_float64():
    leaves = [v.requires_grad_(True) for v in case(5, t=2, n=3, d=4).values()]
    assert torch.autograd.gradcheck(ref, tuple(leaves))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_make_inputs_shapes_dtypes(dtype):
    for shape in [s for suite in ("smoke", "edge") for s in SPEC.shapes[suite]]:
        inputs = SPEC.make_inputs(shape, dtype, 0, "cpu")
        t, n, d = shape["T"], shape["N"], shape["D"]
        assert tuple(inputs) == SPEC.arg_names
        assert inputs["y"].shape == (t, d) and inputs["residual"].shape == (t, n, d)
        assert inputs["post"].shape == (t, n) and inputs["comb"].shape == (t, n, n)
        assert inputs["y"].dtype == inputs["residual"].dtype == dtype
        weights = torch.float64 if dtype == torch.float64 else torch.float32  # as hyper_connection returns them
        assert inputs["post"].dtype == inputs["comb"].dtype == weights
        torch.testing.assert_close(inputs["comb"].sum(-2).double(), torch.ones(t, n, dtype=torch.float64),
                                   rtol=0, atol=1e-5)


def test_suites():
    assert set(SPEC.shapes) == {"smoke", "edge"} and set(SPEC.shapes) <= set(SUITES)
    edge = SPEC.shapes["edge"]
    assert any(s["T"] == 1 for s in edge) and {s["N"] for s in edge} >= {1, 2, 3, 4}
    assert any(s["D"] > 1024 for s in edge), "a row over several of d_split's column tiles"
    assert len({shape_label(s) for s in edge}) == len(edge)


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("hyper_connection_mix")


@pytest.mark.interpreter
def test_d_split_verifies_its_partial_gradients(tmp_path):
    result = verify_first_point(tmp_path, "hyper_connection_mix", "d_split", base_seed=1357)
    assert result.passed, result.message
    assert {"forward:out", "grad:y", "grad:residual", "grad:post", "grad:comb"} <= numeric_directions(result)
