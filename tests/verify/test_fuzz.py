"""Fuzzing the verifier's own comparison and the input factories: degenerate values never crash the verifier and
never let a NaN pass where the truth is a number."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.blocks import REGISTRY
from workbench.numerics import compare, default_tolerance

SPECIAL = st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf, 1e30, -1e30, 1e-30, 65504.0, 7e4])
VALUES = st.one_of(SPECIAL, st.floats(allow_nan=True, allow_infinity=True, width=32))
DTYPES = st.sampled_from([torch.float32, torch.float16])


@st.composite
def triples(draw):
    n = draw(st.integers(min_value=0, max_value=12))
    truth = torch.tensor(draw(st.lists(VALUES, min_size=n, max_size=n)), dtype=torch.float64)
    out = torch.tensor(draw(st.lists(VALUES, min_size=n, max_size=n)), dtype=torch.float64)
    ref = torch.tensor(draw(st.lists(VALUES, min_size=n, max_size=n)), dtype=torch.float64)
    return truth, out, ref, draw(DTYPES)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(triples())
def test_compare_never_crashes_and_never_passes_a_nan_for_a_number(case):
    truth, out, ref, dtype = case
    result = compare(out.to(dtype), truth, ref.to(dtype), default_tolerance(dtype), dtype)
    assert isinstance(result["passed"], bool)
    low = out.to(dtype).double()
    if (torch.isfinite(truth) & ~torch.isfinite(low)).any():
        assert not result["passed"]
    if result["passed"] and truth.numel():
        assert result["max_abs"] <= result["bound"]


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=6), st.integers(min_value=1, max_value=300), DTYPES,
       st.integers(min_value=0, max_value=2**31 - 1))
def test_row_block_inputs_are_finite_and_shaped(rows, n, dtype, seed):
    for name in ("rmsnorm", "swiglu"):
        spec = REGISTRY[name]
        inputs = spec.make_inputs({"rows": rows, "N": n}, dtype, seed, "cpu")
        tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        assert all(t.dtype == dtype and torch.isfinite(t).all() for t in tensors.values())
        out = spec.reference(*(inputs[a] for a in spec.arg_names))
        assert out.shape == (rows, n) and out.dtype == dtype
        assert torch.isfinite(spec.reference(*(inputs[a].double() if isinstance(inputs[a], torch.Tensor)
                                                else inputs[a] for a in spec.arg_names))).all()


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_block_factory_is_deterministic_and_reference_finite_on_its_suites(name):
    spec = REGISTRY[name]
    for suite in ("smoke", "edge"):
        for shape in spec.shapes.get(suite, []):
            a = spec.make_inputs(shape, torch.float32, 3, "cpu")
            b = spec.make_inputs(shape, torch.float32, 3, "cpu")
            for key, value in a.items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(value, b[key]), (name, shape, key)
            outs = spec.reference(*(a[k] for k in spec.arg_names))
            outs = outs if isinstance(outs, tuple) else (outs,)
            for o in outs:
                if o.is_floating_point():
                    finite_or_masked = torch.isfinite(o) | torch.isneginf(o)  # -inf marks masked scores
                    assert finite_or_masked.all(), (name, shape)
