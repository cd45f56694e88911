"""compare(): the verdict and figures of one output or gradient against the float64 truth."""

from __future__ import annotations

import math

import pytest
import torch

from workbench.numerics import Tolerance, compare
from workbench.verify.result import Check

TOL = Tolerance(factor=2.0, atol=1e-5, rtol=1e-5)
F32 = torch.float32


def truth_of(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def run(out, truth, ref_lowp=None, tol=TOL, expect=F32) -> dict:
    if ref_lowp is None:
        ref_lowp = truth.to(expect)
    return compare(out, truth, ref_lowp, tol, expect)


TRUTH = truth_of([[1.0, -2.0, 3.0], [0.5, 4.0, -0.25]])  # exactly representable in float32 and float16


def test_exact_output_passes_with_figures():
    result = run(TRUTH.float(), TRUTH)
    assert result["passed"] is True
    assert result["max_abs"] == 0.0 and result["max_rel"] == 0.0 and result["err_ratio"] == 0.0
    assert result["ref_err"] == 0.0
    assert result["nonfinite"] == 0
    assert result["bound"] == pytest.approx(TOL.bound(0.0, 4.0))
    Check(suite="smoke", shape="rows=2,N=3", dtype="float32", seed=0, direction="forward:y", **result)


def test_shape_mismatch():
    result = run(torch.zeros(3, 2), TRUTH)
    assert result["passed"] is False
    assert result["reason"] == "shape (3, 2), expected (2, 3)"


def test_dtype_mismatch():
    result = run(TRUTH.half(), TRUTH)
    assert result["passed"] is False
    assert "float16" in result["reason"] and "float32" in result["reason"]


def test_none_is_no_gradient():
    result = run(None, TRUTH)
    assert result["passed"] is False
    assert "no gradient" in result["reason"]


def test_not_a_tensor():
    result = run([1.0, 2.0], TRUTH)
    assert result["passed"] is False
    assert "list" in result["reason"] and "tensor" in result["reason"]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_where_truth_is_finite_fails(bad):
    out = TRUTH.float().clone()
    out[0, 1] = bad
    out[1, 2] = bad
    result = run(out, TRUTH)
    assert result["passed"] is False
    assert result["nonfinite"] == 2
    assert result["reason"].startswith("2 NaN/Inf where the reference is finite")


def test_error_above_the_bound_fails():
    out = TRUTH.float() + 0.01
    result = run(out, TRUTH)
    assert result["passed"] is False
    assert result["reason"].startswith("max abs err ")
    assert "> bound" in result["reason"] and "float32" in result["reason"]
    assert result["max_abs"] == pytest.approx(0.01, rel=1e-4)  # 0.01 after float32 rounding at scale 4
    assert result["bound"] == pytest.approx(TOL.bound(0.0, 4.0))
    assert result["nonfinite"] == 0


def test_error_within_factor_times_reference_error_plus_floor_passes():
    ref = TRUTH.float() + 0.01  # the reference's own float32 error: 0.01 (after rounding)
    ref_err = float((ref.double() - TRUTH).abs().max())
    assert ref_err == pytest.approx(0.01, rel=1e-4)
    inside = run(TRUTH.float() + 0.0199, TRUTH, ref)
    assert inside["passed"] is True, inside
    assert inside["ref_err"] == ref_err
    assert inside["bound"] == pytest.approx(TOL.factor * ref_err + TOL.atol + TOL.rtol * 4.0, rel=1e-12)
    assert inside["max_abs"] <= inside["bound"]
    # the floor counts: just above factor * ref_err but under factor * ref_err + atol + rtol * scale
    floor_only = run(TRUTH.float() + 0.02004, TRUTH, ref)
    assert floor_only["passed"] is True, floor_only
    outside = run(TRUTH.float() + 0.0202, TRUTH, ref)
    assert outside["passed"] is False
    assert outside["reason"].startswith("max abs err ")


def test_floor_alone_admits_rounding_of_an_exact_reference():
    truth = truth_of([1 / 3, 2 / 3, 1.0])
    out = truth.float()  # the rounding error of float32, ~3e-8, with an exact-in-float32 reference
    result = run(out, truth, ref_lowp=truth.float())
    assert result["passed"] is True
    assert 0 < result["max_abs"] < 1e-7


def test_nan_in_truth_matched_by_nan_passes():
    truth = truth_of([1.0, math.nan, math.inf, 2.0])
    out = torch.tensor([1.0, math.nan, math.inf, 2.0])
    result = run(out, truth)
    assert result["passed"] is True, result
    assert result["nonfinite"] == 0
    assert result["max_abs"] == 0.0


@pytest.mark.parametrize("value", [0.0, -math.inf, math.nan])
def test_nonfinite_truth_must_be_matched_exactly(value):
    truth = truth_of([1.0, math.inf])
    out = torch.tensor([1.0, value])
    result = run(out, truth)
    assert result["passed"] is False
    assert result["nonfinite"] == 1


def test_reference_overflow_does_not_poison_the_bound():
    """Where the low-precision reference is not finite but the truth is, its error is left out of ref_err."""
    truth = truth_of([1.0, 70000.0])
    ref = torch.tensor([1.0, math.inf], dtype=torch.float16)
    out = torch.tensor([1.0, 70000.0], dtype=torch.float32)
    result = run(out, truth, ref_lowp=ref, expect=F32)
    assert math.isfinite(result["ref_err"]) and math.isfinite(result["bound"])
    assert result["passed"] is True


def test_empty_tensors_pass():
    truth = torch.empty(0, 4, dtype=torch.float64)
    result = run(torch.empty(0, 4), truth)
    assert result["passed"] is True
    assert result["max_abs"] == 0.0


def test_empty_with_wrong_shape_still_fails():
    result = run(torch.empty(0, 3), torch.empty(0, 4, dtype=torch.float64))
    assert result["passed"] is False
    assert "shape" in result["reason"]


def test_all_zero_output_on_nonzero_truth_fails():
    result = run(torch.zeros(2, 3), TRUTH)
    assert result["passed"] is False
    assert result["max_abs"] == pytest.approx(4.0)
    assert result["err_ratio"] == pytest.approx(1.0, rel=1e-6)


def test_relative_figures():
    truth = truth_of([1.0, 2.0, -4.0])
    out = (truth * 1.01).float()
    result = run(out, truth)
    assert result["passed"] is False
    assert result["max_rel"] == pytest.approx(0.01, rel=1e-3)
    assert result["err_ratio"] == pytest.approx(0.01, rel=1e-3)
    assert result["max_abs"] == pytest.approx(0.04, rel=1e-5)


def test_output_that_requires_grad_is_compared():
    out = TRUTH.float().clone().requires_grad_()
    assert run(out, TRUTH)["passed"] is True


def test_float16_candidate_against_float16_reference():
    truth = torch.linspace(-3, 3, 101, dtype=torch.float64) / 3
    ref = truth.half()
    tol = Tolerance(factor=2.0, atol=1e-4, rtol=1e-3)
    assert run(truth.half(), truth, ref, tol, torch.float16)["passed"] is True
    # one float16 step further off everywhere is still within 2x the reference's rounding error plus the floor
    worse = (truth + 1e-3).half()
    assert run(worse, truth, ref, tol, torch.float16)["passed"] is True
    much_worse = (truth + 1e-2).half()
    assert run(much_worse, truth, ref, tol, torch.float16)["passed"] is False
