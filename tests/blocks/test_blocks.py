"""The block contract of rmsnorm and swiglu: references against hand-computed values, precision handling,
gradients, input factories, registry lookups and shape suites. Pure PyTorch on CPU; no Triton."""

from __future__ import annotations

import inspect
import math
import re

import pytest
import torch

from workbench.blocks import REGISTRY, get_block
from workbench.blocks.base import SUITES, shape_label
from workbench.errors import UnknownBlockError, WorkbenchError
from workbench.numerics import DEFAULT_TOLERANCES, Tolerance, compute_dtype, default_tolerance

RMSNORM = get_block("rmsnorm")
SWIGLU = get_block("swiglu")
BLOCKS = ["rmsnorm", "swiglu"]
LOWP = [torch.float16, torch.bfloat16]


def f64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def rmsnorm_f64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """The hand formula, written independently of the reference, entirely in float64."""
    x, w = x.double(), w.double()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps) * w


def swiglu_f64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.double(), b.double()
    return a / (1 + torch.exp(-a)) * b


def expected_input_shapes(block: str, shape: dict) -> dict[str, tuple[int, ...]]:
    rows, n = shape["rows"], shape["N"]
    if block == "rmsnorm":
        return {"x": (rows, n), "weight": (n,)}
    return {"a": (rows, n), "b": (rows, n)}


# --- registry ------------------------------------------------------------------------------------------------


def test_registry_names_match_specs():
    assert set(BLOCKS) <= set(REGISTRY)
    for name, spec in REGISTRY.items():
        assert spec.name == name
        assert get_block(name) is spec


def test_get_block_unknown_raises_with_known_names():
    with pytest.raises(UnknownBlockError) as info:
        get_block("no_such_block")
    message = str(info.value)
    assert isinstance(info.value, WorkbenchError)
    assert "no_such_block" in message
    for name in REGISTRY:
        assert name in message
    assert "\n" not in message


@pytest.mark.parametrize("block, args", [("rmsnorm", ("x", "weight", "eps")),
                                         ("swiglu", ("a", "b", "limit", "alpha", "up_offset"))])
def test_arg_names_equal_reference_signature(block, args):
    spec = get_block(block)
    assert spec.arg_names == args
    assert spec.arg_names == tuple(inspect.signature(spec.reference).parameters)


@pytest.mark.parametrize("block", BLOCKS)
def test_grad_inputs_and_outputs_are_consistent(block):
    spec = get_block(block)
    inputs = spec.make_inputs({"rows": 2, "N": 8}, torch.float32, 0, "cpu")
    assert spec.grad_inputs, "every block verifies at least one gradient"
    for name in spec.grad_inputs:
        assert isinstance(inputs[name], torch.Tensor) and inputs[name].is_floating_point()
    assert spec.outputs == ("y",)
    assert isinstance(spec.reference(**inputs), torch.Tensor)  # a single output, not a tuple
    assert "def reference" in spec.reference_source()
    assert all(re.fullmatch(r"aten\.\w+", op) for op in spec.host_ops), spec.host_ops
    quantities = {f"forward:{o}" for o in spec.outputs} | {f"grad:{i}" for i in spec.grad_inputs}
    assert set(spec.comparators) <= quantities, "a comparator is keyed by a quantity the block has"


# --- rmsnorm reference -----------------------------------------------------------------------------------------


def test_rmsnorm_hand_case():
    y = RMSNORM.reference(f64([[3.0, 4.0]]), f64([1.0, 2.0]), 0.0)
    rms = math.sqrt((9 + 16) / 2)  # sqrt(12.5)
    torch.testing.assert_close(y, f64([[3 / rms, 8 / rms]]), rtol=0, atol=1e-12)


def test_rmsnorm_hand_case_float32():
    y = RMSNORM.reference(torch.tensor([[3.0, 4.0]]), torch.tensor([1.0, 2.0]), 0.0)
    assert y.dtype == torch.float32
    rms = math.sqrt(12.5)
    torch.testing.assert_close(y, torch.tensor([[3 / rms, 8 / rms]]), rtol=1e-6, atol=0)


def test_rmsnorm_eps_is_added_inside_the_root():
    # mean(x^2) = 1, eps = 1: y = x / sqrt(2); an all-zero row stays zero instead of dividing by zero
    y = RMSNORM.reference(f64([[1.0, -1.0], [0.0, 0.0]]), f64([1.0, 1.0]), 1.0)
    torch.testing.assert_close(y, f64([[1 / math.sqrt(2), -1 / math.sqrt(2)], [0.0, 0.0]]), rtol=0, atol=1e-12)


