"""vocab_blockwise_ce: the vocabulary-blockwise PyTorch path (online logsumexp, indexed target dot, recomputed
backward) against the shared reference, its numerics where a naive exp would overflow, and one port of the block
through the agent on the Triton interpreter. The reference, the input factory and the shape suites are shared with
seq_chunked_ce and tested once, for both blocks, in test_seq_chunked_ce.py."""

from __future__ import annotations

import pytest
import torch

from workbench.blocks import _linear_ce, get_block
from workbench.blocks.vocab_blockwise_ce import blockwise_loss

SPEC = get_block("vocab_blockwise_ce")
reference = _linear_ce.reference


def draw(shape: dict, dtype=torch.float64, seed: int = 0, reduction: str | None = None) -> dict:
    inputs = SPEC.make_inputs(shape, dtype, seed, "cpu")
    if reduction:
        inputs["reduction"] = reduction
    return inputs


def loss_and_grads(fn, inputs: dict, grad_loss: float = 1.0, frozen_w: bool = False):
    h = inputs["h"].clone().requires_grad_()
    W = inputs["W"].clone().requires_grad_(not frozen_w)
    loss = fn(h, W, inputs["y"], inputs["ignore_index"], inputs["reduction"])
    loss.backward(torch.tensor(grad_loss, dtype=loss.dtype))
    return loss.detach(), h.grad, W.grad


def test_spec_is_registered_with_the_shared_reference():
    assert SPEC.name == "vocab_blockwise_ce"
    assert SPEC.reference is reference and SPEC.make_inputs is _linear_ce.make_inputs
    assert SPEC is not get_block("seq_chunked_ce")


@pytest.mark.parametrize("block", [1, 13, 64, 70, 500])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_blockwise_loss_equals_the_reference(block, reduction):
    inputs = draw({"N": 23, "V": 70, "D": 9}, seed=2, reduction=reduction)
    want = loss_and_grads(reference, inputs, grad_loss=0.6)
    got = loss_and_grads(lambda *a: blockwise_loss(*a, block=block), inputs, grad_loss=0.6)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("shape", [{"N": 1, "V": 9, "D": 4}, {"N": 10, "V": 9, "D": 4, "ignored": 100},
                                   {"N": 6, "V": 2, "D": 1}])
def test_blockwise_loss_edge_cases(shape):
    inputs = draw(shape, seed=4)
    want = loss_and_grads(reference, inputs)
    got = loss_and_grads(lambda *a: blockwise_loss(*a, block=4), inputs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-13)
    if shape.get("ignored") == 100:
        assert float(got[0]) == 0.0 and not got[1].any() and not got[2].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_blockwise_loss_low_precision_and_frozen_weight(dtype):
    inputs = draw({"N": 30, "V": 50, "D": 16}, dtype, seed=1)
    want = loss_and_grads(reference, inputs, frozen_w=True)
    got = loss_and_grads(lambda *a: blockwise_loss(*a, block=16), inputs, frozen_w=True)
    assert got[0].dtype == torch.float32 and got[1].dtype == dtype and got[2] is None
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=2e-3 if dtype == torch.float16 else 1e-5, atol=1e-5)


def test_online_logsumexp_survives_logits_past_the_float32_exp_range():
    # logits in the thousands: exp overflows float32 beyond 88, so every block must be shifted by the running max;
    # the block holding the largest logit comes last, so the running sum is rescaled after earlier blocks
    inputs = draw({"N": 8, "V": 40, "D": 6}, torch.float32, seed=3, reduction="sum")
    inputs["h"] = inputs["h"] * 300
    inputs["W"][-1] = inputs["W"][:-1].abs().max(dim=0).values * 4
    want = loss_and_grads(reference, inputs)
    got = loss_and_grads(lambda *a: blockwise_loss(*a, block=8), inputs)
    assert torch.isfinite(got[0]) and float(got[0]) > 1000
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-4)


# --- port on the interpreter ----------------------------------------------------------------------------------------


@pytest.mark.interpreter
def test_port_promotes_a_candidate_that_verifies(settings):
    from workbench.agent.run import port_block
    from workbench.verify.harness import verify_candidate

    outcome = port_block("vocab_blockwise_ce", settings, seeds=1, budget=4)
    assert outcome.status == "promoted", outcome.reason
    result = verify_candidate(outcome.operator_path, seeds=1, base_seed=2025)
    assert result.passed, result.message
    directions = {c.direction for c in result.checks}
    assert {"forward:loss", "grad:h", "grad:W"} <= directions
    assert {c.dtype for c in result.checks if c.suite != "integrity"} >= {"float32", "float16"}
    assert "N=24,V=64,D=16,ignored=100" in {c.shape for c in result.checks}
