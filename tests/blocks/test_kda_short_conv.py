"""kda_short_conv: the reference against causal_conv1d's own formulation (a grouped conv1d padded by W - 1 and cut
to T, the reference of Tri Dao's causal-conv1d that fla's ShortConvolution matches; the residual variants are held
to Inkling2's and Inkling's modules in workbench.integrations.references), causality, hand cases, float64
gradients against the closed forms of the block's docstring (every variant), the input factory and suites, the
templates; both templates verified through the sandbox on the Triton interpreter, and one port through the agent."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.kda_short_conv import INKLING2, INKLING2_DYNAMIC, variant

SPEC = get_block("kda_short_conv")
ref = SPEC.reference


def causal_conv1d_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """causal-conv1d's reference in the [B, T, D] layout: depthwise conv1d, padding W - 1, the first T outputs."""
    d, w = weight.shape
    out = F.conv1d(x.transpose(1, 2).double(), weight.double().unsqueeze(1), padding=w - 1, groups=d)
    return F.silu(out[..., :x.shape[1]]).transpose(1, 2)


@pytest.mark.parametrize("shape", [{"B": 2, "T": 9, "D": 5, "W": 4}, {"B": 1, "T": 2, "D": 3, "W": 4},
                                   {"B": 3, "T": 7, "D": 6, "W": 2}])
def test_reference_equals_causal_conv1d(shape):
    inputs = SPEC.make_inputs(shape, torch.float64, 0)
    torch.testing.assert_close(ref(**inputs), causal_conv1d_ref(inputs["x"], inputs["weight"]), rtol=1e-12,
                               atol=1e-12)
    assert (inputs["silu"], inputs["residual_scale"]) == (True, None)  # KDA's form where a shape names no variant


def test_a_token_never_sees_a_later_one():
    inputs = SPEC.make_inputs({"B": 1, "T": 12, "D": 4, "W": 4}, torch.float64, 1)
    later = inputs["x"].clone()
    later[:, 7:] += 100.0
    torch.testing.assert_close(ref(later, inputs["weight"])[:, :7], ref(**inputs)[:, :7])
    assert not torch.allclose(ref(later, inputs["weight"])[:, 7:], ref(**inputs)[:, 7:])