def test_rmsnorm_normalizes_each_row_along_the_last_dim():
    x = torch.randn(2, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    w = torch.ones(5, dtype=torch.float64)
    y = RMSNORM.reference(x, w, 0.0)
    assert y.shape == x.shape
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(2, 3, dtype=torch.float64), rtol=0, atol=1e-12)


def test_rmsnorm_float64_is_computed_in_float64():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 37, dtype=torch.float64, generator=g) * 10
    w = 1 + 0.1 * torch.randn(37, dtype=torch.float64, generator=g)
    y = RMSNORM.reference(x, w, 1e-6)
    assert y.dtype == torch.float64
    # float32 math would be off by ~1e-7 relative; 1e-12 only holds if nothing is downcast on the way
    torch.testing.assert_close(y, rmsnorm_f64(x, w, 1e-6), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", LOWP)
def test_rmsnorm_low_precision_returns_input_dtype_with_one_rounding(dtype):
    inputs = RMSNORM.make_inputs({"rows": 4, "N": 64}, dtype, 0, "cpu")
    y = RMSNORM.reference(**inputs)
    assert y.dtype == dtype
    truth = rmsnorm_f64(inputs["x"], inputs["weight"], inputs["eps"])
    # float32 math and one downcast: within one low-precision rounding of the truth
    torch.testing.assert_close(y.double(), truth.to(dtype).double(), rtol=torch.finfo(dtype).eps, atol=1e-6)


def test_rmsnorm_float16_does_not_accumulate_squares_in_float16():
    # 300^2 = 90000 overflows float16 (max 65504): float16 accumulation would give inf -> y = 0
    x = torch.full((1, 8), 300.0, dtype=torch.float16)
    y = RMSNORM.reference(x, torch.ones(8, dtype=torch.float16), 1e-6)
    assert y.dtype == torch.float16
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, torch.ones(1, 8, dtype=torch.float16), rtol=1e-3, atol=0)


def test_rmsnorm_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, dtype=torch.float64, generator=g, requires_grad=True)
    w = (1 + 0.1 * torch.randn(7, dtype=torch.float64, generator=g)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: RMSNORM.reference(x, w, 1e-6), (x, w))


# --- swiglu reference ------------------------------------------------------------------------------------------


def test_swiglu_hand_cases():
    y = SWIGLU.reference(f64([0.0, 1.0, 20.0, -20.0, -1.0]), f64([5.0, 2.0, 3.0, 3.0, 4.0]))
    sig1 = 1 / (1 + math.exp(-1))
    expected = f64([0.0, 2 * sig1, 60 / (1 + math.exp(-20)), -60 / (1 + math.exp(20)), -4 * (1 - sig1)])
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-15)
    assert y[0] == 0  # silu(0) = 0 exactly
    assert abs(float(y[2]) - 60) < 1e-6  # a large: silu(a) ~ a, y ~ a * b
    assert abs(float(y[3])) < 1e-6  # a very negative: silu(a) ~ 0


def test_swiglu_float64_is_computed_in_float64():
    g = torch.Generator().manual_seed(0)
    a = 2 * torch.randn(5, 37, dtype=torch.float64, generator=g)
    b = torch.randn(5, 37, dtype=torch.float64, generator=g)
    y = SWIGLU.reference(a, b)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, swiglu_f64(a, b), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", LOWP)
def test_swiglu_low_precision_returns_input_dtype_with_one_rounding(dtype):
    inputs = SWIGLU.make_inputs({"rows": 4, "N": 64}, dtype, 0, "cpu")
    y = SWIGLU.reference(**inputs)
    assert y.dtype == dtype
    truth = swiglu_f64(inputs["a"], inputs["b"])
    torch.testing.assert_close(y.double(), truth.to(dtype).double(), rtol=torch.finfo(dtype).eps, atol=1e-6)


def test_swiglu_float16_tails_stay_finite():
    # exp(20) overflows float16: the reference upcasts, so both tails are finite and right
    a = torch.tensor([-20.0, 20.0], dtype=torch.float16)
    b = torch.tensor([3.0, 3.0], dtype=torch.float16)
    y = SWIGLU.reference(a, b)
    assert y.dtype == torch.float16
    assert torch.isfinite(y).all()
    assert abs(float(y[0])) < 1e-4
    assert float(y[1]) == 60.0


