"""kda_decode: the serving step held to kda (a sequence decoded token by token through the step, its state kept in a
slot of the cache, equals kda's prefill of the whole sequence: every output and the final state), the slots of other
requests untouched, the reference leaving its input alone, fla's shipped decode as a peer, the input factory and
suites, the templates; both templates verified through the sandbox on the Triton interpreter (the cache updated in
place; tests/integrity/cheats.py holds the copy returned instead, refused as not_in_place), and one port through the
agent."""

from __future__ import annotations

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block

SPEC = get_block("kda_decode")
KDA = get_block("kda")


def decode_token_by_token(step, shape: dict, seed: int, slot: int, slots: int, dtype=torch.float64):
    """kda's inputs for one sequence decoded through ``step`` one token at a time from its initial state in ``slot``
    of a cache of ``slots`` (the other slots random): (kda's inputs, the outputs [1, T, HV, V], the cache after)."""
    inputs = KDA.make_inputs(shape, dtype, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    cache = torch.randn(slots, *inputs["initial_state"].shape[1:], generator=gen, dtype=inputs["initial_state"].dtype)
    cache[slot] = inputs["initial_state"][0]
    index = torch.tensor([slot])
    outputs = []
    for t in range(shape["T"]):
        o, cache = step(*(inputs[name][:, t] for name in ("q", "k", "v", "g", "beta")), inputs["scale"], cache, index)
        outputs.append(o)
    return inputs, torch.stack(outputs, dim=1), cache


@pytest.mark.parametrize("shape", [{"B": 1, "T": 9, "H": 1, "HV": 2, "K": 8, "V": 6, "h0": 1},
                                   {"B": 1, "T": 20, "H": 2, "HV": 4, "K": 5, "V": 7, "h0": 1}])
def test_a_sequence_decoded_token_by_token_equals_its_prefill(shape):
    inputs, o, cache = decode_token_by_token(SPEC.reference, shape, seed=shape["T"], slot=2, slots=5)
    prefill_o, final_state = KDA.reference(**inputs)
    torch.testing.assert_close(o, prefill_o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cache[2], final_state[0], rtol=1e-12, atol=1e-12)


def test_only_the_slots_of_the_batch_change_and_the_input_cache_is_left_alone():
    inputs = SPEC.make_inputs({"N": 3, "SLOTS": 8, "H": 1, "HV": 2, "K": 8, "V": 8}, torch.float32, 0)
    before = inputs["state_cache"].clone()
    o, cache = SPEC.reference(**inputs)
    assert torch.equal(inputs["state_cache"], before)  # the reference updates a copy
    others = torch.ones(8, dtype=torch.bool)
    others[inputs["slots"]] = False
    assert torch.equal(cache[others], before[others]) and not torch.equal(cache[~others], before[~others])
    assert o.shape == (3, 2, 8) and o.dtype == torch.float32 and cache.dtype == torch.float32


def test_make_inputs_and_suites():
    shape = {"N": 3, "SLOTS": 5, "H": 2, "HV": 4, "K": 24, "V": 20}
    inputs = SPEC.make_inputs(shape, torch.float16, 4)
    assert inputs["q"].shape == (3, 2, 24) and inputs["v"].shape == (3, 4, 20) and inputs["beta"].shape == (3, 4)
    assert inputs["state_cache"].shape == (5, 4, 24, 20) and inputs["state_cache"].dtype == torch.float32
    assert inputs["slots"].dtype == torch.int64 and len(set(inputs["slots"].tolist())) == 3
    assert torch.equal(inputs["slots"], SPEC.make_inputs(shape, torch.float16, 4)["slots"])
    with pytest.raises(ValueError, match="at most SLOTS"):
        SPEC.make_inputs({**shape, "N": 6}, torch.float32, 0)
    assert SPEC.updated_in_place == ("state_cache",) and SPEC.in_place_outputs == {"state_cache": 1}
    assert not SPEC.grad_inputs and any(s["V"] > 64 for s in SPEC.shapes["edge"])


def test_the_card_serves_every_kda_layer_at_the_decode_batch():
    from workbench.models import get_model

    card = get_model("kimi-k3")
    entry = card.blocks["kda_decode"]
    assert entry["layers"] == card.blocks["kda"]["layers"]
    # vLLM's V x K state cache: K3's published serving code keeps [slot, H, V, K]
    assert entry["shapes"] == [{"N": 128, "SLOTS": 128, "H": 96, "HV": 96, "K": 128, "V": 128, "vk": 1}]


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("kda_decode")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["v_tiled", "v_loop"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "kda_decode", template, base_seed=5)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:o", "forward:state_cache"}
    assert result.forward_only  # a block without gradients: its backward is never claimed


@pytest.mark.interpreter
def test_port_promotes_a_candidate_that_verifies(settings):
    from workbench.agent.run import port_block

    outcome = port_block("kda_decode", settings, seeds=1, budget=3)
    assert outcome.status == "promoted", outcome.reason
