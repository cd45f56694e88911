"""attnres: the reference against an explicit loop over depth and hand-computed cases, precision handling, float64
gradcheck (both outputs, with and without the output norm), the input factory and shape suites; and one port of the
block through the agent on the Triton interpreter."""

from __future__ import annotations

import math

import pytest
import torch
from template_checks import assert_templates_render_each_choice

from workbench.blocks import get_block
from workbench.blocks.base import SUITES, shape_label
from workbench.numerics import default_tolerance

SPEC = get_block("attnres")
ref = SPEC.reference


def f64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def loop_reference(sources, query, key_weight, out_weight, eps, scale, normalized_values=False):
    """An independent formulation in float64: one source at a time, one token at a time, the softmax by hand;
    normalized_values mixes each source divided by its RMS."""
    n_src, n, d = sources.shape
    v, q, g = sources.double(), query.double(), key_weight.double()
    h = torch.zeros(n, d, dtype=torch.float64)
    p = torch.zeros(n_src, n, dtype=torch.float64)
    for t in range(n):
        logits = []
        for i in range(n_src):
            rms = math.sqrt(sum(float(x) ** 2 for x in v[i, t]) / d + eps)
            logits.append(scale * sum(float(v[i, t, j]) / rms * float(g[j]) * float(q[j]) for j in range(d)))
        top = max(logits)
        weights = [math.exp(s - top) for s in logits]
        total = sum(weights)
        for i in range(n_src):
            p[i, t] = weights[i] / total
            rms = math.sqrt(sum(float(x) ** 2 for x in v[i, t]) / d + eps) if normalized_values else 1.0
            h[t] += p[i, t] * v[i, t] / rms
        if out_weight is not None:
            h[t] = h[t] / math.sqrt(float((h[t] ** 2).mean()) + eps) * out_weight.double()
    return h, p


def random_case(seed: int, n_src=3, n=4, d=6, norm=True):
    g = torch.Generator().manual_seed(seed)
    depth_scale = f64([0.5 + (1.7 * i) % 3 for i in range(n_src)]).view(-1, 1, 1)  # 0.5, 2.2, 0.9, ...
    sources = torch.randn(n_src, n, d, dtype=torch.float64, generator=g) * depth_scale
    query = torch.randn(d, dtype=torch.float64, generator=g)
    key_weight = 1 + 0.1 * torch.randn(d, dtype=torch.float64, generator=g)
    out_weight = 1 + 0.1 * torch.randn(d, dtype=torch.float64, generator=g) if norm else None
    return sources, query, key_weight, out_weight


# --- the reference ---------------------------------------------------------------------------------------------


def test_registered_with_signature_outputs_and_gradients():
    assert SPEC.name == "attnres"
    assert SPEC.arg_names == ("sources", "query", "key_weight", "out_weight", "eps", "scale", "normalized_values")
    assert SPEC.outputs == ("h", "p")
    assert SPEC.grad_inputs == ("sources", "query", "key_weight", "out_weight")
    assert SPEC.tolerance(torch.float16) == default_tolerance(torch.float16)
    assert SPEC.host_ops == (), "the weight-gradient partials are reduced by a kernel, not on the host"


