"""mla: the reference against a per-head loop written from the formula, the absorbed (decode) form equal to the
decompressed one, causality, the output gate, float64 gradients, the whole layer around the block (with and without
RoPE), the input factory and suites, the templates; the decompressed template verified with its backward and the
absorbed one forward only through the sandbox on the Triton interpreter, the forward-only template kept out of a
training port, and one port through the agent."""

from __future__ import annotations

import math

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.mla import absorbed, layer_reference, rope_interleaved
from workbench.templating import list_templates

SPEC = get_block("mla")
ref = SPEC.reference
SHAPE = {"B": 2, "T": 7, "H": 3, "R": 10, "DN": 6, "DR": 4, "DV": 5, "gated": 1}


def loop_reference(q, c_kv, k_rope, w_uk, w_uv, gate, scale):
    """The formula of the block's docstring, one (b, h, t) at a time, in float64."""
    B, T, H, _ = q.shape
    dn = w_uk.shape[1]
    out = torch.zeros(B, T, H, w_uv.shape[1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            k_nope = c_kv[b] @ w_uk[h].T  # [T, DN]
            v = c_kv[b] @ w_uv[h].T
            for t in range(T):
                s = torch.stack([scale * (q[b, t, h, :dn] @ k_nope[j] + q[b, t, h, dn:] @ k_rope[b, j])
                                 for j in range(t + 1)])
                out[b, t, h] = torch.softmax(s, 0) @ v[: t + 1]
                if gate is not None:
                    out[b, t, h] *= torch.sigmoid(gate[b, t, h])
    return out


def inputs64(shape=SHAPE, seed=0):
    return SPEC.make_inputs(shape, torch.float64, seed)


@pytest.mark.parametrize("gated", [1, 0])
def test_reference_equals_the_per_head_loop(gated):
    inputs = inputs64({**SHAPE, "gated": gated})
    assert (inputs["gate"] is None) == (not gated)
    torch.testing.assert_close(ref(**inputs), loop_reference(**inputs))


@pytest.mark.parametrize("gated", [1, 0])
def test_the_absorbed_form_equals_the_decompressed_one(gated):
    inputs = inputs64({**SHAPE, "T": 12, "R": 16, "gated": gated}, seed=3)
    torch.testing.assert_close(absorbed(**inputs), ref(**inputs), rtol=1e-12, atol=1e-12)
    low = SPEC.make_inputs({**SHAPE, "gated": gated}, torch.float16, 3)
    assert absorbed(**low).dtype == ref(**low).dtype == torch.float16  # float32 math, one cast at the end


def test_causal_and_gated():
    inputs = inputs64()
    out = ref(**inputs)
    later = {**inputs, "c_kv": inputs["c_kv"].clone(), "k_rope": inputs["k_rope"].clone()}
    later["c_kv"][:, 4:] += 5.0  # keys after t = 3 change: outputs up to t = 3 cannot
    later["k_rope"][:, 4:] -= 5.0
    changed = ref(**later)
    torch.testing.assert_close(changed[:, :4], out[:, :4])
    assert not torch.allclose(changed[:, 4:], out[:, 4:])
    ungated = ref(**{**inputs, "gate": None})
    torch.testing.assert_close(out, ungated * torch.sigmoid(inputs["gate"]))
    first = inputs["c_kv"][:, 0] @ inputs["w_uv"].transpose(1, 2)  # t = 0 attends to itself only: v[0] per head
    torch.testing.assert_close(ungated[:, 0], first.transpose(0, 1))


def test_gradients_in_float64():
    inputs = inputs64({"B": 1, "T": 4, "H": 2, "R": 5, "DN": 3, "DR": 2, "DV": 3, "gated": 1}, seed=1)
    names = SPEC.grad_inputs
    leaves = tuple(inputs[n].requires_grad_() for n in names)

    def f(*tensors):
        return ref(**{**inputs, **dict(zip(names, tensors, strict=True))})
    assert torch.autograd.gradcheck(f, leaves)


@pytest.mark.parametrize("rope", [True, False])
def test_the_layer_around_the_block(rope):
    """A whole MLA layer with the block's reference and with the absorbed form agree, and with RoPE the scores
    depend on relative positions only: shifting every position leaves the output unchanged."""
    g = torch.Generator().manual_seed(5)
    b, t, d, ql, r, h, dn, dr, dv = 1, 6, 16, 12, 8, 2, 4, 4, 3
    weights = {"w_dq": torch.randn(ql, d, generator=g) / 4, "q_norm": torch.rand(ql, generator=g) + 0.5,
               "w_uq": torch.randn(h * (dn + dr), ql, generator=g) / 3, "w_dkv": torch.randn(r, d, generator=g) / 4,
               "kv_norm": torch.rand(r, generator=g) + 0.5, "w_kr": torch.randn(dr, d, generator=g) / 4,
               "w_uk": torch.randn(h, dn, r, generator=g) / 3, "w_uv": torch.randn(h, dv, r, generator=g) / 3,
               "w_g": torch.randn(h * dv, d, generator=g) / 4}
    weights = {k: v.double() for k, v in weights.items()}
    x = torch.randn(b, t, d, generator=g, dtype=torch.float64)
    out = layer_reference(x, weights, h, dn, dr, rope=rope)
    assert out.shape == (b, t, h, dv)
    torch.testing.assert_close(layer_reference(x, weights, h, dn, dr, rope=rope, attention=absorbed), out)
    pair = torch.randn(1, 3, 1, 4, dtype=torch.float64)
    pos = torch.arange(3)
    a, c = rope_interleaved(pair, pos), rope_interleaved(pair, pos + 11)
    torch.testing.assert_close(a.norm(dim=-1), pair.norm(dim=-1))  # a rotation
    dots = (a[:, 1:] * a[:, :1]).sum(-1)  # relative: q at t . k at 0 is the same after a shift of both
    torch.testing.assert_close(dots, (c[:, 1:] * c[:, :1]).sum(-1))


def test_make_inputs_and_suites():
    inputs = SPEC.make_inputs(SHAPE, torch.float16, 3)
    assert inputs["q"].shape == (2, 7, 3, 10) and inputs["c_kv"].shape == (2, 7, 10)
    assert inputs["k_rope"].shape == (2, 7, 4) and inputs["w_uk"].shape == (3, 6, 10)
    assert inputs["w_uv"].shape == (3, 5, 10) and inputs["gate"].shape == (2, 7, 3, 5)
    assert inputs["scale"] == pytest.approx(1 / math.sqrt(10))
    again = SPEC.make_inputs(SHAPE, torch.float16, 3)
    assert all(torch.equal(inputs[k], again[k]) for k in SPEC.grad_inputs)
    assert SPEC.make_inputs({**SHAPE, "gated": 0}, torch.float32, 0)["gate"] is None
    edge = SPEC.shapes["edge"]
    assert any(s["T"] == 1 for s in edge) and any(s["T"] > 64 and s["DN"] & (s["DN"] - 1) for s in edge)


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("mla")
    by_name = {t.name: t for t in list_templates("mla")}
    assert by_name["absorbed"].forward_only and not by_name["decompressed"].forward_only


@pytest.mark.interpreter
def test_decompressed_verifies_forward_and_backward(tmp_path):
    result = verify_first_point(tmp_path, "mla", "decompressed", base_seed=7)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:out", *(f"grad:{n}" for n in SPEC.grad_inputs)}


@pytest.mark.interpreter
def test_absorbed_verifies_forward_only(tmp_path):
    result = verify_first_point(tmp_path, "mla", "absorbed", base_seed=7, forward_only=True)
    assert result.passed and result.forward_only, result.message
    assert numeric_directions(result) == {"forward:out"}
    assert not [f for f in result.findings if "incomplete" in f]  # the model suite captured the forward only


def test_a_training_port_refuses_the_forward_only_template():
    from workbench.agent.run import _start_point
    from workbench.errors import TemplateError

    with pytest.raises(TemplateError, match="forward only.*--forward-only"):
        _start_point("mla", "absorbed", forward_only=False)
    assert _start_point("mla", "absorbed", forward_only=True)["template"] == "absorbed"


@pytest.mark.interpreter
def test_port_promotes_the_decompressed_form(settings):
    from workbench.agent.run import port_block

    outcome = port_block("mla", settings, seeds=1, budget=3)
    assert outcome.status == "promoted", outcome.reason
    assert "decompressed" in outcome.operator_path  # the absorbed form is forward only: never proposed here
