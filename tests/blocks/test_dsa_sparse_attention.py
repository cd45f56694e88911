"""dsa_sparse_attention: the gather-based reference against dense masked attention and hand-computed cases, GQA head
mapping, the gate, empty rows, gradients, the input factory, and one port on the Triton interpreter."""

from __future__ import annotations

import math
import random

import pytest
import torch

from workbench.blocks import get_block
from workbench.blocks.dsa_sparse_attention import SHAPES, hidden_shapes, make_inputs

SPEC = get_block("dsa_sparse_attention")
ALL_SHAPES = SHAPES["smoke"] + SHAPES["edge"]


def dense_attention(q, k, v, indices, gate, scale):
    """Independent formulation in float64: a [B, T, T] mask scattered from the indices, kv heads repeated to every
    query head, full attention with the mask, rows without keys set to 0 afterwards."""
    q, k, v = q.double(), k.double(), v.double()
    B, T, H, _ = q.shape
    G = H // k.shape[2]
    mask = torch.zeros(B, T, T + 1, dtype=torch.bool)
    mask.scatter_(2, indices.masked_fill(indices < 0, T), True)  # column T absorbs the padding
    mask = mask[..., :T]
    k, v = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
    logits = torch.einsum("bthd,bshd->bhts", q, k) * scale
    logits = logits.masked_fill(~mask[:, None], float("-inf"))
    probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # all -inf rows -> NaN -> 0
    out = torch.einsum("bhts,bshd->bthd", probs, v)
    return out * torch.sigmoid(gate.double()) if gate is not None else out


def f64(inputs: dict) -> dict:
    return {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}


# --- the reference ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ALL_SHAPES)
def test_reference_matches_dense_masked_attention(shape):
    inputs = f64(make_inputs(shape, torch.float32, seed=1))
    torch.testing.assert_close(SPEC.reference(**inputs), dense_attention(**inputs), rtol=1e-12, atol=1e-12)


def test_hand_computed_case():
    # T = 3, one head, D = 2, scale 1. Row 0 attends to key 0 only; row 1 to keys 1 and 0 (in that order);
    # row 2 to nothing (all -1).
    q = torch.tensor([[[[1.0, 0.0]], [[0.0, 2.0]], [[5.0, 5.0]]]], dtype=torch.float64)
    k = torch.tensor([[[[1.0, 1.0]], [[0.0, 1.0]], [[9.0, 9.0]]]], dtype=torch.float64)
    v = torch.tensor([[[[2.0, 4.0]], [[6.0, -2.0]], [[7.0, 7.0]]]], dtype=torch.float64)
    indices = torch.tensor([[[0, -1], [1, 0], [-1, -1]]])
    out = SPEC.reference(q, k, v, indices, None, 1.0)
    # row 1: logits q.k1 = 2 and q.k0 = 2: equal weights -> mean of v1 and v0
    want = torch.tensor([[[[2.0, 4.0]], [[4.0, 1.0]], [[0.0, 0.0]]]], dtype=torch.float64)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    # unequal weights: with k0 = (0, 0) and scale ln(3) / 2, row 1's logits are ln 3 (key 1) and 0 (key 0)
    k2 = k.clone()
    k2[0, 0, 0] = torch.tensor([0.0, 0.0], dtype=torch.float64)
    out = SPEC.reference(q, k2, v, indices, None, math.log(3) / 2)
    torch.testing.assert_close(out[0, 1, 0], torch.tensor([0.75 * 6 + 0.25 * 2, 0.75 * -2 + 0.25 * 4],
                                                          dtype=torch.float64), rtol=0, atol=1e-12)
    # the gate: sigmoid(0) = 1/2 halves every output, sigmoid(+-inf) keeps or clears it
    gate = torch.zeros(1, 3, 1, 2, dtype=torch.float64)
    torch.testing.assert_close(SPEC.reference(q, k, v, indices, gate, 1.0), want / 2, rtol=0, atol=1e-12)
    gate[0, 1, 0] = torch.tensor([float("inf"), -float("inf")])
    assert SPEC.reference(q, k, v, indices, gate, 1.0)[0, 1, 0].tolist() == [4.0, 0.0]


def test_order_and_position_of_padding_do_not_matter():
    inputs = f64(make_inputs({"B": 1, "T": 12, "H": 2, "HKV": 1, "D": 8, "topk": 6, "gated": 1}, torch.float32, 2))
    g = torch.Generator().manual_seed(0)
    perm = torch.stack([torch.randperm(6, generator=g) for _ in range(12)])[None]  # shuffles padding in too
    shuffled = {**inputs, "indices": torch.gather(inputs["indices"], 2, perm)}
    torch.testing.assert_close(SPEC.reference(**shuffled), SPEC.reference(**inputs), rtol=1e-12, atol=1e-12)


def test_gqa_heads_share_their_kv_head():
    inputs = f64(make_inputs({"B": 2, "T": 10, "H": 4, "HKV": 2, "D": 8, "topk": 5, "gated": 0}, torch.float32, 3))
    mha = {**inputs, "k": inputs["k"].repeat_interleave(2, dim=2), "v": inputs["v"].repeat_interleave(2, dim=2)}
    torch.testing.assert_close(SPEC.reference(**inputs), SPEC.reference(**mha), rtol=1e-12, atol=1e-12)
    # heads 0, 1 read kv head 0: changing kv head 1 leaves them alone
    other = {**inputs, "v": inputs["v"].clone()}
    other["v"][:, :, 1] += 1.0
    diff = (SPEC.reference(**other) - SPEC.reference(**inputs)).abs().amax(dim=(0, 1, 3))
    assert diff[:2].max() == 0 and diff[2:].min() > 0


