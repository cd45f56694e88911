"""rmsnorm_gated: the reference against the formula written out in float64 and hand cases (the gate's saturated
tails, each activation), its gradients by gradcheck and against the closed forms of the block's docstring, one
rounding in low precision, the input factory, the suites and the onboarding rule, the templates; both templates
verified through the sandbox on the Triton interpreter, a strided view on row_tile, and one port through the agent."""

from __future__ import annotations

import math

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions

from workbench.blocks import get_block
from workbench.blocks._config import Config, ModelConfig
from workbench.blocks.base import SUITES
from workbench.blocks.rmsnorm_gated import ACTIVATIONS, EPS

SPEC = get_block("rmsnorm_gated")
ref = SPEC.reference


def gated_f64(x: torch.Tensor, w: torch.Tensor, gate: torch.Tensor, eps: float, activation: str) -> torch.Tensor:
    """The formula element by element in Python floats: x / sqrt(mean(x^2) + eps) * w * act(gate)."""
    xs, ws, gs = x.double().tolist(), w.double().tolist(), gate.double().tolist()
    out = []
    for row, gates in zip(xs, gs, strict=True):
        rms = math.sqrt(sum(v * v for v in row) / len(row) + eps)
        sig = [1 / (1 + math.exp(-g)) if g > -700 else 0.0 for g in gates]
        act = sig if activation == "sigmoid" else [g * s for g, s in zip(gates, sig, strict=True)]
        out.append([v / rms * wv * a for v, wv, a in zip(row, ws, act, strict=True)])
    return torch.tensor(out, dtype=torch.float64)


def test_registered_with_signature_outputs_gradients_and_family():
    assert SPEC.arg_names == ("x", "weight", "gate", "eps", "activation")
    assert SPEC.grad_inputs == ("x", "weight", "gate") and SPEC.outputs == ("y",)
    assert SPEC.family == "norm" and SPEC.replay == "K" and ACTIVATIONS == ("sigmoid", "silu")


@pytest.mark.parametrize("act", [0, 1])
def test_reference_equals_the_formula_on_random_inputs(act):
    inputs = SPEC.make_inputs({"rows": 5, "N": 13, "act": act}, torch.float64, act)
    assert inputs["activation"] == ACTIVATIONS[act]
    expected = gated_f64(inputs["x"], inputs["weight"], inputs["gate"], EPS, ACTIVATIONS[act])
    torch.testing.assert_close(ref(**inputs), expected, rtol=1e-12, atol=1e-12)


def test_hand_cases_and_the_saturated_gate():
    x = torch.tensor([[3.0, -4.0]], dtype=torch.float64)  # rms 5/sqrt(2): xhat = (0.6, -0.8) * sqrt(2)
    w = torch.tensor([1.0, 0.5], dtype=torch.float64)
    xhat = [0.6 * math.sqrt(2), -0.8 * math.sqrt(2)]
    gate = torch.tensor([[0.0, 2.0]], dtype=torch.float64)
    y = ref(x, w, gate, 0.0, "sigmoid")
    torch.testing.assert_close(y, torch.tensor([[xhat[0] * 0.5, xhat[1] * 0.5 / (1 + math.exp(-2))]],
                                               dtype=torch.float64), rtol=1e-14, atol=0)
    y = ref(x, w, gate, 0.0, "silu")
    assert y[0, 0] == 0.0  # silu(0) closes the channel; sigmoid(0) halves it
    assert float(y[0, 1]) == pytest.approx(xhat[1] * 0.5 * 2 / (1 + math.exp(-2)), rel=1e-14)
    tails = torch.tensor([[1e3, -1e3]], dtype=torch.float64)  # saturated: sigmoid -> 1 and 0, silu -> 1e3 and -0
    torch.testing.assert_close(ref(x, w, tails, 0.0, "sigmoid"), torch.tensor([[xhat[0], 0.0]], dtype=torch.float64))
    torch.testing.assert_close(ref(x, w, tails, 0.0, "silu"), torch.tensor([[1e3 * xhat[0], 0.0]],
                                                                             dtype=torch.float64))
    with pytest.raises(ValueError, match="unknown activation 'relu'"):
        ref(x, w, gate, EPS, "relu")


