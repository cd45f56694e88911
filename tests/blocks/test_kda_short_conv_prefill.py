"""kda_short_conv_prefill: the packed prefill held to kda_short_conv (each sequence alone, from no state), to itself
in chunks (a prompt prefilled in two packed steps, the second from the state the first left, equals it prefilled at
once) and to kda_short_conv_decode (a prefix prefilled, then decoded token by token, equals the whole prefilled);
no sequence sees another's inputs; the input factory, the card, the templates; both templates verified through the
sandbox on the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
from serving import chunked_then_decoded
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import _packed, get_block

SPEC = get_block("kda_short_conv_prefill")
CONV = get_block("kda_short_conv")
DECODE = get_block("kda_short_conv_decode")
D, W = 6, 4


def _prefill(x, weight, cache, lengths, slots, has_state):
    return SPEC.reference(x, weight, cache, _packed.offsets(lengths), torch.tensor(slots),
                          torch.tensor(has_state))


@pytest.mark.parametrize("length", [W - 1, W + 1])
def test_each_sequence_from_no_state_is_kda_short_conv_and_leaves_its_last_inputs(length):
    g = torch.Generator().manual_seed(0)
    lengths = [5, 0, 1, 9]
    x = torch.randn(sum(lengths), D, generator=g, dtype=torch.float64)
    weight = torch.randn(D, W, generator=g, dtype=torch.float64)
    cache = torch.randn(6, D, length, generator=g, dtype=torch.float64)
    y, after = _prefill(x, weight, cache, lengths, [4, 0, 2, 5], [False] * 4)
    bounds = _packed.offsets(lengths).tolist()
    for n, (start, end) in enumerate(zip(bounds, bounds[1:], strict=False)):
        if end > start:
            alone = CONV.reference(x[None, start:end], weight)[0]
            torch.testing.assert_close(y[start:end], alone, rtol=1e-12, atol=1e-12)
        slot = [4, 0, 2, 5][n]
        tail = torch.cat([torch.zeros(D, length, dtype=torch.float64), x[start:end].T], dim=1)[:, -length:]
        torch.testing.assert_close(after[slot], tail, rtol=0, atol=0)
    assert torch.equal(after[[1, 3]], cache[[1, 3]])  # slots nobody was given are left alone


def test_a_prompt_prefilled_in_chunks_then_decoded_equals_it_prefilled_at_once():
    """Three prompts of 11, 1 and 7 tokens: prefilled whole; and prefilled as chunks (the first 4, 0 and 3 tokens,
    then the next 5, 1 and 2 from the state the first chunk left), then the rest decoded token by token: the same
    outputs and the same final states."""
    g = torch.Generator().manual_seed(1)
    lengths, slots = [11, 1, 7], [2, 0, 1]
    x = torch.randn(sum(lengths), D, generator=g, dtype=torch.float64)
    weight = torch.randn(D, W, generator=g, dtype=torch.float64)
    cache = torch.randn(3, D, W - 1, generator=g, dtype=torch.float64)
    whole, whole_cache = _prefill(x, weight, cache, lengths, slots, [False] * 3)
    outputs, state = chunked_then_decoded(
        lengths, [[4, 0, 3], [5, 1, 2]], cache,
        lambda rows, done, chunk, step, state: _prefill(x[rows], weight, state, chunk, slots, [step > 0] * 3),
        lambda rows, live, done, state: DECODE.reference(x[rows], weight, state,
                                                         torch.tensor([slots[n] for n in live])))
    torch.testing.assert_close(outputs, whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state, whole_cache, rtol=0, atol=0)


def test_no_sequence_sees_anothers_inputs():
    g = torch.Generator().manual_seed(2)
    lengths = [6, 6]
    x = torch.randn(12, D, generator=g)
    weight, cache = torch.randn(D, W, generator=g), torch.randn(2, D, W - 1, generator=g)
    y, _ = _prefill(x, weight, cache, lengths, [0, 1], [True, False])
    changed = x.clone()
    changed[:6] += 100.0
    y2, _ = _prefill(changed, weight, cache, lengths, [0, 1], [True, False])
    assert torch.equal(y[6:], y2[6:]) and not torch.equal(y[:6], y2[:6])


def test_make_inputs_and_the_input_cache_left_alone():
    shape = {"TOTAL": 40, "S": 5, "SLOTS": 7, "D": 16, "W": 4, "L": 3}
    inputs = SPEC.make_inputs(shape, torch.float32, 3)
    lengths = inputs["cu_seqlens"].diff().tolist()
    assert inputs["cu_seqlens"].dtype == torch.int32 and sum(lengths) == 40 and 0 in lengths and 1 in lengths
    assert len(set(inputs["slots"].tolist())) == 5 and 0 < int(inputs["has_state"].sum()) < 5
    before = inputs["conv_cache"].clone()
    SPEC.reference(**inputs)
    assert torch.equal(inputs["conv_cache"], before)
    abstract = SPEC.meta_inputs(shape, torch.float32)
    assert {k: (v.shape, v.dtype) for k, v in abstract.items()} == {k: (v.shape, v.dtype) for k, v in inputs.items()}


def test_the_card_prefills_every_short_convolution_from_packed_prompts():
    from workbench.models import get_model

    blocks = get_model("kimi-k3").blocks
    entry = blocks["kda_short_conv_prefill"]
    assert entry["layers"] == blocks["kda_short_conv"]["layers"] == 69
    assert entry["shapes"] == [{"TOTAL": 8192, "S": 16, "SLOTS": 128, "D": 12288, "W": 4, "L": 3}]


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("kda_short_conv_prefill")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["seq_tiled", "token_tiled"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "kda_short_conv_prefill", template, base_seed=11)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:y", "forward:conv_cache"}
    assert result.forward_only