def test_swiglu_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    a = (2 * torch.randn(3, 7, dtype=torch.float64, generator=g)).requires_grad_()
    b = torch.randn(3, 7, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(SWIGLU.reference, (a, b))


def test_swiglu_variants_hand_cases():
    """GLM-5-Next's clamp (limit 3): the gate capped above, the up clamped both ways; GPT-OSS's alpha form (alpha
    1.702, up + 1) at the same limit."""
    a, b = f64([5.0, -5.0, 2.0, 3.0]), f64([1.0, 4.0, -7.0, -3.0])
    g, u = f64([3.0, -5.0, 2.0, 3.0]), f64([1.0, 3.0, -3.0, -3.0])
    clamped = SWIGLU.reference(a, b, 3.0)
    torch.testing.assert_close(clamped, g / (1 + torch.exp(-g)) * u, rtol=1e-12, atol=1e-15)
    alpha = SWIGLU.reference(a, b, 3.0, 1.702, 1.0)
    torch.testing.assert_close(alpha, g / (1 + torch.exp(-1.702 * g)) * (u + 1), rtol=1e-12, atol=1e-15)
    assert float(alpha[3]) == -2 * 3 / (1 + math.exp(-3 * 1.702))  # up at its lower bound, + 1


def test_swiglu_clamps_pass_the_gradient_within_their_bounds_bounds_included():
    """torch.clamp's rule, which the published modules' gate.clamp(max=L) and up.clamp(-L, L) follow: a gradient
    where the input lies within the bounds (a at L, b at -L or L included), 0 past them."""
    a = f64([4.0, 3.0, 1.0, 1.0, 1.0]).requires_grad_()
    b = f64([1.0, 1.0, 3.0, -3.0, 3.5]).requires_grad_()
    SWIGLU.reference(a, b, 3.0, 1.702, 1.0).sum().backward()
    assert a.grad[0] == 0 and a.grad[1] != 0 and all(a.grad[2:] != 0)
    assert b.grad[2] != 0 and b.grad[3] != 0 and b.grad[4] == 0


def test_swiglu_variant_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    a = (2 * torch.randn(3, 7, dtype=torch.float64, generator=g)).requires_grad_()
    b = (2 * torch.randn(3, 7, dtype=torch.float64, generator=g)).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: SWIGLU.reference(a, b, 2.5, 1.702, 1.0), (a, b))


def test_swiglu_suites_clamp_and_the_hidden_shapes_draw_a_variant():
    import random

    from workbench.blocks.swiglu import hidden_shapes

    for suite in ("smoke", "edge"):
        variants = [s for s in SWIGLU.shapes[suite] if s.get("limit")]
        assert variants and any(s.get("alpha_milli") for s in variants) and any(not s.get("alpha_milli")
                                                                               for s in variants)
    inputs = SWIGLU.make_inputs({"rows": 16, "N": 256, "limit": 3}, torch.float32, 0, "cpu")
    assert 0.05 < float((inputs["a"] > 3).float().mean()) and 0.05 < float((inputs["b"].abs() > 3).float().mean())
    plain, variant = hidden_shapes(random.Random(0))
    assert "limit" not in plain and 1 <= variant["limit"] <= 10


# --- input factories -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_make_inputs_declared_shapes_dtypes_device(block, dtype):
    spec = get_block(block)
    for suite in ("smoke", "edge"):
        for shape in spec.shapes[suite]:
            inputs = spec.make_inputs(shape, dtype, 0, "cpu")
            assert tuple(inputs) == spec.arg_names, "every argument of the reference, by name, in order"
            tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
            assert {k: tuple(v.shape) for k, v in tensors.items()} == expected_input_shapes(block, shape)
            for name, t in tensors.items():
                assert t.dtype == dtype, name
                assert t.device.type == "cpu", name
                assert torch.isfinite(t).all(), name
            if block == "rmsnorm":
                assert isinstance(inputs["eps"], float) and 0 < inputs["eps"] < 1e-3
            spec.reference(**inputs)  # the inputs are accepted by the reference as-is


