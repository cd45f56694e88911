"""hyper_connection: the reference against a token-by-token formulation and hand cases (Sinkhorn's doubly stochastic
comb, the zero-parameter module), precision handling, float64 gradcheck through all three outputs, the input factory
and shape suites, the templates; and the fma_rows template verified on the Triton interpreter (the promoted dot_tiled
is verified by `workbench ci`)."""

from __future__ import annotations

import math

import pytest
import torch
from template_checks import assert_templates_render_each_choice, run_first_point

from workbench.blocks import get_block
from workbench.blocks.base import SUITES, shape_label

SPEC = get_block("hyper_connection")
ref = SPEC.reference


def token_by_token(x, fn, base, scale, norm_eps, hc_eps, sinkhorn_iters):
    """An independent formulation in float64: one token at a time, the norm, sigmoids and softmax by hand, Sinkhorn
    as explicit row and column loops."""
    t, n, d = x.shape
    x, fn, base, scale = x.double(), fn.double(), base.double(), scale.double()
    post, comb, collapsed = (torch.zeros(t, n, dtype=torch.float64), torch.zeros(t, n, n, dtype=torch.float64),
                             torch.zeros(t, d, dtype=torch.float64))

    def sigmoid(v):
        return 1 / (1 + math.exp(-v))

    for k in range(t):
        flat = x[k].reshape(-1)
        rms = math.sqrt(float((flat * flat).sum()) / (n * d) + norm_eps)
        m = [float((fn[j] * flat).sum()) / rms for j in range((2 + n) * n)]
        pre = [sigmoid(m[i] * float(scale[0]) + float(base[i])) + hc_eps for i in range(n)]
        post[k] = torch.tensor([2 * sigmoid(m[n + i] * float(scale[1]) + float(base[n + i])) for i in range(n)],
                               dtype=torch.float64)
        c = [[0.0] * n for _ in range(n)]
        for r in range(n):
            logits = [m[2 * n + r * n + j] * float(scale[2]) + float(base[2 * n + r * n + j]) for j in range(n)]
            e = [math.exp(v - max(logits)) for v in logits]
            c[r] = [v / sum(e) + hc_eps for v in e]
        for step in range(2 * sinkhorn_iters - 1):
            if step % 2 == 0:  # columns
                sums = [sum(c[r][j] for r in range(n)) + hc_eps for j in range(n)]
                c = [[c[r][j] / sums[j] for j in range(n)] for r in range(n)]
            else:  # rows
                c = [[v / (sum(row) + hc_eps) for v in row] for row in c]
        comb[k] = torch.tensor(c, dtype=torch.float64)
        collapsed[k] = sum(pre[i] * x[k, i] for i in range(n))
    return post, comb, collapsed


def random_case(seed: int, t=3, n=4, d=5):
    inputs = SPEC.make_inputs({"T": t, "N": n, "D": d, "iters": 20}, torch.float64, seed, "cpu")
    return inputs


# --- the reference ---------------------------------------------------------------------------------------------


def test_registered_with_signature_outputs_and_gradients():
    assert SPEC.arg_names == ("x", "fn", "base", "scale", "norm_eps", "hc_eps", "sinkhorn_iters")
    assert SPEC.outputs == ("post", "comb", "collapsed")
    assert SPEC.grad_inputs == ("x", "fn", "base", "scale")
    assert SPEC.family == "residual"


@pytest.mark.parametrize("iters", [1, 3, 20])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_reference_equals_token_by_token(n, iters):
    inputs = {**random_case(n, t=3, n=n, d=5), "sinkhorn_iters": iters}
    for ours, theirs in zip(ref(**inputs), token_by_token(**inputs), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-13)