def test_float16_computes_in_float32_and_returns_float16():
    inputs = make_inputs({"B": 1, "T": 20, "H": 2, "HKV": 1, "D": 16, "topk": 8, "gated": 1}, torch.float16, 4)
    out = SPEC.reference(**inputs)
    assert out.dtype == torch.float16
    truth = dense_attention(**inputs)
    assert float((out.double() - truth).abs().max()) <= 2 ** -10 * float(truth.abs().max())  # one rounding


@pytest.mark.parametrize("gated", [True, False])
def test_gradients_gradcheck_float64(gated):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 2, 3, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(1, 4, 1, 3, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(1, 4, 1, 3, dtype=torch.float64, generator=g, requires_grad=True)
    gate = torch.randn(1, 4, 2, 3, dtype=torch.float64, generator=g, requires_grad=True) if gated else None
    indices = torch.tensor([[[0, -1, -1], [1, 0, -1], [-1, -1, -1], [3, 1, 2]]])  # row 2 is empty
    args = (q, k, v, gate) if gated else (q, k, v)

    def f(q, k, v, gate=None):
        return SPEC.reference(q, k, v, indices, gate, 0.7)

    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7)


def test_empty_rows_give_zero_output_and_finite_zero_gradients():
    inputs = f64(make_inputs({"B": 1, "T": 16, "H": 2, "HKV": 1, "D": 8, "topk": 4, "gated": 1}, torch.float32, 5))
    inputs["indices"][0, 7] = -1
    leaves = {n: inputs[n].clone().requires_grad_(True) for n in SPEC.grad_inputs}
    out = SPEC.reference(**{**inputs, **leaves})
    assert out[0, 7].abs().max() == 0
    grads = torch.autograd.grad(out, list(leaves.values()), torch.ones_like(out))
    assert all(torch.isfinite(gr).all() for gr in grads)
    dq, dgate = grads[0], grads[3]
    assert dq[0, 7].abs().max() == 0 and dgate[0, 7].abs().max() == 0


# --- inputs and shapes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ALL_SHAPES)
def test_make_inputs_shapes_dtypes_selection_and_determinism(shape):
    B, T, H, HKV, D, topk = (shape[n] for n in ("B", "T", "H", "HKV", "D", "topk"))
    DV = shape.get("DV", D)
    for dtype in (torch.float32, torch.float16):
        a, b = make_inputs(shape, dtype, 8), make_inputs(shape, dtype, 8)
        assert a["q"].shape == (B, T, H, D) and a["k"].shape == (B, T, HKV, D) and a["v"].shape == (B, T, HKV, DV)
        assert a["gate"] is None or a["gate"].shape == (B, T, H, DV)
        assert a["scale"] == pytest.approx(D ** -0.5) and a["indices"].dtype == torch.int64
        assert (a["gate"] is None) == (not shape["gated"])
        for name in ("q", "k", "v", "gate"):
            if a[name] is not None:
                assert a[name].dtype == dtype and torch.equal(a[name], b[name])
        assert torch.equal(a["indices"], b["indices"])
    idx = a["indices"]
    assert idx.shape == (B, T, topk)
    t = torch.arange(T)[None, :, None]
    assert ((idx == -1) | ((idx >= 0) & (idx <= t))).all()  # causal keys or padding
    for row in idx.reshape(-1, topk).tolist():
        valid = [s for s in row if s >= 0]
        assert len(set(valid)) == len(valid) and row[: len(valid)] == valid  # distinct, padding at the end
    assert int((idx < 0).all(-1).sum()) == (B * T) // 16  # the emptied rows; every other row has a causal key


def test_selection_prefers_recent_keys():
    inputs = make_inputs({"B": 2, "T": 80, "H": 1, "HKV": 1, "D": 16, "topk": 8, "gated": 0}, torch.float32, 0)
    idx = inputs["indices"][:, 40:]
    distance = (torch.arange(40, 80)[None, :, None] - idx)[idx >= 0].double()
    assert float(distance.mean()) < 20  # uniform over 41..80 causal keys would average above 20


def test_hidden_shapes_respect_the_constraints():
    rng = random.Random(3)
    for _ in range(50):
        shapes = hidden_shapes(rng)
        assert {s["gated"] for s in shapes} == {0, 1}
        for s in shapes:
            assert s["H"] % s["HKV"] == 0 and 1 <= s["H"] <= 4 and s["HKV"] in (1, 2)
            assert 1 <= s["T"] <= 80 and 16 <= s["D"] <= 32 and 1 <= s["topk"] <= s["T"] + 16


def test_spec_contract():
    assert SPEC.arg_names == ("q", "k", "v", "indices", "gate", "scale")
    assert SPEC.outputs == ("out",) and SPEC.grad_inputs == ("q", "k", "v", "gate")
    suites = SPEC.shapes["smoke"] + SPEC.shapes["edge"]
    assert {s["gated"] for s in suites} == {0, 1} and {s["H"] // s["HKV"] for s in suites} >= {1, 2, 3, 4}


# --- a port on the Triton interpreter --------------------------------------------------------------------------


@pytest.mark.interpreter
def test_port_promotes_a_candidate_that_verifies(settings):
    from workbench.agent.run import port_block
    from workbench.verify.harness import verify_candidate

    outcome = port_block("dsa_sparse_attention", settings, seeds=1, budget=2)
    assert outcome.status == "promoted", outcome.reason
    result = verify_candidate(outcome.operator_path, seeds=1, suites=["smoke"], base_seed=99)
    assert result.passed, result.message
    directions = {c.direction for c in result.checks}
    assert {"forward:out", "grad:q", "grad:k", "grad:v", "grad:gate"} <= directions
