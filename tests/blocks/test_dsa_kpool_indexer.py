"""dsa_kpool_indexer: the reference against a loop formulation and a hand-computed case, its pool and tail rules, the
pool of one key as dsa_indexer, the comparators, the onboarding rule, and both templates verified on the Triton
interpreter. The module it is held to (transformers' Glm5NextTextIndexer) is in workbench.integrations.references."""

from __future__ import annotations

import math

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.dsa_indexer import compare_indices
from workbench.blocks.dsa_kpool_indexer import SHAPES, compare_expanded, expand, make_inputs, pooled_keys
from workbench.numerics import default_tolerance

SPEC = get_block("dsa_kpool_indexer")
INF = float("inf")


def f64(inputs: dict) -> dict:
    return {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def loop_kpool(q, k, w, gate, ape, topk, tail):
    """Independent formulation: python loops in float64 over pools, channels, queries and heads; pools ranked by
    (-score, p); keys listed pool by pool, then the tail, then -1."""
    B, T, HI, DI = q.shape
    P = ape.shape[0]
    NP, SK = T // P, min(topk // P, T // P)
    pooled = torch.zeros(B, NP, DI, dtype=torch.float64)
    for b in range(B):
        for p in range(NP):
            for c in range(DI):
                logits = [float(gate[b, p * P + j, c] + ape[j, c]) for j in range(P)]
                top = max(logits)
                e = [pow(2.718281828459045, x - top) for x in logits]
                pooled[b, p, c] = sum(e[j] * float(k[b, p * P + j, c]) for j in range(P)) / sum(e)
    scores = torch.full((B, T, NP), -INF, dtype=torch.float64)
    width = topk + (P - 1 if tail else 0)
    indices = torch.full((B, T, width), -1, dtype=torch.int64)
    for b in range(B):
        for t in range(T):
            ranked = []
            for p in range((t + 1) // P):
                value = sum(float(w[b, t, h]) * max(0.0, float(q[b, t, h].double() @ pooled[b, p])) for h in range(HI))
                scores[b, t, p] = value
                ranked.append((-value, p))
            row = [p * P + j for _, p in sorted(ranked)[:SK] for j in range(P)]
            row += [-1] * (SK * P - len(row))
            if tail:
                n = t + 1
                row += [n - n % P + j if j < n % P else -1 for j in range(P - 1)]
            indices[b, t, :len(row)] = torch.tensor(row, dtype=torch.int64)
    return scores, indices


# --- the reference ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [{"B": 2, "T": 13, "HI": 2, "DI": 3, "P": 4, "topk": 8, "tail": 1},
                                   {"B": 1, "T": 11, "HI": 3, "DI": 2, "P": 3, "topk": 7, "tail": 0},
                                   {"B": 1, "T": 6, "HI": 1, "DI": 2, "P": 2, "topk": 40, "tail": 1}])
def test_reference_matches_loop_formulation(shape):
    inputs = f64(make_inputs(shape, torch.float32, seed=3))
    scores, pools, indices = SPEC.reference(**inputs)
    want_scores, want_indices = loop_kpool(*(inputs[n] for n in SPEC.arg_names))
    torch.testing.assert_close(scores, want_scores, rtol=1e-12, atol=1e-12)
    assert torch.equal(indices, want_indices)
    assert torch.equal(indices, expand(pools, torch.arange(shape["T"]), shape["P"], indices.shape[-1],
                                       bool(shape["tail"])))


