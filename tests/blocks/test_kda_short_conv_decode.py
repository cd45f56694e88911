"""kda_short_conv_decode: the serving update held to kda_short_conv (a sequence decoded token by token from an empty
state equals the prefill's convolution, in KDA's form and the residual variants, and the state ends as its last
inputs) and to transformers' own
causal_conv1d_update of Kimi Linear (its W-long state layout), the slots of other requests untouched, the input factory
and suites, the templates; both templates verified through the sandbox on the Triton interpreter, and one port through
the agent."""

from __future__ import annotations

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.kda_short_conv import INKLING2, INKLING2_DYNAMIC

SPEC = get_block("kda_short_conv_decode")
CONV = get_block("kda_short_conv")


@pytest.mark.parametrize("shape", [{"B": 1, "T": 9, "D": 5, "W": 4}, {"B": 1, "T": 2, "D": 3, "W": 4},
                                   {"B": 1, "T": 7, "D": 6, "W": 2}])
@pytest.mark.parametrize("length", ["W - 1", "W + 2"])
@pytest.mark.parametrize("form", [{}, INKLING2, {"residual": 1}, {"G": 1, **INKLING2_DYNAMIC}])
def test_a_sequence_decoded_token_by_token_equals_its_prefill(shape, length, form):
    inputs = CONV.make_inputs({**shape, **form}, torch.float64, shape["T"])
    taps = inputs["taps"]  # [1, T, G, W]: each step's own
    w = shape["W"]
    state_len = w - 1 if length == "W - 1" else w + 2
    cache = torch.zeros(3, shape["D"], state_len, dtype=torch.float64)  # an empty state: zeros before t = 0
    outputs = []
    for t in range(shape["T"]):
        y, cache = SPEC.reference(inputs["x"][:, t], inputs["weight"], cache, torch.tensor([1]), inputs["silu"],
                                  inputs["residual_scale"], None if taps is None else taps[:, t])
        outputs.append(y)
    torch.testing.assert_close(torch.stack(outputs, dim=1), CONV.reference(**inputs), rtol=1e-12, atol=1e-12)
    last = torch.cat([torch.zeros(shape["D"], state_len, dtype=torch.float64), inputs["x"][0].T], dim=1)
    torch.testing.assert_close(cache[1], last[:, -state_len:])
    assert not cache[0].any() and not cache[2].any()  # other slots untouched


def test_transformers_kimi_linear_update_computes_the_same():
    from transformers.models.kimi_linear.modeling_kimi_linear import causal_conv1d_update

    shape = {"N": 3, "SLOTS": 3, "D": 10, "W": 4, "L": 4}  # transformers keeps W inputs
    inputs = SPEC.make_inputs(shape, torch.float32, 2)
    inputs["slots"] = torch.arange(3)  # its cache holds the batch in order
    y, cache = SPEC.reference(**inputs)
    theirs = inputs["conv_cache"].clone()
    out = causal_conv1d_update(inputs["x"][:, :, None], theirs, inputs["weight"], None, "silu")
    torch.testing.assert_close(out[:, :, 0], y, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(theirs, cache)


def test_the_input_cache_is_left_alone_and_dtypes_follow_x():
    inputs = SPEC.make_inputs({"N": 2, "SLOTS": 5, "D": 16, "W": 4, "L": 3}, torch.float16, 0)
    before = inputs["conv_cache"].clone()
    y, cache = SPEC.reference(**inputs)
    assert torch.equal(inputs["conv_cache"], before) and y.dtype == cache.dtype == torch.float16
    others = torch.ones(5, dtype=torch.bool)
    others[inputs["slots"]] = False
    assert torch.equal(cache[others], before[others])


def test_make_inputs_and_suites():
    shape = {"N": 3, "SLOTS": 4, "D": 7, "W": 4, "L": 3}
    inputs = SPEC.make_inputs(shape, torch.float32, 1)
    assert inputs["x"].shape == (3, 7) and inputs["weight"].shape == (7, 4) and inputs["conv_cache"].shape == (4, 7, 3)
    assert len(set(inputs["slots"].tolist())) == 3
    with pytest.raises(ValueError, match="at least W - 1"):
        SPEC.make_inputs({**shape, "L": 2}, torch.float32, 0)
    assert SPEC.updated_in_place == ("conv_cache",) and not SPEC.grad_inputs
    assert {s["L"] - (s["W"] - 1) for s in SPEC.shapes["edge"]} >= {0, 1, 4}


def test_the_card_serves_every_short_convolution_at_the_decode_batch():
    from workbench.models import get_model

    card = get_model("kimi-k3")
    entry = card.blocks["kda_short_conv_decode"]
    assert entry["layers"] == card.blocks["kda_short_conv"]["layers"]
    assert entry["shapes"] == [{"N": 128, "SLOTS": 128, "D": 12288, "W": 4, "L": 3}]


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("kda_short_conv_decode")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["channel_tiled", "batch_loop"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "kda_short_conv_decode", template, base_seed=5)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:y", "forward:conv_cache"}


@pytest.mark.interpreter
def test_port_promotes_a_candidate_that_verifies(settings):
    from workbench.agent.run import port_block

    outcome = port_block("kda_short_conv_decode", settings, seeds=1, budget=3)
    assert outcome.status == "promoted", outcome.reason