def test_hand_case():
    x = torch.tensor([[[1.0], [2.0], [3.0]]], dtype=torch.float64)  # B=1, T=3, D=1
    weight = torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.float64)  # taps for t-2, t-1, t
    pre = torch.tensor([2.0 * 1, -1.0 * 1 + 2.0 * 2, 0.5 * 1 - 1.0 * 2 + 2.0 * 3], dtype=torch.float64)
    torch.testing.assert_close(ref(x, weight).flatten(), F.silu(pre))
    torch.testing.assert_close(ref(x, weight, False, 0.5).flatten(), (pre + x.flatten()) * 0.5)
    # per-token taps: output t's own taps add to weight's (t = 2 reads 1, 2, 3 through 0.5 + 1, -1 - 1, 2 + 1)
    taps = torch.zeros(1, 3, 1, 3, dtype=torch.float64)
    taps[0, 2, 0] = torch.tensor([1.0, -1.0, 1.0])
    dynamic = ref(x, weight, False, None, taps).flatten()
    torch.testing.assert_close(dynamic, torch.tensor([2.0, 3.0, 1.5 * 1 - 2.0 * 2 + 3.0 * 3], dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_returns_input_dtype(dtype):
    inputs = SPEC.make_inputs({"B": 2, "T": 10, "D": 33, "W": 4}, dtype, 2)
    y = ref(**inputs)
    assert y.dtype == dtype
    truth = causal_conv1d_ref(inputs["x"].double(), inputs["weight"].double())  # KDA's form
    assert (y.double() - truth).abs().max() <= 2 ** -7 * truth.abs().max()  # one rounding of the result


@pytest.mark.parametrize("silu, residual_scale", [(True, None), (False, 5 ** -0.5), (True, 0.75), (False, None)])
def test_gradients_equal_the_closed_forms(silu, residual_scale):
    inputs = SPEC.make_inputs({"B": 2, "T": 6, "D": 3, "W": 4}, torch.float64, 3)
    x, weight = inputs["x"].requires_grad_(), inputs["weight"].requires_grad_()
    assert torch.autograd.gradcheck(lambda x, weight: ref(x, weight, silu, residual_scale), (x, weight))
    dy = torch.randn(2, 6, 3, dtype=torch.float64)
    dx, dweight = torch.autograd.grad(ref(x, weight, silu, residual_scale), (x, weight), dy)
    w, r = weight.shape[1], 1.0 if residual_scale is None else residual_scale
    padded = F.pad(x.detach(), (0, 0, w - 1, 0))
    pre = sum(weight.detach()[:, i] * padded[:, i:i + 6] for i in range(w))
    s = torch.sigmoid(pre)
    dpre = r * dy * (s * (1 + pre * (1 - s)) if silu else 1)
    later = F.pad(dpre, (0, 0, 0, w - 1))  # dpre = 0 past T
    through_taps = sum(weight.detach()[:, i] * later[:, w - 1 - i:w - 1 - i + 6] for i in range(w))
    torch.testing.assert_close(dx, through_taps + (r * dy if residual_scale is not None else 0))
    expected_dw = torch.stack([(dpre * padded[:, i:i + 6]).sum((0, 1)) for i in range(w)], dim=1)
    torch.testing.assert_close(dweight, expected_dw)


def test_dynamic_gradients_equal_the_closed_forms():
    """Inkling2's dynamic form, 3 groups of 2 channels: dx through each later output's own taps, dtaps summed over a
    group's channels."""
    inputs = SPEC.make_inputs({"B": 2, "T": 6, "D": 6, "W": 4, "G": 3, **INKLING2_DYNAMIC}, torch.float64, 4)
    x, weight, taps = (inputs[k].requires_grad_() for k in ("x", "weight", "taps"))
    r = inputs["residual_scale"]
    assert r == 9 ** -0.5 and taps.shape == (2, 6, 3, 4)
    assert torch.autograd.gradcheck(lambda x, weight, taps: ref(x, weight, False, r, taps), (x, weight, taps))
    dy = torch.randn(2, 6, 6, dtype=torch.float64)
    dx, dweight, dtaps = torch.autograd.grad(ref(x, weight, False, r, taps), (x, weight, taps), dy)
    coefficients = weight.detach()[None, None] + taps.detach().repeat_interleave(2, dim=2)  # [B, T, D, W]
    padded, dpre = F.pad(x.detach(), (0, 0, 3, 0)), r * dy
    later, later_c = F.pad(dpre, (0, 0, 0, 3)), F.pad(coefficients, (0, 0, 0, 0, 0, 3))
    through_taps = sum(later_c[:, 3 - i:9 - i, :, i] * later[:, 3 - i:9 - i] for i in range(4))
    torch.testing.assert_close(dx, through_taps + r * dy)
    torch.testing.assert_close(dweight, torch.stack([(dpre * padded[:, i:i + 6]).sum((0, 1)) for i in range(4)], 1))
    expected = torch.stack([(dpre * padded[:, i:i + 6]).view(2, 6, 3, 2).sum(-1) for i in range(4)], dim=-1)
    torch.testing.assert_close(dtaps, expected)
    with pytest.raises(ValueError, match="with G dividing D = 6"):
        ref(x, weight, False, r, taps[:, :, :2].repeat(1, 1, 2, 1))


def test_make_inputs_and_suites():
    inputs = SPEC.make_inputs({"B": 2, "T": 5, "D": 14, "W": 4}, torch.float16, 4)
    assert inputs["x"].shape == (2, 5, 14) and inputs["weight"].shape == (14, 4)
    assert inputs["x"].dtype == inputs["weight"].dtype == torch.float16
    again = SPEC.make_inputs({"B": 2, "T": 5, "D": 14, "W": 4}, torch.float16, 4)
    assert torch.equal(inputs["x"], again["x"]) and torch.equal(inputs["weight"], again["weight"])
    edge = SPEC.shapes["edge"]
    assert any(s["T"] < s["W"] for s in edge) and any(s["D"] == 1 for s in edge) and {s["W"] for s in edge} >= {2, 3, 4}
    forms = {(v["silu"], v["residual_scale"] is None) for v in map(variant, SPEC.shapes["smoke"] + edge)}
    assert forms == {(True, True), (False, False), (True, False)}  # KDA's, Inkling's and Inkling2's, SiLU + residual
    assert variant({"W": 4, **INKLING2}) == {"silu": False, "residual_scale": 5 ** -0.5}
    assert variant({"W": 4, **INKLING2_DYNAMIC}) == {"silu": False, "residual_scale": 9 ** -0.5}
    with pytest.raises(ValueError, match="residual 4 is none of"):
        variant({"W": 4, "residual": 4})
    # dynamic taps: one group, a group a channel, with SiLU and no residual; each smoke suite runs Inkling2's form
    groups = {(s["G"], s["D"] // s["G"]) for s in SPEC.shapes["smoke"] + edge if s.get("G")}
    assert {1, 12} <= {g for g, _ in groups} and (12, 1) in groups and any(s.get("G") and not s.get("linear")
                                                                          for s in edge)
    inputs = SPEC.make_inputs({"B": 2, "T": 5, "D": 14, "W": 4, "G": 7}, torch.float16, 4)
    assert inputs["taps"].shape == (2, 5, 7, 4) and inputs["taps"].dtype == torch.float16 and \
        SPEC.make_inputs({"B": 2, "T": 5, "D": 14, "W": 4}, torch.float16, 4)["taps"] is None


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("kda_short_conv")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["tiled", "seq_loop"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "kda_short_conv", template, base_seed=5)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:y", "grad:x", "grad:weight", "grad:taps"}


@pytest.mark.interpreter
def test_port_promotes_a_candidate_that_verifies(settings):
    from workbench.agent.run import port_block

    outcome = port_block("kda_short_conv", settings, seeds=1, budget=3)
    assert outcome.status == "promoted", outcome.reason