def test_hand_computed_case():
    # T = 5, pools of 2 keys (two complete), one head, DI = 1; gate + ape equal within pool 0 (weights 1/2, 1/2) and
    # log 3 apart in pool 1 (weights 1/4, 3/4): pooled keys (2 + 4) / 2 = 3 and (8 + 3 * 4) / 4 = 5
    k = torch.tensor([[[2.0], [4.0], [8.0], [4.0], [1.0]]], dtype=torch.float64)
    gate = torch.tensor([[[0.0], [0.0], [0.0], [math.log(3.0)], [0.0]]], dtype=torch.float64)
    ape = torch.zeros(2, 1, dtype=torch.float64)
    q = torch.tensor([[[[1.0]], [[1.0]], [[1.0]], [[-1.0]], [[2.0]]]], dtype=torch.float64)
    w = torch.ones(1, 5, 1, dtype=torch.float64)
    torch.testing.assert_close(pooled_keys(k, gate, ape), torch.tensor([[[3.0], [5.0]]], dtype=torch.float64))
    scores, pools, indices = SPEC.reference(q, k, w, gate, ape, 2, True)
    # t = 0: no complete pool; t = 1, 2: pool 0 (3); t = 3: relu(-3), relu(-5) = 0, 0 (a tie: the smaller pool);
    # t = 4: 6 and 10. One pool (topk // P), then a tail of P - 1 = 1 key: (t + 1) % 2 = 1 key where t is even
    want = torch.tensor([[[-INF, -INF], [3.0, -INF], [3.0, -INF], [0.0, 0.0], [6.0, 10.0]]], dtype=torch.float64)
    torch.testing.assert_close(scores, want, rtol=0, atol=1e-12)
    assert pools.tolist() == [[[-1], [0], [0], [0], [1]]]
    assert indices.tolist() == [[[-1, -1, 0], [0, 1, -1], [0, 1, 2], [0, 1, -1], [2, 3, 4]]]  # width topk + P - 1


def test_a_pool_of_one_key_selects_as_dsa_indexer():
    shape = {"B": 2, "T": 24, "HI": 3, "DI": 16, "P": 1, "topk": 5, "tail": 1}
    inputs = make_inputs(shape, torch.float32, seed=4)
    scores, pools, indices = SPEC.reference(**inputs)
    want_scores, want = get_block("dsa_indexer").reference(inputs["q_idx"], inputs["k_idx"], inputs["w"], 5)
    torch.testing.assert_close(scores, want_scores)
    assert torch.equal(pools, want) and torch.equal(indices, want)  # no tail when P = 1


def test_fewer_keys_than_a_pool_leave_only_the_tail():
    inputs = make_inputs(SHAPES["edge"][0], torch.float32, seed=0)  # T = 3, P = 4
    scores, pools, indices = SPEC.reference(**inputs)
    assert scores.shape == (1, 3, 0) and pools.shape == (1, 3, 0)
    assert indices.tolist() == [[[0, -1, -1] + [-1] * 8, [0, 1, -1] + [-1] * 8, [0, 1, 2] + [-1] * 8]]


# --- inputs ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES["smoke"] + SHAPES["edge"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_make_inputs_shapes_dtypes_and_determinism(shape, dtype):
    a, b = make_inputs(shape, dtype, 5), make_inputs(shape, dtype, 5)
    B, T, HI, DI, P = (shape[n] for n in ("B", "T", "HI", "DI", "P"))
    want = {"q_idx": (B, T, HI, DI), "k_idx": (B, T, DI), "w": (B, T, HI), "gate": (B, T, DI), "ape": (P, DI)}
    for name, size in want.items():
        assert a[name].shape == size and a[name].dtype == dtype and torch.equal(a[name], b[name])
    assert a["topk"] == shape["topk"] and a["tail"] is bool(shape["tail"])
    assert not torch.equal(make_inputs(shape, dtype, 6)["gate"], a["gate"])


# --- the comparators -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trial():
    inputs = make_inputs({"B": 2, "T": 64, "HI": 4, "DI": 16, "P": 4, "topk": 16, "tail": 1}, torch.float32, 1)
    truth = SPEC.reference(**f64(inputs))
    low = SPEC.reference(**inputs)
    return truth, low


def test_comparators_accept_the_truth_and_pools_in_any_order(trial):
    (scores, pools, indices), (low_scores, low_pools, low_indices) = trial
    tol = default_tolerance(torch.float32)
    context = {"truth_outputs": {"scores": scores}, "lowp_outputs": {"scores": low_scores}}
    assert compare_indices(low_pools, pools, low_pools, tol, torch.int64, **context)["passed"]
    assert compare_expanded(low_indices, indices, low_indices, tol, torch.int64)["passed"]
    swapped = indices.clone()
    swapped[:, 20:, :8] = torch.cat([indices[:, 20:, 4:8], indices[:, 20:, :4]], dim=-1)  # the first two pools
    assert compare_expanded(swapped, indices, low_indices, tol, torch.int64)["passed"]