@pytest.mark.parametrize("block", BLOCKS)
def test_make_inputs_deterministic_per_seed_and_differs_across_seeds(block):
    spec = get_block(block)
    shape = spec.shapes["smoke"][0]
    first = spec.make_inputs(shape, torch.float32, 7, "cpu")
    again = spec.make_inputs(shape, torch.float32, 7, "cpu")
    other = spec.make_inputs(shape, torch.float32, 8, "cpu")
    for name in spec.grad_inputs:
        assert torch.equal(first[name], again[name]), name
        assert not torch.equal(first[name], other[name]), name


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("dtype", LOWP)
def test_make_inputs_same_values_in_every_dtype(block, dtype):
    """A seed draws one problem; each dtype is that problem rounded, so dtypes are comparable."""
    spec = get_block(block)
    shape = spec.shapes["smoke"][0]
    f32 = spec.make_inputs(shape, torch.float32, 3, "cpu")
    low = spec.make_inputs(shape, dtype, 3, "cpu")
    for name in spec.grad_inputs:
        assert torch.equal(low[name], f32[name].to(dtype)), name


@pytest.mark.parametrize("shape", [{"rows": 16, "N": 256}, {"rows": 7, "N": 1000}, {"rows": 33, "N": 123}])
@pytest.mark.parametrize("seed", range(4))
def test_rmsnorm_inputs_have_outlier_channels(shape, seed):
    inputs = RMSNORM.make_inputs(shape, torch.float32, seed, "cpu")
    x, w = inputs["x"], inputs["weight"]
    assert float(x.abs().max()) > 40
    # a few whole channels are massive, the rest ~ N(0, 1)
    col_max = x.abs().amax(dim=0)
    assert int((col_max > 12).sum()) == max(1, shape["N"] // 64)  # N // 64 outlier channels, at least one
    assert float(x[:, col_max <= 12].abs().max()) < 7
    assert float(w.min()) > 0.4 and float(w.max()) < 1.6
    assert abs(float(w.mean()) - 1) < 0.1


def test_swiglu_gate_is_drawn_wide():
    inputs = SWIGLU.make_inputs({"rows": 16, "N": 256}, torch.float32, 0, "cpu")
    assert 1.7 < float(inputs["a"].std()) < 2.3  # N(0, 4): reaches the sigmoid tails
    assert 0.85 < float(inputs["b"].std()) < 1.15
    assert float(inputs["a"].abs().max()) > 6


# --- shape suites ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", BLOCKS)
def test_smoke_and_edge_suites(block):
    spec = get_block(block)
    assert set(spec.shapes) >= {"smoke", "edge"}
    assert set(spec.shapes) <= set(SUITES)
    assert "model" not in spec.shapes, "the model suite comes from the model cards"
    for suite in ("smoke", "edge"):
        assert spec.shapes[suite], suite
        for shape in spec.shapes[suite]:
            assert {"rows", "N"} <= set(shape) <= {"rows", "N", "limit", "alpha_milli"}
            assert all(isinstance(v, int) and v >= 1 for v in shape.values())
    edge = spec.shapes["edge"]
    assert any(s["rows"] == 1 for s in edge), "a single-row shape"
    assert any(s["N"] & (s["N"] - 1) for s in edge), "a non-power-of-two width"
    assert len({shape_label(s) for s in edge}) == len(edge), "no repeated shapes"


# --- small helpers of base ----------------------------------------------------------------------------------------


def test_shape_label():
    assert shape_label({"rows": 3, "N": 4097}) == "rows=3,N=4097"
    assert shape_label({}) == ""


@pytest.mark.parametrize("dtype, expected", [(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
                                             (torch.float32, torch.float32), (torch.float64, torch.float64)])
def test_compute_dtype(dtype, expected):
    assert compute_dtype(torch.zeros(1, dtype=dtype)) == expected


def test_tolerance_bound_and_defaults():
    tol = Tolerance(factor=2.0, atol=1e-5, rtol=1e-3)
    assert tol.bound(0.1, 10.0) == pytest.approx(2.0 * 0.1 + 1e-5 + 1e-3 * 10.0, rel=1e-15)
    assert tol.bound(0.0, 0.0) == pytest.approx(1e-5)
    assert set(DEFAULT_TOLERANCES) == {torch.float32, torch.float16, torch.bfloat16}
    for dtype in DEFAULT_TOLERANCES:
        assert default_tolerance(dtype) is DEFAULT_TOLERANCES[dtype]
    # looser floors for coarser types
    assert default_tolerance(torch.float32).rtol < default_tolerance(torch.float16).rtol
    assert default_tolerance(torch.float16).rtol < default_tolerance(torch.bfloat16).rtol
    for block in BLOCKS:
        assert get_block(block).tolerance(torch.float16) == default_tolerance(torch.float16)
