"""rotary: the reference against transformers' own apply_rotary_pos_emb and apply_rotary_pos_emb_interleave (full and
partial rotary, both head layouts), the float64 gradient against the closed form of the block's docstring, the input
factory and suites, the templates; both verified through the sandbox on the Triton interpreter, and one port through the
agent."""

from __future__ import annotations

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block

SPEC = get_block("rotary")
ref = SPEC.reference


def transformers_rotary(inputs: dict) -> torch.Tensor:
    """DeepSeek-V3's modeling functions on x as [B, H, T, D], the channels past cos's width passed through, as the
    partial-rotary families split them; with rope_last, the last channels rotated and the first passed, as
    DeepseekV3Attention splits its query [nope | rope] and concatenates it back."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    x, r = inputs["x"].transpose(1, 2), inputs["cos"].shape[-1]
    apply = ds.apply_rotary_pos_emb_interleave if inputs["interleaved"] else ds.apply_rotary_pos_emb
    passed, rope = x.split([x.shape[-1] - r, r], dim=-1) if inputs["rope_last"] else (x[..., r:], x[..., :r])
    rotated, _ = apply(rope, rope, inputs["cos"], inputs["sin"])
    parts = [passed, rotated] if inputs["rope_last"] else [rotated, passed]
    return torch.cat(parts, dim=-1).transpose(1, 2)


@pytest.mark.parametrize("shape", SPEC.shapes["smoke"] + SPEC.shapes["edge"])
def test_reference_equals_transformers_apply_rotary_pos_emb(shape):
    inputs = SPEC.make_inputs(shape, torch.float64, 0)
    torch.testing.assert_close(ref(**inputs), transformers_rotary(inputs), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("interleaved", [False, True])
def test_any_cos_and_sin_are_read_as_transformers_reads_them(interleaved):
    """Halves of cos and sin that differ (no rotary module makes them, but nothing stops a caller): the half form
    reads both, the interleaved one the first only, as transformers' functions do; outputs and every gradient (x,
    cos and sin) equal in float64."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    g = torch.Generator().manual_seed(8)
    x, cos, sin = (torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()
                   for shape in ((2, 5, 3, 8), (2, 5, 8), (2, 5, 8)))
    apply = ds.apply_rotary_pos_emb_interleave if interleaved else ds.apply_rotary_pos_emb
    theirs = apply(x.transpose(1, 2), x.transpose(1, 2), cos, sin)[0].transpose(1, 2)
    ours = ref(x, cos, sin, interleaved)
    torch.testing.assert_close(ours, theirs, rtol=1e-14, atol=1e-14)
    dy = torch.randn_like(ours)
    for a, b in zip(torch.autograd.grad(ours, (x, cos, sin), dy), torch.autograd.grad(theirs, (x, cos, sin), dy),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-14)


def test_the_two_layouts_are_other_variants_of_each_other():
    inputs = SPEC.make_inputs({"B": 1, "T": 4, "H": 2, "D": 8, "R": 8}, torch.float64, 1)
    assert (ref(**inputs) - ref(**{**inputs, "interleaved": True})).abs().max() > 0.1


def test_a_rotation_keeps_each_pairs_norm_and_dot_products_depend_on_relative_position():
    inputs = SPEC.make_inputs({"B": 1, "T": 6, "H": 1, "D": 16, "R": 16}, torch.float64, 2)
    y = ref(**inputs)
    pairs = lambda v: v[..., :8] ** 2 + v[..., 8:] ** 2  # noqa: E731 - a pair's squared norm
    torch.testing.assert_close(pairs(y), pairs(inputs["x"]))
    same = inputs["x"][:, :1].expand(1, 6, 1, 16).contiguous()  # one vector at six positions
    rotated = ref(same, inputs["cos"], inputs["sin"])[0, :, 0]
    dots = rotated @ rotated.T
    torch.testing.assert_close(torch.diagonal(dots, 1), torch.diagonal(dots, 1)[:1].expand(5))  # equal shifts