def test_expanded_comparator_refuses_padding_causality_repeats_and_other_pools(trial):
    (_, _, indices), (_, _, low) = trial
    tol = default_tolerance(torch.float32)

    def reason(bad):
        return compare_expanded(bad, indices, low, tol, torch.int64)["reason"]

    bad = indices.clone()
    bad[0, 2, 0] = 0  # row 2 has no complete pool: its pool slots are padding
    assert "padding" in reason(bad)
    bad = indices.clone()
    bad[0, 10, 0] = 11  # a key after the query
    assert "not causal" in reason(bad)
    bad = indices.clone()
    bad[0, 30, 1] = bad[0, 30, 0]
    assert "twice" in reason(bad)
    bad = indices.clone()
    for b in range(2):
        for t in range(40, 64):  # the second pool of each row swapped for a complete pool the row did not select
            chosen = {int(x) // 4 for x in indices[b, t, :16] if x >= 0}
            other = min(p for p in range((t + 1) // 4) if p not in chosen)
            bad[b, t, 4:8] = torch.arange(4) + 4 * other
    assert "overlap" in reason(bad)
    assert "dtype" in compare_expanded(indices.int(), indices, low, tol, torch.int64)["reason"]


# --- the spec, the card, the templates -------------------------------------------------------------------------


def test_spec_contract_and_the_onboarding_rule():
    """GLM-5-Next's defaults (pools of 16, top 2048, 32 index heads of 128) on its full-attention layers; a config
    without k-pools (DeepSeek-V3.2's indexer) or with pools of one key is dsa_indexer's."""
    from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig

    from workbench.blocks._config import Config, ModelConfig

    def model(data):
        return ModelConfig(cfg=Config(data), hidden=data["hidden_size"], hidden_field="hidden_size",
                           layers=data["num_hidden_layers"], vocab=None, vocab_field=None, heads=None,
                           heads_field=None, head_dim=None, kda_layers=0, full_layers=12, linear={},
                           linear_field=None)

    assert SPEC.arg_names == ("q_idx", "k_idx", "w", "gate", "ape", "topk", "tail")
    assert SPEC.outputs == ("scores", "pools", "indices") and not SPEC.grad_inputs
    assert set(SPEC.comparators) == {"forward:pools", "forward:indices"}
    fields = Glm5NextTextConfig().to_dict()
    (found,) = SPEC.onboard(model(fields))
    assert found.shapes == [{"B": 1, "T": 8192, "HI": 32, "DI": 128, "P": 16, "topk": 2048, "tail": 1}]
    assert found.layers == 12 and "index_kpool" in found.fields
    assert SPEC.onboard(model({**fields, "index_kpool_always_select_tail": False}))[0].shapes[0]["tail"] == 0
    assert SPEC.onboard(model({**fields, "index_kpool": 1})) == []
    assert SPEC.onboard(model({k: v for k, v in fields.items() if k != "index_kpool"})) == []


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("dsa_kpool_indexer")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["pooled", "fused"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "dsa_kpool_indexer", template, base_seed=7)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:scores", "forward:pools", "forward:indices"}
    assert result.forward_only


def test_expanded_comparator_on_rows_with_nothing_to_select():
    """Fewer keys than a pool and no tail: every entry is padding, and the padding is all there is to judge."""
    shape = {"B": 2, "T": 3, "HI": 2, "DI": 17, "P": 8, "topk": 13, "tail": 0}
    inputs = make_inputs(shape, torch.float32, 0)
    _, _, indices = SPEC.reference(**inputs)
    assert indices.eq(-1).all()
    tol = default_tolerance(torch.float32)
    assert compare_expanded(indices.clone(), indices, indices, tol, torch.int64)["passed"]
    bad = indices.clone()
    bad[1, 2, 0] = 2
    assert "padding" in compare_expanded(bad, indices, indices, tol, torch.int64)["reason"]
