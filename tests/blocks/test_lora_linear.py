"""lora_linear: the reference against a loop over rows, the merged weight and hand-computed cases, precision handling,
float64 gradcheck and the gradients against their closed forms, the input factory and shape suites; and one port of
the block through the agent on the Triton interpreter."""

from __future__ import annotations

import math

import pytest
import torch
from template_checks import assert_templates_render_each_choice

from workbench.blocks import get_block
from workbench.blocks.base import SUITES, shape_label
from workbench.numerics import default_tolerance

SPEC = get_block("lora_linear")
ref = SPEC.reference


def f64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def loop_reference(x, W, A, B, scaling):
    """An independent formulation in float64: each output element as explicit sums, the rank-r update summed over
    the rank index."""
    x, W, A, B = x.double(), W.double(), A.double(), B.double()
    n, n_out, rank = x.shape[0], W.shape[0], A.shape[0]
    y = torch.zeros(n, n_out, dtype=torch.float64)
    for i in range(n):
        xa = [float((A[k] * x[i]).sum()) for k in range(rank)]
        for o in range(n_out):
            y[i, o] = float((W[o] * x[i]).sum()) + scaling * sum(float(B[o, k]) * xa[k] for k in range(rank))
    return y


def random_case(seed: int, n=3, n_in=5, n_out=4, rank=2):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, n_in, dtype=torch.float64, generator=g),
            torch.randn(n_out, n_in, dtype=torch.float64, generator=g),
            torch.randn(rank, n_in, dtype=torch.float64, generator=g),
            torch.randn(n_out, rank, dtype=torch.float64, generator=g))


# --- the reference ---------------------------------------------------------------------------------------------


def test_registered_with_signature_outputs_and_gradients():
    assert SPEC.name == "lora_linear"
    assert SPEC.arg_names == ("x", "W", "A", "B", "scaling")
    assert SPEC.outputs == ("y",)
    assert SPEC.grad_inputs == ("x", "A", "B"), "W is frozen: no gradient"
    assert SPEC.tolerance(torch.float16) == default_tolerance(torch.float16)
    assert SPEC.host_ops == ()


@pytest.mark.parametrize("seed", [0, 1])
def test_reference_equals_loop(seed):
    x, W, A, B = random_case(seed, n=3, n_in=7, n_out=5, rank=3)
    torch.testing.assert_close(ref(x, W, A, B, 0.75), loop_reference(x, W, A, B, 0.75), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_merged_weight_equals_unmerged(seed):
    x, W, A, B = random_case(seed, n=4, n_in=9, n_out=6, rank=2)
    merged = W + 2.0 * B @ A  # PEFT's merge: W + scaling * B A
    torch.testing.assert_close(ref(x, W, A, B, 2.0), x @ merged.T, rtol=1e-12, atol=1e-12)


def test_hand_case():
    # x = (1, 2), W = I, A = (1, 1): x A^T = 3; B = (1, 2)^T, scaling 0.5: y = (1, 2) + 0.5 * 3 * (1, 2) = (2.5, 5)
    y = ref(f64([[1.0, 2.0]]), f64([[1.0, 0.0], [0.0, 1.0]]), f64([[1.0, 1.0]]), f64([[1.0], [2.0]]), 0.5)
    torch.testing.assert_close(y, f64([[2.5, 5.0]]), rtol=0, atol=0)


def test_zero_B_is_the_base_layer_and_scaling_is_linear():
    x, W, A, B = random_case(2)
    torch.testing.assert_close(ref(x, W, A, torch.zeros_like(B), 2.0), x @ W.T, rtol=0, atol=0)  # PEFT's init
    base = x @ W.T
    torch.testing.assert_close(ref(x, W, A, B, 3.0) - base, 3 * (ref(x, W, A, B, 1.0) - base), rtol=1e-12,
                               atol=1e-12)


def test_float64_is_computed_in_float64():
    x, W, A, B = random_case(3, n=4, n_in=33, n_out=7, rank=5)
    y = ref(x, W, A, B, 2.0)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, loop_reference(x, W, A, B, 2.0), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_returns_input_dtype_with_one_rounding(dtype):
    inputs = SPEC.make_inputs({"N": 4, "IN": 64, "OUT": 8, "r": 4}, dtype, 0, "cpu")
    y = ref(**inputs)
    assert y.dtype == dtype
    truth = loop_reference(**inputs)
    # float32 math and one downcast: within half a unit in the last place of the largest value, plus float32 noise
    bound = torch.finfo(dtype).eps * float(truth.abs().max())
    assert float((y.double() - truth).abs().max()) <= bound


def test_float16_intermediates_are_not_rounded():
    # x A^T = 250.125 * 4.5 = 1125.5625 is not a float16 (spacing 1 there), and the base term cancels most of the
    # update: float32 math gives y = -2219.859375 + 2 * 1125.5625 = 31.265625 exactly (a float16); rounding x A^T to
    # float16 first would give 32.125
    def h(v: float) -> torch.Tensor:
        return torch.tensor([[v]], dtype=torch.float16)

    y = ref(h(250.125), h(-8.875), h(4.5), h(1.0), 2.0)
    assert y.dtype == torch.float16 and float(y) == 31.265625


def test_gradcheck_float64():
    x, W, A, B = random_case(4, n=3, n_in=4, n_out=5, rank=2)
    for t in (x, A, B):
        t.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, A, B: ref(x, W, A, B, 1.5), (x, A, B))