@pytest.mark.parametrize("interleaved", [False, True])
def test_gradient_equals_the_closed_form(interleaved):
    inputs = SPEC.make_inputs({"B": 2, "T": 3, "H": 2, "D": 10, "R": 6, "interleaved": int(interleaved)},
                              torch.float64, 3)
    x = inputs["x"].requires_grad_()
    assert torch.autograd.gradcheck(lambda x: ref(x, inputs["cos"], inputs["sin"], interleaved), (x,))
    dy = torch.randn_like(x)
    (dx,) = torch.autograd.grad(ref(**inputs), (x,), dy)
    c, s, h = inputs["cos"][:, :, None], inputs["sin"][:, :, None], 3
    dx1 = dy[..., :h] * c[..., :h] + dy[..., h:6] * s[..., h:]
    dx2 = dy[..., h:6] * c[..., h:] - dy[..., :h] * s[..., :h]
    expected = torch.stack([dx1, dx2], -1).flatten(-2) if interleaved else torch.cat([dx1, dx2], -1)
    torch.testing.assert_close(dx, torch.cat([expected, dy[..., 6:]], -1))


def test_make_inputs_and_suites():
    inputs = SPEC.make_inputs({"B": 2, "T": 5, "H": 3, "D": 12, "R": 8, "interleaved": 1}, torch.float16, 4)
    assert inputs["x"].shape == (2, 5, 3, 12) and inputs["cos"].shape == inputs["sin"].shape == (2, 5, 8)
    assert inputs["interleaved"] is True and inputs["cos"].dtype == torch.float16
    torch.testing.assert_close(inputs["cos"][..., :4], inputs["cos"][..., 4:])  # transformers' repeated halves
    with pytest.raises(ValueError, match="even and at most D"):
        SPEC.make_inputs({"B": 1, "T": 1, "H": 1, "D": 8, "R": 10}, torch.float32, 0)
    shapes = SPEC.shapes["smoke"] + SPEC.shapes["edge"]
    assert {s.get("interleaved", 0) for s in shapes} == {0, 1} and any(s["R"] < s["D"] for s in shapes)
    assert any(s["H"] == 1 for s in shapes) and any((s["R"] // 2) & (s["R"] // 2 - 1) for s in shapes)
    assert {(s.get("interleaved", 0), s["R"] < s["D"]) for s in shapes if s.get("last")} == {(0, True), (1, True)}
    assert SPEC.make_inputs({"B": 1, "T": 2, "H": 1, "D": 8, "R": 4, "last": 1}, torch.float32, 0)["rope_last"]


def test_the_rope_part_last_rotates_the_last_channels_and_passes_the_first():
    """An MLA query [nope | rope]: the last R channels rotated as a rope part of their own is, the first D - R
    unchanged; gradients as the closed form's, the passed channels' dy through."""
    inputs = SPEC.make_inputs({"B": 2, "T": 3, "H": 2, "D": 14, "R": 6, "interleaved": 1, "last": 1}, torch.float64, 7)
    x = inputs["x"].requires_grad_()
    y = ref(**inputs)
    torch.testing.assert_close(y[..., :8], x[..., :8], rtol=0, atol=0)
    torch.testing.assert_close(y[..., 8:], ref(x[..., 8:], inputs["cos"], inputs["sin"], True), rtol=0, atol=0)
    assert torch.autograd.gradcheck(lambda x: ref(x, inputs["cos"], inputs["sin"], True, True), (x,))


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("rotary")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["tiled", "rows"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "rotary", template, base_seed=5)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:y", "grad:x"}


@pytest.mark.interpreter
def test_port_promotes_a_candidate_that_verifies(settings):
    from workbench.agent.run import port_block

    outcome = port_block("rotary", settings, seeds=1, budget=3)
    assert outcome.status == "promoted", outcome.reason
