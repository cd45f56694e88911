"""dsa_prefill: the packed sparse prefill held to dsa_decode (prompts prefilled in chunks, then decoded token by
token, with each token's selection, equal them prefilled at once: outputs and rows) and to mla_prefill (a selection of
every causal key is the dense step); entries past the token are not attended, an empty selection gives 0; the card,
the templates; both templates verified through the sandbox on the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
from serving import chunked_then_decoded
from template_checks import UNPROMOTED, assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import _packed, get_block
from workbench.blocks._dsa import causal_topk
from workbench.blocks.mla_decode import UNWRITTEN

SPEC = get_block("dsa_prefill")
DECODE = get_block("dsa_decode")
DENSE = get_block("mla_prefill")
H, R, DR, PAGE, MAXP, TOPK = 3, 8, 4, 4, 5, 5
SCALE = 0.4


def test_prompts_in_chunks_then_decoded_equal_them_prefilled_at_once():
    """Two prompts of 12 and 7 tokens, each token selecting the top 5 of random scores over its causal positions
    (three rows emptied): prefilled at once; and as chunks of 5 and 0, then 4 and 3, then decoded by dsa_decode."""
    g = torch.Generator().manual_seed(0)
    prompts = [12, 7]
    q = torch.randn(sum(prompts), H, R + DR, generator=g, dtype=torch.float64)
    latents = torch.randn(sum(prompts), R + DR, generator=g, dtype=torch.float64)
    indices = torch.cat([causal_topk(torch.randn(1, p, p, generator=g, dtype=torch.float64), TOPK)[0]
                         for p in prompts]).int()
    indices[[2, 9, 15]] = -1
    table = torch.randperm(2 * MAXP + 1, generator=g)[:2 * MAXP].view(2, MAXP).int()
    empty = torch.full((2 * MAXP + 1, PAGE, R + DR), UNWRITTEN, dtype=torch.float64)

    def prefill(rows, cache, done, chunk):
        return SPEC.reference(q[rows], latents[rows, :R], latents[rows, R:], cache, table,
                              torch.tensor(done, dtype=torch.int32), _packed.offsets(chunk), indices[rows], SCALE)

    whole, whole_cache = prefill(torch.arange(19), empty, [0, 0], prompts)
    outputs, cache = chunked_then_decoded(
        prompts, [[5, 0], [4, 3]], empty, lambda rows, done, chunk, step, cache: prefill(rows, cache, done, chunk),
        lambda rows, live, done, cache: DECODE.reference(q[rows], latents[rows, :R], latents[rows, R:], cache,
                                                         table[live], torch.tensor([done[n] for n in live],
                                                                                   dtype=torch.int32), indices[rows],
                                                         SCALE))
    torch.testing.assert_close(outputs, whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cache, whole_cache, rtol=0, atol=0)
    assert float(whole[[2, 9, 15]].abs().max()) == 0.0  # empty selections


def test_every_causal_key_selected_is_the_dense_prefill_and_later_entries_are_ignored():
    inputs = DENSE.make_inputs({"TOTAL": 14, "S": 3, "H": 2, "R": 16, "DR": 4, "PAGE": 4, "MAXP": 8},
                               torch.float64, 1)
    bounds, lengths = inputs["cu_seqlens"].tolist(), inputs["seq_lens"].tolist()
    width = max(lengths) + 14
    rows = []
    for n in range(3):
        for t in range(bounds[n + 1] - bounds[n]):
            every = list(range(lengths[n] + t + 1)) + list(range(lengths[n] + t + 1, lengths[n] + t + 4))  # + later
            rows.append(every + [-1] * (width + 3 - len(every)))
    indices = torch.tensor(rows, dtype=torch.int32)
    dense, dense_cache = DENSE.reference(**inputs)
    sparse, sparse_cache = SPEC.reference(**{k: v for k, v in inputs.items() if k != "scale"}, indices=indices,
                                          scale=inputs["scale"])
    torch.testing.assert_close(sparse, dense, rtol=1e-12, atol=1e-12)
    assert torch.equal(sparse_cache, dense_cache)


def test_the_card_prefills_k31_pro_dsa_layers():
    from workbench.models import get_model

    blocks = get_model("kimi-k3.1-pro").blocks
    assert blocks["dsa_prefill"]["layers"] == 24
    assert blocks["dsa_prefill"]["shapes"] == [{**blocks["mla_prefill"]["shapes"][0], "TOPK": 2048}]


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("dsa_prefill")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["head_tiled", "head_loop"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    """The promoted head_tiled at the smoke and edge suites; head_loop, which the port does not promote, at smoke in
    float32."""
    promoted = template == "head_tiled"
    result = verify_first_point(tmp_path, "dsa_prefill", template, base_seed=3, suites=["smoke", "edge"] if promoted
                                else ["smoke"], dtypes=None if promoted else UNPROMOTED)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:o", "forward:latent_cache"}
    assert result.forward_only