def test_the_rounds_make_comb_doubly_stochastic():
    """The last step normalises columns (sums 1 up to hc_eps); the rows approach 1 round by round."""
    inputs = random_case(2, t=6)
    _, comb, _ = ref(**inputs)
    _, one_round, _ = ref(**{**inputs, "sinkhorn_iters": 1})
    ones = torch.ones(6, 4, dtype=torch.float64)
    torch.testing.assert_close(comb.sum(-2), ones, rtol=0, atol=1e-5)
    row_error = float((comb.sum(-1) - 1).abs().max())
    assert row_error < 1e-2 and row_error < float((one_round.sum(-1) - 1).abs().max()) / 10
    assert (comb > 0).all()


def test_zero_parameters_give_half_pre_unit_post_and_uniform_comb():
    """fn = 0, base = 0: pre = sigmoid(0) + eps, post = 2 sigmoid(0) = 1, comb = the uniform 1 / N (up to eps)."""
    x = torch.randn(2, 4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    post, comb, collapsed = ref(x, torch.zeros(24, 32, dtype=torch.float64), torch.zeros(24, dtype=torch.float64),
                                torch.ones(3, dtype=torch.float64), 1e-6, 1e-6, 20)
    torch.testing.assert_close(post, torch.ones(2, 4, dtype=torch.float64), rtol=0, atol=0)
    torch.testing.assert_close(comb, torch.full((2, 4, 4), 0.25, dtype=torch.float64), rtol=0, atol=1e-5)
    torch.testing.assert_close(collapsed, (0.5 + 1e-6) * x.sum(1), rtol=1e-14, atol=1e-14)  # summation order


def test_the_logits_see_the_normalised_streams():
    """Scaling every stream by 1000 leaves the weights as they were (the RMS norm), and scales the collapse."""
    inputs = {**random_case(3), "norm_eps": 0.0}
    post, comb, collapsed = ref(**inputs)
    post_k, comb_k, collapsed_k = ref(**{**inputs, "x": 1000 * inputs["x"]})
    torch.testing.assert_close(post_k, post, rtol=1e-12, atol=0)
    torch.testing.assert_close(comb_k, comb, rtol=1e-12, atol=0)
    torch.testing.assert_close(collapsed_k, 1000 * collapsed, rtol=1e-12, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_weights_in_float32_collapse_in_the_input_dtype(dtype):
    inputs = SPEC.make_inputs({"T": 8, "N": 4, "D": 64, "iters": 20}, dtype, 0, "cpu")
    post, comb, collapsed = ref(**inputs)
    assert post.dtype == comb.dtype == torch.float32 and collapsed.dtype == dtype
    _, _, truth = token_by_token(**inputs)
    eps = torch.finfo(dtype).eps  # float32 math, one rounding at the end
    assert float((collapsed.double() - truth).abs().max()) <= eps * float(truth.abs().max())


def test_float64_is_computed_in_float64():
    outputs = ref(**random_case(4))
    assert all(o.dtype == torch.float64 for o in outputs)


def test_gradcheck_float64_through_all_outputs():
    inputs = random_case(5, t=2, n=2, d=3)
    inputs["sinkhorn_iters"] = 4
    leaves = [inputs[name].requires_grad_(True) for name in SPEC.grad_inputs]

    def fn(x, fn_, base, scale):
        return ref(x, fn_, base, scale, inputs["norm_eps"], inputs["hc_eps"], inputs["sinkhorn_iters"])

    assert torch.autograd.gradcheck(fn, tuple(leaves))


# --- input factory and suites ------------------------------------------------------------------------------------


def all_shapes():
    return [s for suite in ("smoke", "edge") for s in SPEC.shapes[suite]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_make_inputs_shapes_dtypes(dtype):
    for shape in all_shapes():
        inputs = SPEC.make_inputs(shape, dtype, 0, "cpu")
        assert tuple(inputs) == SPEC.arg_names
        t, n, d = shape["T"], shape["N"], shape["D"]
        assert inputs["x"].shape == (t, n, d) and inputs["fn"].shape == ((2 + n) * n, n * d)
        assert inputs["base"].shape == ((2 + n) * n,) and inputs["scale"].shape == (3,)
        assert all(inputs[k].dtype == dtype and torch.isfinite(inputs[k]).all() for k in SPEC.grad_inputs)
        assert inputs["sinkhorn_iters"] == shape["iters"]


def test_make_inputs_are_realistic():
    """Logits of a few units: the sigmoids are neither saturated nor flat, the comb rows neither one-hot nor
    uniform; massive channels make float16 squares overflow."""
    inputs = SPEC.make_inputs({"T": 64, "N": 4, "D": 256, "iters": 20}, torch.float32, 0, "cpu")
    post, comb, _ = ref(**inputs)
    assert float(((post > 0.1) & (post < 1.9)).float().mean()) > 0.7 and float(post.std()) > 0.3
    top = comb.max(-1).values
    assert 0.3 < float(top.mean()) < 0.9
    assert float(inputs["x"].abs().max()) ** 2 * 4 * 256 > 65504


def test_suites():
    assert set(SPEC.shapes) == {"smoke", "edge"} and set(SPEC.shapes) <= set(SUITES)
    edge = SPEC.shapes["edge"]
    assert any(s["T"] == 1 for s in edge), "a single token"
    assert {s["N"] for s in edge} >= {1, 2, 3, 4}, "one to four streams"
    assert any(s["iters"] == 1 for s in edge), "a single column normalisation"
    assert any(s["D"] & (s["D"] - 1) for s in edge), "a non-power-of-two width"
    assert len({shape_label(s) for s in edge}) == len(edge)


def test_onboarding_reads_the_streams_and_rounds():
    """DeepSeek-V4's defaults (4 streams, 20 rounds, hidden 4096): both sub-layers of every layer; one stream is a
    plain residual, no hyper-connection; streams without Sinkhorn rounds are named another variant."""
    from transformers import DeepseekV4Config

    from workbench.blocks._config import Config, ModelConfig

    def model(data):
        return ModelConfig(cfg=Config(data), hidden=data["hidden_size"], hidden_field="hidden_size",
                           layers=data["num_hidden_layers"], vocab=None, vocab_field=None, heads=None,
                           heads_field=None, head_dim=None, kda_layers=0, full_layers=data["num_hidden_layers"],
                           linear={}, linear_field=None)

    fields = DeepseekV4Config().to_dict()
    found = SPEC.onboard(model(fields))
    assert found[0].shapes == [{"T": 8192, "N": 4, "D": 4096, "iters": 20, "calls": 2}]
    assert found[0].fields == ["hc_mult", "hc_sinkhorn_iters", "hidden_size"]
    assert SPEC.onboard(model({**fields, "hc_mult": 1})) == []
    no_rounds = SPEC.onboard(model({k: v for k, v in fields.items() if k != "hc_sinkhorn_iters"}))
    assert "HY-V4" in no_rounds[0].differs  # the pre/post-only form: another variant


# --- templates ------------------------------------------------------------------------------------------------------


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("hyper_connection")


@pytest.mark.interpreter
def test_fma_rows_computes_the_reference_forward_and_backward(tmp_path):
    """fma_rows' products (its own code; the weights, Sinkhorn and host code are dot_tiled's, verified in full by
    `workbench ci`) at GLM-5-Next's 4 streams and 20 rounds and at 3 streams off the tiles, float32: every output and
    gradient within float32 rounding of the float64 reference."""
    for shape in ({"T": 5, "N": 4, "D": 48, "iters": 20}, {"T": 3, "N": 3, "D": 40, "iters": 3}):
        found = run_first_point(tmp_path, "hyper_connection", "fma_rows", shape)
        assert set(found["outputs"]) == {"post", "comb", "collapsed"} and set(found["grads"]) == set(SPEC.grad_inputs)
        assert max(found["outputs"].values()) < 1e-5 and max(found["grads"].values()) < 1e-4, (shape, found)