def test_eps_inside_the_root_and_each_row_on_its_own():
    x = torch.tensor([[1e-3, 0.0], [10.0, 0.0]], dtype=torch.float64)
    ones = torch.ones(2, dtype=torch.float64)
    gate = torch.full((2, 2), 50.0, dtype=torch.float64)  # sigmoid(50) = 1 to rounding
    y = ref(x, ones, gate, 1e-6, "sigmoid")
    assert float(y[0, 0]) == pytest.approx(1e-3 / math.sqrt(0.5e-6 + 1e-6), rel=1e-12)
    assert float(y[1, 0]) == pytest.approx(10 / math.sqrt(50 + 1e-6), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_returns_the_input_dtype_after_one_rounding(dtype):
    """Within half a unit in the last place of the float64 truth (a float32 result rounded once); a rounding in
    between (of the normed x, say, as Qwen3-Next's module does) would reach a whole unit."""
    inputs = SPEC.make_inputs({"rows": 6, "N": 40, "act": 1}, dtype, 2)
    y = ref(**inputs)
    truth = gated_f64(inputs["x"], inputs["weight"], inputs["gate"], EPS, "silu")
    half_ulp = 0.5 * torch.finfo(dtype).eps * truth.abs() + torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    assert y.dtype == dtype and ((y.double() - truth).abs() <= half_ulp * (1 + 1e-6)).all()


def test_float16_squares_do_not_overflow():
    x = torch.full((1, 8), 300.0, dtype=torch.float16)  # 300^2 = 90000: past float16's 65504
    y = ref(x, torch.ones(8, dtype=torch.float16), torch.full((1, 8), 30.0, dtype=torch.float16), EPS, "sigmoid")
    torch.testing.assert_close(y, torch.ones(1, 8, dtype=torch.float16), rtol=1e-3, atol=0)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gradcheck_float64_and_the_closed_forms(activation):
    inputs = SPEC.make_inputs({"rows": 3, "N": 6, "act": ACTIVATIONS.index(activation)}, torch.float64, 3)
    x, w, gate = (inputs[k].clone().requires_grad_() for k in ("x", "weight", "gate"))
    assert torch.autograd.gradcheck(lambda *t: ref(*t, EPS, activation), (x, w, gate))
    dy = torch.randn(3, 6, dtype=torch.float64)
    dx, dw, dgate = torch.autograd.grad(ref(x, w, gate, EPS, activation), (x, w, gate), dy)
    x, w, gate = x.detach(), w.detach(), gate.detach()
    rstd = 1 / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS)
    xhat, sig = x * rstd, torch.sigmoid(gate)
    s, slope = (sig, sig * (1 - sig)) if activation == "sigmoid" else (gate * sig, sig * (1 + gate * (1 - sig)))
    torch.testing.assert_close(dgate, dy * xhat * w * slope, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dw, (dy * s * xhat).sum(0), rtol=1e-12, atol=1e-12)
    wdys = w * dy * s
    torch.testing.assert_close(dx, rstd * (wdys - xhat * (xhat * wdys).mean(-1, keepdim=True)), rtol=1e-12,
                               atol=1e-12)


def test_make_inputs_outliers_saturated_gates_and_determinism():
    inputs = SPEC.make_inputs({"rows": 64, "N": 128, "act": 0}, torch.float16, 5)
    assert inputs["x"].shape == inputs["gate"].shape == (64, 128) and inputs["weight"].shape == (128,)
    assert inputs["x"].dtype == torch.float16 and (inputs["eps"], inputs["activation"]) == (EPS, "sigmoid")
    x, gate = inputs["x"].float(), inputs["gate"].float()
    assert ((x.abs() >= 8).all(0)).sum() >= 128 // 32  # the outlier channels, in every row
    wide = SPEC.make_inputs({"rows": 3, "N": 4097, "act": 1}, torch.float16, 5)["x"].float()
    assert ((wide * wide).sum(-1) > 65504).all()  # at the widest edge shape, past a float16 accumulator
    assert gate.max() > 20 and gate.min() < -20  # both of the sigmoid's saturated tails
    again = SPEC.make_inputs({"rows": 64, "N": 128, "act": 0}, torch.float16, 5)
    assert all(torch.equal(inputs[k], again[k]) for k in ("x", "weight", "gate"))
    assert not torch.equal(inputs["gate"], SPEC.make_inputs({"rows": 64, "N": 128, "act": 0}, torch.float16, 6)["gate"])


