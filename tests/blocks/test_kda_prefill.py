"""kda_prefill: the packed recurrent prefill held to kda (prompts from no state: its prefill's outputs and final
state) and to kda_decode (prompts prefilled in chunks, then decoded token by token, equal them prefilled at once:
outputs and final states); no sequence sees another's tokens, slots nobody was given are left alone; the input
factory, the card, the templates; both templates verified through the sandbox on the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from serving import chunked_then_decoded
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import _packed, get_block

SPEC = get_block("kda_prefill")
KDA = get_block("kda")
DECODE = get_block("kda_decode")
H, HV, K, V = 1, 2, 8, 6


def _tokens(g, total):
    q = F.normalize(torch.rand(total, H, K, generator=g, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.rand(total, H, K, generator=g, dtype=torch.float64), dim=-1)
    v = torch.rand(total, HV, V, generator=g, dtype=torch.float64)
    gate = F.logsigmoid(torch.randn(total, HV, K, generator=g, dtype=torch.float64))
    beta = torch.sigmoid(torch.randn(total, HV, generator=g, dtype=torch.float64))
    return q, k, v, gate, beta


def _prefill(x, rows, cache, lengths, slots, has_state):
    q, k, v, gate, beta = (t[rows] for t in x)
    return SPEC.reference(q, k, v, gate, beta, K ** -0.5, cache, _packed.offsets(lengths), torch.tensor(slots),
                          torch.tensor(has_state))


def test_prompts_from_no_state_are_kdas_prefill_and_other_slots_are_left_alone():
    g = torch.Generator().manual_seed(0)
    lengths, slots = [7, 0, 1, 5], [3, 0, 5, 1]
    x = _tokens(g, 13)
    cache = torch.randn(6, HV, K, V, generator=g, dtype=torch.float64)
    o, after = _prefill(x, torch.arange(13), cache, lengths, slots, [False] * 4)
    starts = _packed.offsets(lengths).tolist()
    for n, t in enumerate(lengths):
        rows = slice(starts[n], starts[n] + t)
        alone, final = KDA.reference(*(part[None, rows] for part in x[:3]), x[3][None, rows], x[4][None, rows],
                                     K ** -0.5, None)
        torch.testing.assert_close(o[rows], alone[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(after[slots[n]], final[0], rtol=1e-12, atol=1e-12)  # none: zeros stay zeros
    assert torch.equal(after[[2, 4]], cache[[2, 4]])


def test_prompts_in_chunks_then_decoded_equal_them_prefilled_at_once():
    g = torch.Generator().manual_seed(1)
    prompts, slots = [10, 4, 1], [2, 0, 1]
    x = _tokens(g, 15)
    cache = torch.randn(3, HV, K, V, generator=g, dtype=torch.float64)
    whole, whole_cache = _prefill(x, torch.arange(15), cache, prompts, slots, [True, False, True])
    outputs, state = chunked_then_decoded(
        prompts, [[3, 0, 1], [4, 2, 0]], cache,
        lambda rows, done, chunk, step, state: _prefill(x, rows, state, chunk, slots, [True, step > 0, True]),
        lambda rows, live, done, state: DECODE.reference(*(t[rows] for t in x[:3]), x[3][rows], x[4][rows], K ** -0.5,
                                                         state, torch.tensor([slots[n] for n in live])))
    torch.testing.assert_close(outputs, whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state, whole_cache, rtol=1e-12, atol=1e-12)


def test_no_sequence_sees_anothers_tokens():
    g = torch.Generator().manual_seed(2)
    x = _tokens(g, 10)
    cache = torch.randn(2, HV, K, V, generator=g, dtype=torch.float64)
    o, _ = _prefill(x, torch.arange(10), cache, [6, 4], [0, 1], [True, True])
    changed = list(x)
    changed[2] = x[2].clone()
    changed[2][:6] += 5.0
    o2, _ = _prefill(changed, torch.arange(10), cache, [6, 4], [0, 1], [True, True])
    assert torch.equal(o[6:], o2[6:]) and not torch.equal(o[:6], o2[:6])


def test_make_inputs_and_the_input_cache_left_alone():
    shape = {"TOTAL": 30, "S": 4, "SLOTS": 6, "H": 1, "HV": 2, "K": 16, "V": 8}
    inputs = SPEC.make_inputs(shape, torch.float16, 3)
    lengths = inputs["cu_seqlens"].diff().tolist()
    assert sum(lengths) == 30 and 0 in lengths and 1 in lengths and inputs["state_cache"].dtype == torch.float32
    before = inputs["state_cache"].clone()
    SPEC.reference(**inputs)
    assert torch.equal(inputs["state_cache"], before)
    abstract = SPEC.meta_inputs(shape, torch.float16)
    assert {k: (v.shape, v.dtype) for k, v in abstract.items() if torch.is_tensor(v)} == \
        {k: (v.shape, v.dtype) for k, v in inputs.items() if torch.is_tensor(v)}


def test_the_card_prefills_every_kda_layer_from_packed_prompts():
    from workbench.models import get_model

    blocks = get_model("kimi-k3").blocks
    assert blocks["kda_prefill"]["layers"] == blocks["kda"]["layers"] == 69
    assert blocks["kda_prefill"]["shapes"] == [{"TOTAL": 8192, "S": 16, "SLOTS": 128, "H": 96, "HV": 96, "K": 128,
                                                "V": 128, "vk": 1}]  # vLLM's V x K state cache


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("kda_prefill")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["v_tiled", "v_loop"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "kda_prefill", template, base_seed=13)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:o", "forward:state_cache"}
    assert result.forward_only