def test_gradients_match_their_closed_forms():
    """dx = dy W + s (dy B) A, dA = s (dy B)^T x, dB = s dy^T (x A^T); W takes no gradient."""
    x, W, A, B = random_case(5, n=6, n_in=7, n_out=5, rank=3)
    dy = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    leaves = [t.clone().requires_grad_(True) for t in (x, A, B)]
    y = ref(leaves[0], W, leaves[1], leaves[2], 2.0)
    dx, dA, dB = torch.autograd.grad(y, leaves, dy)
    torch.testing.assert_close(dx, dy @ W + 2.0 * (dy @ B) @ A, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dA, 2.0 * (dy @ B).T @ x, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dB, 2.0 * dy.T @ (x @ A.T), rtol=1e-12, atol=1e-12)


# --- input factory -----------------------------------------------------------------------------------------------


def all_shapes():
    return [s for suite in ("smoke", "edge") for s in SPEC.shapes[suite]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_make_inputs_shapes_dtypes(dtype):
    for shape in all_shapes():
        inputs = SPEC.make_inputs(shape, dtype, 0, "cpu")
        assert tuple(inputs) == SPEC.arg_names
        n, n_in, n_out, rank = shape["N"], shape["IN"], shape["OUT"], shape["r"]
        expected = {"x": (n, n_in), "W": (n_out, n_in), "A": (rank, n_in), "B": (n_out, rank)}
        for name, dims in expected.items():
            assert inputs[name].shape == dims, name
            assert inputs[name].dtype == dtype and torch.isfinite(inputs[name]).all(), name
        assert inputs["scaling"] == 2.0
        assert ref(**inputs).shape == (n, n_out)


def test_make_inputs_deterministic_and_the_same_problem_in_every_dtype():
    shape = SPEC.shapes["smoke"][0]
    first = SPEC.make_inputs(shape, torch.float32, 5, "cpu")
    again = SPEC.make_inputs(shape, torch.float32, 5, "cpu")
    other = SPEC.make_inputs(shape, torch.float32, 6, "cpu")
    half = SPEC.make_inputs(shape, torch.float16, 5, "cpu")
    for name in ("x", "W", "A", "B"):
        assert torch.equal(first[name], again[name]), name
        assert not torch.equal(first[name], other[name]), name
        assert torch.equal(half[name], first[name].half()), name


def test_make_inputs_are_realistic():
    n_in, n_out, rank = 512, 256, 16
    inputs = SPEC.make_inputs({"N": 256, "IN": n_in, "OUT": n_out, "r": rank}, torch.float64, 0, "cpu")
    x, W, A, B, s = inputs["x"], inputs["W"], inputs["A"], inputs["B"], inputs["scaling"]
    assert 0.9 < float(W.std() * math.sqrt(n_in)) < 1.1, "W ~ N(0, 1/IN)"
    bound = 1 / math.sqrt(n_in)  # PEFT: kaiming_uniform_(A, a=sqrt(5)) on fan_in = IN
    assert float(A.abs().max()) <= bound and float(A.abs().max()) > 0.95 * bound
    assert abs(float(A.mean())) < 0.05 * bound
    assert float(B.abs().min()) >= 0 and float(B.abs().max()) > 0, "B is not PEFT's zero init"
    base = x @ W.T
    update = s * (x @ A.T) @ B.T
    ratio = float(update.std() / base.std())
    assert 0.1 < ratio < 0.4, f"the update is a modest share of the output ({ratio:.2f})"


# --- shape suites -------------------------------------------------------------------------------------------------


def test_suites():
    assert set(SPEC.shapes) == {"smoke", "edge"} and set(SPEC.shapes) <= set(SUITES)
    edge = SPEC.shapes["edge"]
    for shape in all_shapes():
        assert set(shape) == {"N", "IN", "OUT", "r"}
        assert all(isinstance(v, int) and v >= 1 for v in shape.values())
        assert 1 <= shape["r"] <= 16
    assert any(s["N"] == 1 for s in edge), "a single row"
    assert any(s["r"] == 1 for s in edge), "rank 1"
    assert any(s["IN"] == 123 and s["OUT"] == 123 for s in edge), "widths that are no multiple of a tile"
    assert any(s["N"] > 64 for s in edge), "more rows than one row tile"
    assert len({shape_label(s) for s in edge}) == len(edge)


# --- templates ------------------------------------------------------------------------------------------------------


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("lora_linear")


# --- port on the interpreter ----------------------------------------------------------------------------------------


@pytest.mark.interpreter
def test_port_promotes_a_candidate_that_verifies(settings):
    from workbench.agent.run import port_block
    from workbench.verify.harness import verify_candidate

    outcome = port_block("lora_linear", settings, seeds=1, budget=4)
    assert outcome.status == "promoted", outcome.reason
    result = verify_candidate(outcome.operator_path, seeds=1, suites=["smoke"], base_seed=4321)  # another seed
    assert result.passed, result.message
    directions = {c.direction for c in result.checks}
    assert {"forward:y", "grad:x", "grad:A", "grad:B"} <= directions
    assert "grad:W" not in directions
    assert {c.dtype for c in result.checks if c.suite != "integrity"} >= {"float32", "float16"}