def test_suites_cover_both_activations_and_the_odd_sizes():
    assert set(SPEC.shapes) == set(SUITES) - {"model"}
    edge = SPEC.shapes["edge"]
    assert {s["act"] for s in edge} == {0, 1} and {s["act"] for s in SPEC.shapes["smoke"]} == {0, 1}
    assert any(s["rows"] == 1 for s in edge) and any(s["N"] == 1 for s in edge)
    assert any(s["N"] & (s["N"] - 1) for s in edge) and any(s["N"] == 4097 for s in edge)


def test_onboards_every_kda_layer_s_output_norm_at_tokens_times_heads():
    model = ModelConfig(cfg=Config({}), hidden=7168, hidden_field="hidden_size", layers=93, vocab=None,
                        vocab_field=None, heads=64, heads_field=None, head_dim=None, kda_layers=69, full_layers=24,
                        linear={}, linear_field="linear_attn_config", kda_heads=96, kda_head_dim=128,
                        kda_fields=["linear_attn_config.kda_layers", "linear_attn_config.num_heads",
                                    "linear_attn_config.head_dim"])
    (found,) = SPEC.onboard(model)
    assert found.layers == 69 and found.shapes == [{"rows": 8192 * 96, "N": 128, "act": 0}]
    assert found.fields == model.kda_fields and "sigmoid" in found.role
    model.kda_layers = 0
    assert SPEC.onboard(model) == []


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("rmsnorm_gated")


# --- on the interpreter -------------------------------------------------------------------------------------------


def render_covering_point(tmp_path, template: str):
    """The template's first point that meets its requirements on every smoke and edge shape (the point the search
    proposer starts from: row_tile's first BLOCK_N that covers 4097 columns), rendered to tmp_path."""
    from workbench.templating import load_template

    t = load_template("rmsnorm_gated", template)
    shapes = [s for suite in ("smoke", "edge") for s in SPEC.shapes[suite]]
    point = next(p for p in t.points() if not any(t.unmet(p, s) for s in shapes))
    path = tmp_path / f"rmsnorm_gated_{template}.py"
    path.write_text(t.render(point))
    return path


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["row_tile", "col_tiled"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    from workbench.backends import get_backend
    from workbench.verify.harness import verify_candidate

    path = render_covering_point(tmp_path, template)
    result = verify_candidate(path, backend=get_backend("interpreter"), seeds=1, base_seed=13)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:y", "grad:x", "grad:weight", "grad:gate"}
    assert {c.dtype for c in result.checks if c.suite != "integrity"} == {"float32", "float16"}
    assert {s.split("act=")[1] for s in (c.shape for c in result.checks if c.suite == "edge")} == {"0", "1"}


STRIDED_CHILD = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("candidate", sys.argv[1])
op = importlib.util.module_from_spec(spec)
spec.loader.exec_module(op)
torch.manual_seed(0)
wide = torch.randn(37, 2 * 96) * 3
x, gate, w = wide[:, :96], wide[:, 96:], torch.randn(96)
for act in ("sigmoid", "silu"):
    strided = [t.clone().requires_grad_() if t is w else t.detach().requires_grad_() for t in (x, w, gate)]
    flat = [t.contiguous().clone().requires_grad_() for t in (x, w, gate)]
    y, z = op.run(strided[0], strided[1], strided[2], 1e-5, act), op.run(flat[0], flat[1], flat[2], 1e-5, act)
    dy = torch.randn(37, 96)
    grads = zip(torch.autograd.grad(y, strided, dy), torch.autograd.grad(z, flat, dy), strict=True)
    assert torch.equal(y, z) and all(torch.equal(a, b) for a, b in grads), act
print("ok")
"""


@pytest.mark.interpreter
def test_row_tile_takes_strided_rows_and_computes_what_it_computes_on_copies(tmp_path):
    """x and gate as the two halves of one wider buffer (rows at a stride of 192, the last dim contiguous): the
    same outputs and gradients, bitwise, as on contiguous copies."""
    import os
    import subprocess
    import sys

    path = render_covering_point(tmp_path, "row_tile")
    done = subprocess.run([sys.executable, "-c", STRIDED_CHILD, str(path)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.interpreter
def test_port_promotes_a_candidate_that_verifies(settings):
    from workbench.agent.run import port_block

    outcome = port_block("rmsnorm_gated", settings, seeds=1, budget=3)
    assert outcome.status == "promoted", outcome.reason
