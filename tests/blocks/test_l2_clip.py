"""l2_clip: hand cases (a kept row, a clipped one, a zero row), gradients against the closed forms of the block's
docstring, the inputs (both sides of the threshold), the onboarding rule on Inkling2's config, and the template
verified on the Triton interpreter. The modules it is held to (Inkling2L2Clip, Inkling2ScaledL2Clip and the full
layers' log scaling) are in workbench.integrations.references."""

from __future__ import annotations

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.l2_clip import EPS

SPEC = get_block("l2_clip")
ref = SPEC.reference


def test_hand_cases_a_kept_row_a_clipped_row_and_a_zero_row():
    x = torch.tensor([[[[3.0, 4.0], [6.0, 8.0], [0.0, 0.0]]]], dtype=torch.float64)  # norms 5, 10, 0
    y = ref(x, None, None, 7.0)
    torch.testing.assert_close(y[0, 0, 0], x[0, 0, 0])  # shorter than the threshold: kept
    torch.testing.assert_close(y[0, 0, 1], x[0, 0, 1] * 7.0 / (10.0 + EPS))  # clipped to the threshold (but eps)
    assert not y[0, 0, 2].any()
    scale, tau = torch.tensor([[2.0, 2.0]] * 3, dtype=torch.float64), torch.tensor([[1.5]], dtype=torch.float64)
    torch.testing.assert_close(ref(x, scale, tau, 7.0)[0, 0, 0], x[0, 0, 0] * 2 * 7.0 / (10.0 + EPS) * 1.5)


def test_gradients_equal_the_closed_forms():
    inputs = SPEC.make_inputs({"B": 2, "T": 3, "H": 2, "D": 5, "scale": 1, "tau": 1}, torch.float64, 1)
    x, scale, tau = (inputs[k].requires_grad_() for k in ("x", "scale", "tau"))
    threshold = inputs["threshold"]
    assert torch.autograd.gradcheck(lambda x, s, t: ref(x, s, t, threshold), (x, scale, tau))
    dy = torch.randn(2, 3, 2, 5, dtype=torch.float64)
    dx, dscale, dtau = torch.autograd.grad(ref(x, scale, tau, threshold), (x, scale, tau), dy)
    u = x.detach() * scale.detach()
    norm = u.norm(dim=-1, keepdim=True)
    c = threshold / (norm + EPS)
    g = dy * tau.detach()[..., None, None]
    clipped = c * g - threshold / (norm + EPS) ** 2 * (u * g).sum(-1, keepdim=True) / norm * u
    du = torch.where(c < 1, clipped, g)
    assert (c < 1).any() and (c >= 1).any()  # both sides of the threshold
    torch.testing.assert_close(dx, du * scale.detach())
    torch.testing.assert_close(dscale, (du * x.detach()).sum((0, 1)))
    torch.testing.assert_close(dtau, (dy * u * c.clamp(max=1)).sum((2, 3)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inputs_sit_on_both_sides_of_the_threshold(dtype):
    inputs = SPEC.make_inputs({"B": 2, "T": 16, "H": 4, "D": 64, "scale": 1}, dtype, 3)
    norms = (inputs["x"].float() * inputs["scale"].float()).norm(dim=-1)
    clipped = (norms > inputs["threshold"]).float().mean()
    assert 0.2 < clipped < 0.8 and (norms == 0).sum() == 1 and inputs["tau"] is None
    assert inputs["x"].dtype == inputs["scale"].dtype == dtype and inputs["threshold"] == 8.0


def test_the_onboarding_rule_reads_inkling2s_attention():
    from transformers.models.inkling2.configuration_inkling2 import Inkling2TextConfig

    from workbench.blocks._config import Config, ModelConfig

    config = Inkling2TextConfig()
    model = ModelConfig(cfg=Config(config.to_dict()), hidden=config.hidden_size, hidden_field="hidden_size",
                        layers=config.num_hidden_layers, vocab=None, vocab_field=None,
                        heads=config.num_attention_heads, heads_field="num_attention_heads", head_dim=None,
                        kda_layers=0, full_layers=config.num_hidden_layers, linear={}, linear_field=None)
    (found,) = SPEC.onboard(model)
    tokens = model.tokens
    assert found.layers == config.num_hidden_layers and found.shapes == [
        {"B": 1, "T": tokens, "H": 48, "D": 128, "scale": 1, "tau": 1},  # the queries
        {"B": 1, "T": tokens, "H": 8, "D": 128},  # the keys
        {"B": 1, "T": tokens, "H": 48, "D": 16, "scale": 1, "tau": 1}]  # the relative states
    assert "qk_l2_clip_threshold" in found.fields
    no_clip = {k: v for k, v in config.to_dict().items() if k != "qk_l2_clip_threshold"}
    assert SPEC.onboard(ModelConfig(**{**model.__dict__, "cfg": Config(no_clip)})) == []


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("l2_clip")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["heads", "rows"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "l2_clip", template, base_seed=3)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:y", "grad:x", "grad:scale", "grad:tau"}