@pytest.mark.parametrize("values", ["raw", "normalized"])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_reference_equals_explicit_loop_over_depth(norm, seed, values):
    sources, query, key_weight, out_weight = random_case(seed, n_src=4, n=3, d=5, norm=norm)
    normalized = values == "normalized"
    h, p = ref(sources, query, key_weight, out_weight, 1e-6, 0.7, normalized)
    h_loop, p_loop = loop_reference(sources, query, key_weight, out_weight, 1e-6, 0.7, normalized)
    torch.testing.assert_close(h, h_loop, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(p, p_loop, rtol=1e-12, atol=1e-13)


def test_zero_query_is_the_uniform_average():
    sources, _, key_weight, _ = random_case(3, n_src=4, n=5, d=7)
    h, p = ref(sources, torch.zeros(7, dtype=torch.float64), key_weight, None, 1e-6, 1.0)
    torch.testing.assert_close(p, torch.full((4, 5), 0.25, dtype=torch.float64), rtol=0, atol=1e-15)
    torch.testing.assert_close(h, sources.mean(0), rtol=1e-14, atol=1e-14)


def test_zero_scale_is_the_uniform_average_whatever_the_query():
    sources, query, key_weight, _ = random_case(4, n_src=3, n=2, d=4)
    _, p = ref(sources, 100 * query, key_weight, None, 1e-6, 0.0)
    torch.testing.assert_close(p, torch.full((3, 2), 1 / 3, dtype=torch.float64), rtol=0, atol=1e-15)


def test_hand_case_two_sources():
    # one token, D = 2: v1 = (3, 4) has rms sqrt(12.5), v2 = (1, -1) has rms 1; key weight 1, query (1, 0), scale 1
    # logits: 3 / sqrt(12.5) and 1; p1 = 1 / (1 + exp(1 - 3 / sqrt(12.5)))
    sources = f64([[[3.0, 4.0]], [[1.0, -1.0]]])
    h, p = ref(sources, f64([1.0, 0.0]), f64([1.0, 1.0]), None, 0.0, 1.0)
    p1 = 1 / (1 + math.exp(1 - 3 / math.sqrt(12.5)))
    torch.testing.assert_close(p, f64([[p1], [1 - p1]]), rtol=0, atol=1e-15)
    torch.testing.assert_close(h, f64([[3 * p1 + (1 - p1), 4 * p1 - (1 - p1)]]), rtol=0, atol=1e-14)


def test_keys_are_rms_normalized_so_source_magnitude_does_not_change_its_logit():
    # v2 = 1000 * v1: identical keys, identical logits, p = 1/2 each, h = (v1 + v2) / 2
    v1 = f64([[0.3, -1.2, 2.0]])
    h, p = ref(torch.stack([v1, 1000 * v1]), f64([0.5, 2.0, -1.0]), f64([1.0, 0.9, 1.1]), None, 0.0, 1.0)
    torch.testing.assert_close(p, f64([[0.5], [0.5]]), rtol=0, atol=1e-15)
    torch.testing.assert_close(h, 500.5 * v1, rtol=1e-14, atol=0)


def test_single_source_passes_through():
    sources, query, key_weight, _ = random_case(5, n_src=1, n=3, d=4)
    h, p = ref(sources, query, key_weight, None, 1e-6, 1.0)
    assert torch.equal(p, torch.ones(1, 3, dtype=torch.float64))
    torch.testing.assert_close(h, sources[0], rtol=0, atol=0)


def test_output_norm_is_rmsnorm_of_the_mixture():
    sources, query, key_weight, out_weight = random_case(6, n_src=3, n=4, d=6)
    h_plain, p_plain = ref(sources, query, key_weight, None, 1e-6, 1.0)
    h, p = ref(sources, query, key_weight, out_weight, 1e-6, 1.0)
    torch.testing.assert_close(p, p_plain, rtol=0, atol=0)  # the norm is after the softmax: p is unchanged
    expected = h_plain / torch.sqrt(h_plain.pow(2).mean(-1, keepdim=True) + 1e-6) * out_weight
    torch.testing.assert_close(h, expected, rtol=1e-14, atol=1e-14)
    h_unit, _ = ref(sources, query, key_weight, torch.ones(6, dtype=torch.float64), 0.0, 1.0)
    torch.testing.assert_close(h_unit.pow(2).mean(-1), torch.ones(4, dtype=torch.float64), rtol=1e-13, atol=0)


def test_p_is_a_distribution_over_depth():
    inputs = SPEC.make_inputs({"L": 12, "N": 16, "D": 64, "norm": 1}, torch.float64, 0, "cpu")
    _, p = ref(**inputs)
    assert p.shape == (12, 16)
    assert (p > 0).all()
    torch.testing.assert_close(p.sum(0), torch.ones(16, dtype=torch.float64), rtol=0, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("norm", [0, 1])
def test_low_precision_returns_input_dtype_with_one_rounding(dtype, norm):
    inputs = SPEC.make_inputs({"L": 4, "N": 8, "D": 64, "norm": norm}, dtype, 0, "cpu")
    h, p = ref(**inputs)
    assert h.dtype == dtype and p.dtype == dtype
    h64, p64 = loop_reference(**inputs)
    # float32 math, one downcast: within about one rounding of the float64 truth
    eps = torch.finfo(dtype).eps
    assert float((h.double() - h64).abs().max()) <= eps * float(h64.abs().max())
    assert float((p.double() - p64).abs().max()) <= eps


def test_float16_sum_of_squares_does_not_overflow():
    # 300^2 = 90000 is past float16's max (65504): float16 accumulation of the key norm would give inf
    sources = torch.full((2, 1, 8), 300.0, dtype=torch.float16)
    sources[1] *= -1
    h, p = ref(sources, torch.ones(8, dtype=torch.float16), torch.ones(8, dtype=torch.float16),
               torch.ones(8, dtype=torch.float16), 1e-6, 1 / math.sqrt(8))
    assert torch.isfinite(h).all() and torch.isfinite(p).all()
    # logits +sqrt(8) and -sqrt(8): p1 = sigmoid(2 sqrt(8))
    p1 = 1 / (1 + math.exp(-2 * math.sqrt(8)))
    assert abs(float(p[0, 0]) - p1) < 1e-3
    torch.testing.assert_close(h.float(), torch.ones(1, 8), rtol=2e-3, atol=0)  # RMSNorm of a constant row


def test_float64_is_computed_in_float64():
    sources, query, key_weight, out_weight = random_case(7, n_src=5, n=3, d=9)
    h, p = ref(sources, query, key_weight, out_weight, 1e-6, 0.5)
    assert h.dtype == torch.float64 and p.dtype == torch.float64
    h_loop, p_loop = loop_reference(sources, query, key_weight, out_weight, 1e-6, 0.5)
    torch.testing.assert_close(h, h_loop, rtol=1e-13, atol=1e-13)  # float32 math would be off by ~1e-7


@pytest.mark.parametrize("norm", [False, True])
def test_gradcheck_float64_through_both_outputs(norm):
    sources, query, key_weight, out_weight = random_case(8, n_src=3, n=2, d=5, norm=norm)
    leaves = [sources, query, key_weight] + ([out_weight] if norm else [])
    for t in leaves:
        t.requires_grad_(True)

    def fn(*args):
        return ref(*args[:3], args[3] if norm else None, 1e-6, 0.8)

    assert torch.autograd.gradcheck(fn, tuple(leaves))


# --- input factory -----------------------------------------------------------------------------------------------


def all_shapes():
    return [s for suite in ("smoke", "edge") for s in SPEC.shapes[suite]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_make_inputs_shapes_dtypes(dtype):
    for shape in all_shapes():
        inputs = SPEC.make_inputs(shape, dtype, 0, "cpu")
        assert tuple(inputs) == SPEC.arg_names
        n_src, n, d = shape["L"], shape["N"], shape["D"]
        assert inputs["sources"].shape == (n_src, n, d)
        assert inputs["query"].shape == inputs["key_weight"].shape == (d,)
        if shape["norm"]:
            assert inputs["out_weight"].shape == (d,) and inputs["out_weight"].dtype == dtype
        else:
            assert inputs["out_weight"] is None
        for name in ("sources", "query", "key_weight"):
            assert inputs[name].dtype == dtype and torch.isfinite(inputs[name]).all(), name
        assert inputs["eps"] == 1e-6
        assert inputs["scale"] == pytest.approx(1 / math.sqrt(d))
        h, p = ref(**inputs)
        assert h.shape == (n, d) and p.shape == (n_src, n)


def test_make_inputs_deterministic_and_the_same_problem_in_every_dtype():
    shape = SPEC.shapes["smoke"][1]
    first = SPEC.make_inputs(shape, torch.float32, 5, "cpu")
    again = SPEC.make_inputs(shape, torch.float32, 5, "cpu")
    other = SPEC.make_inputs(shape, torch.float32, 6, "cpu")
    half = SPEC.make_inputs(shape, torch.float16, 5, "cpu")
    for name in SPEC.grad_inputs:
        assert torch.equal(first[name], again[name]), name
        assert not torch.equal(first[name], other[name]), name
        assert torch.equal(half[name], first[name].half()), name


def test_make_inputs_are_realistic():
    inputs = SPEC.make_inputs({"L": 12, "N": 64, "D": 256, "norm": 1}, torch.float32, 0, "cpu")
    v = inputs["sources"]
    rms = v.pow(2).mean(dim=(1, 2)).sqrt()
    assert float(rms.max() / rms.min()) > 2, "sources differ in magnitude across depth"
    col_max = v.abs().amax(dim=(0, 1))
    assert int((col_max > 40).sum()) >= 256 // 64 - 1, "shared massive-activation channels"
    assert float(v.abs().max()) ** 2 > 65504, "squares overflow float16: the kernel must accumulate in float32"
    _, p = ref(**inputs)
    top = p.max(0).values
    assert 0.2 < float(top.mean()) < 0.95, "the softmax over depth is neither uniform nor one-hot"


# --- shape suites -------------------------------------------------------------------------------------------------


def test_suites():
    assert set(SPEC.shapes) == {"smoke", "edge"} and set(SPEC.shapes) <= set(SUITES)
    edge = SPEC.shapes["edge"]
    for shape in all_shapes():
        assert {"L", "N", "D", "norm"} <= set(shape) <= {"L", "N", "D", "norm", "vnorm"} and shape["norm"] in (0, 1)
        assert all(isinstance(v, int) and v >= 0 for v in shape.values())
    assert any(s["L"] == 1 for s in edge), "a single source"
    assert any(s["N"] == 1 for s in edge), "a single token"
    assert any(s["L"] == 12 for s in edge), "the model's depth"
    assert any(s["D"] & (s["D"] - 1) for s in edge), "a non-power-of-two width"
    assert {s["norm"] for s in edge} == {0, 1}
    assert len({shape_label(s) for s in edge}) == len(edge)


# --- templates ------------------------------------------------------------------------------------------------------


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("attnres")


# --- port on the interpreter ----------------------------------------------------------------------------------------


@pytest.mark.interpreter
def test_port_promotes_a_candidate_that_verifies(settings):
    from workbench.agent.run import port_block
    from workbench.verify.harness import verify_candidate

    outcome = port_block("attnres", settings, seeds=1, budget=4)
    assert outcome.status == "promoted", outcome.reason
    result = verify_candidate(outcome.operator_path, seeds=1, suites=["smoke"], base_seed=4321)  # another seed
    assert result.passed, result.message
    directions = {c.direction for c in result.checks}
    assert {"forward:h", "forward:p", "grad:sources", "grad:query", "grad:key_weight", "grad:out_weight"} <= directions
    assert {c.dtype for c in result.checks if c.suite != "integrity"} >= {"float32", "float16"}
