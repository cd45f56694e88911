"""dsa_indexer_decode: the serving step held to dsa_indexer (sequences decoded token by token, their index keys kept in
pages of the cache, score and select what the prefill scores and selects at each token; ragged lengths in one batch),
the step writing only its own rows, the input factory (grid, traps), the indices comparator on decode rows, the card;
both templates verified through the sandbox on the Triton interpreter."""

from __future__ import annotations

import json

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.dsa_indexer import GRID, compare_indices
from workbench.blocks.mla_decode import UNWRITTEN
from workbench.numerics import default_tolerance

SPEC = get_block("dsa_indexer_decode")
PREFILL = get_block("dsa_indexer")


@pytest.mark.parametrize("page", [1, 4, 16])
def test_sequences_decoded_token_by_token_score_and_select_as_their_prefill(page):
    """Three sequences of 14 tokens joining the batch 0, 3 and 5 steps late (lengths differ within each call), their
    pages scattered through the pool, in float64: step L's scores over 0..L are the prefill's row L (-inf past L),
    its selection the prefill's row L's (ties at 0 and -1 padding alike), and every key lands in its row."""
    t, topk, joins = 14, 6, (0, 3, 5)
    x = PREFILL.make_inputs({"B": 3, "T": t, "HI": 3, "DI": 16, "topk": topk, "tie_free": 0}, torch.float64, 2)
    scores, indices = PREFILL.reference(**x)
    maxp = -(-t // page)
    table = torch.randperm(3 * maxp + 1, generator=torch.Generator().manual_seed(1))[:3 * maxp].view(3, maxp).int()
    cache = torch.full((3 * maxp + 1, page, 16), UNWRITTEN, dtype=torch.float64)
    for step in range(t + max(joins)):
        batch = [b for b, late in enumerate(joins) if 0 <= step - late < t]
        ts = [step - joins[b] for b in batch]
        got, picked, cache = SPEC.reference(x["q_idx"][batch, ts], x["k_idx"][batch, ts], x["w"][batch, ts], cache,
                                            table[batch], torch.tensor(ts, dtype=torch.int32), topk)
        assert got.shape == (len(batch), maxp * page) and picked.dtype == torch.int32
        for i, (b, length) in enumerate(zip(batch, ts, strict=True)):
            torch.testing.assert_close(got[i, :length + 1], scores[b, length, :length + 1], rtol=1e-12, atol=1e-12)
            assert torch.isneginf(got[i, length + 1:]).all()
            assert picked[i].tolist() == indices[b, length].tolist()
    for b in range(3):
        rows = cache[table[b, torch.arange(t) // page].long(), torch.arange(t) % page]
        assert torch.equal(rows, x["k_idx"][b])
    assert (scores == 0).any() and (indices == -1).any()  # exact ties and padding were exercised


def test_the_step_writes_only_its_rows_and_the_input_cache_is_left_alone():
    shape = {"N": 4, "HI": 3, "DI": 16, "PAGE": 4, "MAXP": 3, "TOPK": 5, "tie_free": 0}
    inputs = SPEC.make_inputs(shape, torch.float16, 1)
    before = inputs["index_cache"].clone()
    scores, indices, cache = SPEC.reference(**inputs)
    assert torch.equal(inputs["index_cache"], before)  # the reference updates a copy
    lengths, table = inputs["seq_lens"].tolist(), inputs["block_table"].tolist()
    changed = (cache != before).any(-1).nonzero().tolist()
    assert sorted(changed) == sorted([table[n][length // 4], length % 4] for n, length in enumerate(lengths))
    for n, length in enumerate(lengths):
        assert torch.equal(cache[table[n][length // 4], length % 4], inputs["k_idx"][n])
    assert scores.dtype == torch.float32 and indices.dtype == torch.int32 and indices.shape == (4, 5)
    fake = SPEC.abstract_outputs(*SPEC.meta_inputs(shape, torch.float16).values())
    assert [(o.shape, o.dtype) for o in fake] == [(o.shape, o.dtype) for o in (scores, indices, cache)]


@pytest.mark.parametrize("tie_free", [0, 1])
def test_inputs_on_the_grid_with_traps_where_no_sequence_wrote(tie_free):
    shape = {"N": 3, "HI": 4, "DI": 16, "PAGE": 4, "MAXP": 4, "TOPK": 8, "tie_free": tie_free}
    inputs = SPEC.make_inputs(shape, torch.float32, 0)
    lengths, table = inputs["seq_lens"].tolist(), inputs["block_table"].tolist()
    assert lengths[0] == 0 and lengths[-1] == 15  # an empty sequence; one at the last row of its last page
    written = torch.zeros(inputs["index_cache"].shape[:2], dtype=torch.bool)
    for n, length in enumerate(lengths):
        for s in range(length):
            written[table[n][s // 4], s % 4] = True
    keys = inputs["index_cache"][written]
    assert (inputs["index_cache"][~written] == UNWRITTEN).all() and (keys != UNWRITTEN).all()
    grid = 128 if tie_free else GRID  # the tie-free inputs' perturbations are multiples of 1/128
    for x in (keys, inputs["q_idx"], inputs["k_idx"]):
        assert torch.equal(x * grid, torch.round(x * grid))  # every head dot product exact
    assert table[0][1:] == [12, 12, 12]  # past a sequence's pages: the spare page
    if tie_free:  # every row's scores distinct and far apart
        scores, _, _ = SPEC.reference(**inputs)
        for n, length in enumerate(lengths):
            row = torch.sort(scores[n, :length + 1]).values
            assert length == 0 or float(row.diff().min()) > 0.01
    meta = SPEC.meta_inputs(shape, torch.float32)
    assert {k: v.shape for k, v in meta.items() if torch.is_tensor(v)} == \
        {k: v.shape for k, v in inputs.items() if torch.is_tensor(v)}


# --- the indices comparator on decode rows ---------------------------------------------------------------------


@pytest.fixture
def trial():
    inputs = SPEC.make_inputs({"N": 8, "HI": 2, "DI": 16, "PAGE": 8, "MAXP": 8, "TOPK": 16, "tie_free": 0},
                              torch.float16, 0)
    low_scores, low_indices, _ = SPEC.reference(**inputs)
    scores, indices, _ = SPEC.reference(**{k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
                                           for k, v in inputs.items()})
    context = {"truth_outputs": {"scores": scores, "indices": indices},
               "lowp_outputs": {"scores": low_scores, "indices": low_indices}}
    return inputs["seq_lens"].tolist(), scores, indices, low_indices, context


def check(out, trial):
    _, _, indices, low_indices, context = trial
    return compare_indices(out, indices, low_indices, default_tolerance(torch.float16), torch.int32, **context)


def test_comparator_accepts_the_truth_in_any_order(trial):
    lengths, _, indices, _, _ = trial
    assert lengths == [0, 53, 5, 33, 62, 51, 38, 63]  # two rows short of TOPK (-1 padded), six full
    assert check(indices.clone(), trial)["passed"]
    shuffled = indices.clone()
    shuffled[2, :6] = shuffled[2, :6].flip(0)
    shuffled[7] = shuffled[7].flip(0)
    assert check(shuffled, trial)["passed"]


def test_comparator_refuses_past_the_length_repeats_padding_and_garbage(trial):
    lengths, scores, indices, _, _ = trial
    n = 1
    bad = indices.clone()
    bad[n, 0] = lengths[n] + 1  # a position past L (a row of the cache nobody wrote yet)
    assert "not causal" in check(bad, trial)["reason"]
    bad = indices.clone()
    bad[n, 1] = bad[n, 0]
    assert "twice" in check(bad, trial)["reason"]
    bad = indices.clone()
    bad[0, 1] = 0  # sequence 0 holds one key: its other slots are padding
    assert "padding" in check(bad, trial)["reason"]
    bad = indices.clone()
    bad[n, -1] = -1  # a short row
    assert "padding" in check(bad, trial)["reason"]
    n = 7  # one pair of the 103 missed: within the overlap, refused for its score
    outside = [s for s in range(lengths[n] + 1) if s not in indices[n].tolist()]
    bad = indices.clone()
    bad[n, -1] = min(outside, key=lambda s: float(scores[n, s]))
    reason = check(bad, trial)["reason"]
    assert "below the row's k-th score" in reason and f"for query {lengths[n]} (batch {n})" in reason


def test_spec_contract_and_the_card(tmp_path):
    from workbench.models import get_model
    from workbench.onboard import onboard

    assert SPEC.arg_names == ("q_idx", "k_idx", "w", "index_cache", "block_table", "seq_lens", "topk")
    assert SPEC.outputs == ("scores", "indices", "index_cache") and SPEC.updated_in_place == ("index_cache",)
    assert not SPEC.grad_inputs and set(SPEC.comparators) == {"forward:indices"}
    config = {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "hidden_size": 7168,
              "num_hidden_layers": 61, "num_attention_heads": 128, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
              "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280, "index_topk": 2048,
              "index_n_heads": 64, "index_head_dim": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    blocks = onboard(tmp_path / "config.json")["blocks"]
    entry = blocks["dsa_indexer_decode"]
    assert entry["layers"] == blocks["dsa_decode"]["layers"] == 61
    assert entry["shapes"] == [{"N": 128, "HI": 64, "DI": 128, "PAGE": 64, "MAXP": 65, "TOPK": 2048, "tie_free": 0}]
    k31 = get_model("kimi-k3.1-pro").blocks["dsa_indexer_decode"]  # the hand-written card: V3.2's indexer, K3's pages
    assert k31["shapes"] == entry["shapes"] and k31["layers"] == 24


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("dsa_indexer_decode")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["paged", "split"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "dsa_indexer_decode", template, base_seed=5)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:scores", "forward:indices", "forward:index_cache"}
    assert result.forward_only
