"""mla_prefill: the packed prefill held to mla_decode (prompts prefilled in chunks, or prefilled then decoded token by
token, equal them prefilled at once: outputs and the cache's rows), attention within a sequence only, the input
factory's room and traps, the card, the templates; both templates verified through the sandbox on the Triton
interpreter."""

from __future__ import annotations

import pytest
import torch
from serving import chunked_then_decoded
from template_checks import UNPROMOTED, assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import _packed, get_block
from workbench.blocks.mla_decode import UNWRITTEN

SPEC = get_block("mla_prefill")
DECODE = get_block("mla_decode")
H, R, DR, PAGE, MAXP = 3, 8, 4, 4, 5
SCALE = 0.4


def _inputs(g, tokens: int):
    return (torch.randn(tokens, H, R + DR, generator=g, dtype=torch.float64),
            torch.randn(tokens, R + DR, generator=g, dtype=torch.float64))


def _prefill(q, latents, cache, table, lengths, new):
    return SPEC.reference(q, latents[:, :R], latents[:, R:], cache, table, torch.tensor(lengths, dtype=torch.int32),
                          _packed.offsets(new), SCALE)


def test_prompts_in_chunks_then_decoded_equal_them_prefilled_at_once():
    """Three prompts of 9, 1 and 14 tokens (the pages of each a shuffled choice of the pool): prefilled at once; and
    as chunks of 4, 0 and 6 tokens, then 3, 1 and 5 more from the cache the first chunk wrote, then the rest decoded
    token by token by mla_decode: the same outputs, every latent in its row."""
    g = torch.Generator().manual_seed(0)
    prompts = [9, 1, 14]
    q, latents = _inputs(g, sum(prompts))
    table = torch.randperm(3 * MAXP + 1, generator=g)[:3 * MAXP].view(3, MAXP).int()
    empty = torch.full((3 * MAXP + 1, PAGE, R + DR), UNWRITTEN, dtype=torch.float64)
    whole, whole_cache = _prefill(q, latents, empty, table, [0, 0, 0], prompts)
    outputs, cache = chunked_then_decoded(
        prompts, [[4, 0, 6], [3, 1, 5]], empty,
        lambda rows, done, chunk, step, cache: _prefill(q[rows], latents[rows], cache, table, done, chunk),
        lambda rows, live, done, cache: DECODE.reference(q[rows], latents[rows, :R], latents[rows, R:], cache,
                                                         table[live], torch.tensor([done[n] for n in live],
                                                                                   dtype=torch.int32), SCALE))
    torch.testing.assert_close(outputs, whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cache, whole_cache, rtol=0, atol=0)
    starts = _packed.offsets(prompts).tolist()
    for n, prompt in enumerate(prompts):
        positions = torch.arange(prompt)
        rows = whole_cache[table[n, positions // PAGE].long(), positions % PAGE]
        torch.testing.assert_close(rows, latents[starts[n]:starts[n] + prompt], rtol=0, atol=0)


def test_attention_stays_within_each_sequence():
    g = torch.Generator().manual_seed(1)
    q, latents = _inputs(g, 10)
    table = torch.arange(2 * MAXP).view(2, MAXP).int()
    cache = torch.randn(2 * MAXP, PAGE, R + DR, generator=g, dtype=torch.float64)
    o, _ = _prefill(q, latents, cache, table, [3, 5], [6, 4])
    changed = latents.clone()
    changed[:6] += 50.0
    o2, _ = _prefill(q, changed, cache, table, [3, 5], [6, 4])
    assert torch.equal(o[6:], o2[6:]) and not torch.equal(o[:6], o2[:6])


def test_make_inputs_room_traps_and_the_input_cache_left_alone():
    shape = {"TOTAL": 30, "S": 4, "H": 2, "R": 16, "DR": 4, "PAGE": 4, "MAXP": 9}
    inputs = SPEC.make_inputs(shape, torch.float32, 0)
    new = inputs["cu_seqlens"].diff().tolist()
    lengths = inputs["seq_lens"].tolist()
    assert sum(new) == 30 and 0 in new and 1 in new and lengths[0] == 0  # seed 0: a prompt from its first token
    assert all(length + t <= 36 for length, t in zip(lengths, new, strict=True))
    assert (inputs["latent_cache"] == UNWRITTEN).any()  # the spare page and unwritten rows
    before = inputs["latent_cache"].clone()
    SPEC.reference(**inputs)
    assert torch.equal(inputs["latent_cache"], before)
    abstract = SPEC.meta_inputs(shape, torch.float32)
    assert {k: (v.shape, v.dtype) for k, v in abstract.items() if torch.is_tensor(v)} == \
        {k: (v.shape, v.dtype) for k, v in inputs.items() if torch.is_tensor(v)}


def test_the_card_prefills_every_mla_layer_from_packed_prompts():
    from workbench.models import get_model

    blocks = get_model("kimi-k3").blocks
    assert blocks["mla_prefill"]["layers"] == blocks["mla_decode"]["layers"] == 24
    assert blocks["mla_prefill"]["shapes"] == [{"TOTAL": 8192, "S": 16, "H": 96, "R": 512, "DR": 64, "PAGE": 64,
                                                "MAXP": 192}]  # room for 4096 cached tokens and the whole step


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("mla_prefill")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["head_tiled", "head_loop"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    """The promoted head_tiled at the smoke and edge suites; head_loop, which the port does not promote, at smoke in
    float32."""
    promoted = template == "head_tiled"
    result = verify_first_point(tmp_path, "mla_prefill", template, base_seed=3, suites=["smoke", "edge"] if promoted
                                else ["smoke"], dtypes=None if promoted else UNPROMOTED)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:o", "forward:latent_cache"}
    assert result.forward_only
