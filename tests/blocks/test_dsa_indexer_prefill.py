"""dsa_indexer_prefill: the packed indexer prefill held to dsa_indexer (prompts from their first token: its prefill's
scores and selections, row for row) and to dsa_indexer_decode (prompts prefilled in chunks, then decoded token by
token, equal them prefilled at once: scores, selections, the cache's rows); the comparator on its rows; the card, the
templates; both templates verified through the sandbox on the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
from serving import chunked_then_decoded
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import _packed, get_block
from workbench.blocks.dsa_indexer import draw_inputs
from workbench.blocks.mla_decode import UNWRITTEN

SPEC = get_block("dsa_indexer_prefill")
PREFILL = get_block("dsa_indexer")
DECODE = get_block("dsa_indexer_decode")
HI, DI, PAGE, MAXP, TOPK = 3, 16, 4, 5, 6


def _prompts(g, lengths):
    drawn = [draw_inputs(1, t, HI, DI, 0, g) for t in lengths]
    return [torch.cat([x[i][0] for x in drawn]).double() for i in range(3)]  # q [T, HI, DI], k [T, DI], w [T, HI]


def test_prompts_from_their_first_token_are_dsa_indexers_prefill():
    g = torch.Generator().manual_seed(0)
    lengths = [9, 0, 1, 13]
    q, k, w = _prompts(g, lengths)
    table = torch.randperm(4 * MAXP + 1, generator=g)[:4 * MAXP].view(4, MAXP).int()
    cache = torch.full((4 * MAXP + 1, PAGE, DI), UNWRITTEN, dtype=torch.float64)
    scores, indices, _ = SPEC.reference(q, k, w, cache, table, torch.zeros(4, dtype=torch.int32),
                                        _packed.offsets(lengths), TOPK)
    starts = _packed.offsets(lengths).tolist()
    for n, t in enumerate(lengths):
        if not t:
            continue
        rows = slice(starts[n], starts[n] + t)
        alone, chosen = PREFILL.reference(q[None, rows], k[None, rows], w[None, rows], TOPK)
        torch.testing.assert_close(scores[rows, :t], alone[0], rtol=1e-12, atol=1e-12)
        assert torch.equal(indices[rows].long(), chosen[0])
        assert torch.isinf(scores[rows, t:]).all()


def test_prompts_in_chunks_then_decoded_equal_them_prefilled_at_once():
    g = torch.Generator().manual_seed(1)
    prompts = [11, 6]
    q, k, w = _prompts(g, prompts)
    table = torch.randperm(2 * MAXP + 1, generator=g)[:2 * MAXP].view(2, MAXP).int()
    empty = torch.full((2 * MAXP + 1, PAGE, DI), UNWRITTEN, dtype=torch.float64)

    def prefill(rows, cache, done, chunk):
        return SPEC.reference(q[rows], k[rows], w[rows], cache, table, torch.tensor(done, dtype=torch.int32),
                              _packed.offsets(chunk), TOPK)

    whole = prefill(torch.arange(17), empty, [0, 0], prompts)

    def split(result):  # (scores, indices), cache
        return result[:2], result[2]

    (scores, indices), cache = chunked_then_decoded(
        prompts, [[4, 0], [3, 4]], empty,
        lambda rows, done, chunk, step, cache: split(prefill(rows, cache, done, chunk)),
        lambda rows, live, done, cache: split(DECODE.reference(q[rows], k[rows], w[rows], cache, table[live],
                                                               torch.tensor([done[n] for n in live],
                                                                            dtype=torch.int32), TOPK)))
    torch.testing.assert_close(scores, whole[0], rtol=1e-12, atol=1e-12)
    assert torch.equal(indices, whole[1])
    assert torch.equal(cache, whole[2])


def test_the_comparator_reads_each_tokens_own_limit():
    shape = SPEC.shapes["smoke"][0]
    inputs = SPEC.make_inputs(shape, torch.float64, 2)
    scores, truth, _ = SPEC.reference(**inputs)
    check = SPEC.comparators["forward:indices"]
    tol = SPEC.tolerance(torch.float32)
    assert check(truth, truth, truth, tol, torch.int32, truth_outputs={"scores": scores})["passed"]
    row = int(torch.isfinite(scores).sum(-1).argmax())  # the token with the most keys
    bad = truth.clone()
    bad[row, 0] = int(torch.isfinite(scores[row]).sum())  # a position past the token
    assert "not causal keys" in check(bad, truth, truth, tol, torch.int32, truth_outputs={"scores": scores})["reason"]


def test_the_card_prefills_k31_pro_dsa_indexers():
    from workbench.models import get_model

    blocks = get_model("kimi-k3.1-pro").blocks
    assert blocks["dsa_indexer_prefill"]["layers"] == 24
    assert blocks["dsa_indexer_prefill"]["shapes"] == [{"TOTAL": 8192, "S": 16, "HI": 64, "DI": 128, "PAGE": 64,
                                                        "MAXP": 192, "TOPK": 2048, "tie_free": 0}]


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("dsa_indexer_prefill")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["paged", "split"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "dsa_indexer_prefill", template, base_seed=5)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:scores", "forward:indices", "forward:index_cache"}
    assert result.forward_only
