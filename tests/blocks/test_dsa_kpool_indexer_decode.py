"""dsa_kpool_indexer_decode: the serving step held to dsa_kpool_indexer (sequences decoded token by token, their keys
and gate scores kept in pages of the cache, score, select and expand what the prefill does at each token; ragged
lengths in one batch), the step writing only its own rows, the input factory (traps), the comparators on decode
rows, the card; the template verified through the sandbox on the Triton interpreter. The module it is held to
(transformers' Glm5NextTextIndexer with a cache) is in workbench.integrations.references."""

from __future__ import annotations

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.dsa_kpool_indexer import compare_expanded
from workbench.blocks.mla_decode import UNWRITTEN
from workbench.numerics import default_tolerance

SPEC = get_block("dsa_kpool_indexer_decode")
PREFILL = get_block("dsa_kpool_indexer")


@pytest.mark.parametrize(("page", "pool", "tail"), [(1, 4, True), (4, 8, True), (16, 4, False), (8, 1, True)])
def test_sequences_decoded_token_by_token_select_as_their_prefill(page, pool, tail):
    """Three sequences of 26 tokens joining the batch 0, 3 and 5 steps late, their pages scattered through the pool
    (a pool spanning pages, pages spanning pools), in float64: step L's scores over the complete pools are the
    prefill's row L (-inf past them), its pools the prefill's (-1 past the prefill's width), its indices the
    prefill's row L; every key and gate score lands in its row of the cache."""
    t, topk, joins = 26, 12, (0, 3, 5)
    x = PREFILL.make_inputs({"B": 3, "T": t, "HI": 3, "DI": 16, "P": pool, "topk": topk, "tail": int(tail)},
                            torch.float64, 2)
    scores, pools, indices = PREFILL.reference(**x)
    maxp = -(-t // page)
    table = torch.randperm(3 * maxp + 1, generator=torch.Generator().manual_seed(1))[:3 * maxp].view(3, maxp).int()
    cache = torch.full((3 * maxp + 1, page, 32), UNWRITTEN, dtype=torch.float64)
    for step in range(t + max(joins)):
        batch = [b for b, late in enumerate(joins) if 0 <= step - late < t]
        ts = [step - joins[b] for b in batch]
        got, picked, keys, cache = SPEC.reference(
            x["q_idx"][batch, ts], x["k_idx"][batch, ts], x["w"][batch, ts], x["gate"][batch, ts], x["ape"], cache,
            table[batch], torch.tensor(ts, dtype=torch.int32), topk, tail)
        assert got.shape == (len(batch), maxp * page // pool) and keys.dtype == picked.dtype == torch.int32
        for i, (b, length) in enumerate(zip(batch, ts, strict=True)):
            complete = (length + 1) // pool
            torch.testing.assert_close(got[i, :complete], scores[b, length, :complete], rtol=1e-12, atol=1e-12)
            assert torch.isneginf(got[i, complete:]).all()
            width = pools.shape[-1]
            assert picked[i, :width].tolist() == pools[b, length].tolist() and (picked[i, width:] == -1).all()
            assert keys[i].tolist() == indices[b, length].tolist()
    for b in range(3):
        rows = cache[table[b, torch.arange(t) // page].long(), torch.arange(t) % page]
        assert torch.equal(rows, torch.cat([x["k_idx"][b], x["gate"][b]], dim=-1))
    assert (indices == -1).any() and (indices >= 0).any()


def test_the_step_writes_only_its_rows_and_the_input_cache_is_left_alone():
    shape = {"N": 4, "HI": 3, "DI": 16, "P": 4, "PAGE": 4, "MAXP": 3, "TOPK": 5, "tail": 1}
    inputs = SPEC.make_inputs(shape, torch.float16, 1)
    before = inputs["index_cache"].clone()
    scores, pools, indices, cache = SPEC.reference(**inputs)
    assert torch.equal(inputs["index_cache"], before)  # the reference updates a copy
    lengths, table = inputs["seq_lens"].tolist(), inputs["block_table"].tolist()
    changed = (cache != before).any(-1).nonzero().tolist()
    assert sorted(changed) == sorted([table[n][length // 4], length % 4] for n, length in enumerate(lengths))
    for n, length in enumerate(lengths):
        assert torch.equal(cache[table[n][length // 4], length % 4],
                           torch.cat([inputs["k_idx"][n], inputs["gate"][n]]))
    assert scores.dtype == torch.float32 and scores.shape == (4, 3)
    assert pools.shape == (4, 1) and indices.shape == (4, 8)  # top 5 // 4 = 1 pool; 5 + 3 tail slots
    fake = SPEC.abstract_outputs(*SPEC.meta_inputs(shape, torch.float16).values())
    assert [(o.shape, o.dtype) for o in fake] == [(o.shape, o.dtype) for o in (scores, pools, indices, cache)]


def test_inputs_with_traps_where_no_sequence_wrote():
    shape = {"N": 3, "HI": 4, "DI": 16, "P": 4, "PAGE": 4, "MAXP": 4, "TOPK": 8, "tail": 1}
    inputs = SPEC.make_inputs(shape, torch.float32, 0)
    lengths, table = inputs["seq_lens"].tolist(), inputs["block_table"].tolist()
    assert lengths[0] == 0 and lengths[-1] == 15  # an empty sequence; one at the last row of its last page
    written = torch.zeros(inputs["index_cache"].shape[:2], dtype=torch.bool)
    for n, length in enumerate(lengths):
        for s in range(length):
            written[table[n][s // 4], s % 4] = True
    assert (inputs["index_cache"][~written] == UNWRITTEN).all() and (inputs["index_cache"][written] != UNWRITTEN).all()
    assert inputs["index_cache"].shape[-1] == 32  # [key | gate]
    meta = SPEC.meta_inputs(shape, torch.float32)
    assert {k: v.shape for k, v in meta.items() if torch.is_tensor(v)} == \
        {k: v.shape for k, v in inputs.items() if torch.is_tensor(v)}


def test_the_expanded_comparator_judges_decode_rows_at_their_lengths():
    """The indices of a decode step are judged with each row's query at its sequence's length (the trial's
    seq_lens): a key past it is refused, the truth passes, a pool swapped for another refused by padding or
    overlap alike."""
    shape = {"N": 3, "HI": 2, "DI": 16, "P": 4, "PAGE": 8, "MAXP": 4, "TOPK": 8, "tail": 1}
    inputs = SPEC.make_inputs(shape, torch.float32, 3)
    _, _, indices, _ = SPEC.reference(**inputs)
    tol = default_tolerance(torch.float32)
    lengths = inputs["seq_lens"].tolist()

    def check(out):
        return compare_expanded(out, indices, indices, tol, torch.int32, inputs=inputs)

    assert check(indices.clone())["passed"]
    n = max(range(3), key=lambda i: lengths[i])
    bad = indices.clone()
    bad[n, 0] = lengths[n] + 1  # a key this step cannot see
    assert "not causal" in check(bad)["reason"] or "past" in check(bad)["reason"]
    bad = indices.clone()
    bad[n, 1] = bad[n, 0]
    assert "twice" in check(bad)["reason"]


def test_spec_contract_and_the_card(tmp_path):
    """GLM-5-Next's defaults: the k-pool decode replaces dsa_indexer_decode on the DSA layers, at dsa_decode's
    batch and pages and the indexer's pools, top-k and tail."""
    from workbench.onboard import onboard

    assert SPEC.arg_names == ("q_idx", "k_idx", "w", "gate", "ape", "index_cache", "block_table", "seq_lens",
                              "topk", "tail")
    assert SPEC.outputs == ("scores", "pools", "indices", "index_cache") and SPEC.updated_in_place == ("index_cache",)
    assert not SPEC.grad_inputs and set(SPEC.comparators) == {"forward:pools", "forward:indices"}
    card = onboard("glm5_next")
    blocks = card["blocks"]
    assert "dsa_indexer_decode" not in blocks and "dsa_indexer" not in blocks
    entry, paged, prefill = (blocks[b] for b in ("dsa_kpool_indexer_decode", "dsa_decode", "dsa_kpool_indexer"))
    assert entry["layers"] == paged["layers"]
    (shape,) = entry["shapes"]
    assert {k: shape[k] for k in ("N", "PAGE", "MAXP")} == {k: paged["shapes"][0][k] for k in ("N", "PAGE", "MAXP")}
    assert {k: shape[k] for k in ("HI", "DI", "P", "tail")} == {k: prefill["shapes"][0][k] for k in
                                                                  ("HI", "DI", "P", "tail")}
    assert shape["TOPK"] == prefill["shapes"][0]["topk"]
    assert entry["evidence"].startswith("probe: Glm5NextTextAttention")


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("dsa_kpool_indexer_decode")


@pytest.mark.interpreter
def test_the_template_verifies_on_the_interpreter(tmp_path):
    result = verify_first_point(tmp_path, "dsa_kpool_indexer_decode", "paged", base_seed=5)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:scores", "forward:pools", "forward:indices",
                                          "forward:index_cache"}
    assert result.forward_only
