"""seq_chunked_ce, and the linear + cross-entropy reference it shares with vocab_blockwise_ce
(workbench/blocks/_linear_ce.py; tested here once for both blocks): the reference against hand-computed cases and an
independent formulation, its conventions (float32 loss, 0 for a mean over no tokens), float64 gradcheck, the input
factory and the shape suites; the sequence-chunked PyTorch path against the reference; and one port of the block
through the agent on the Triton interpreter."""

from __future__ import annotations

import math
import random
import re

import pytest
import torch
import torch.nn.functional as F

from workbench.blocks import _linear_ce, get_block
from workbench.blocks.base import shape_label
from workbench.blocks.seq_chunked_ce import chunked_loss, liger_chunk_rows
from workbench.models import model_shapes
from workbench.numerics import default_tolerance
from workbench.templating import list_templates

BLOCKS = ("seq_chunked_ce", "vocab_blockwise_ce")
SPEC = get_block("seq_chunked_ce")
reference = _linear_ce.reference


def f64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def loss_f64(h, W, y, ignore_index, reduction) -> torch.Tensor:
    """The loss written out token by token in float64: max-shifted logsumexp, no torch cross_entropy."""
    h, W = h.double(), W.double()
    total, count = torch.zeros((), dtype=torch.float64), 0
    for i in range(h.shape[0]):
        if int(y[i]) == ignore_index:
            continue
        z = W @ h[i]
        top = z.max()
        total = total + top + torch.log(torch.exp(z - top).sum()) - z[int(y[i])]
        count += 1
    return total / max(count, 1) if reduction == "mean" else total


def grads_f64(h, W, y, ignore_index, reduction, grad_loss=1.0):
    """dh, dW from the closed form dlogits = (softmax - onehot) * valid * scale."""
    h, W = h.double(), W.double()
    valid = y != ignore_index
    probs = torch.softmax(h @ W.T, dim=-1)
    onehot = F.one_hot(torch.where(valid, y, 0), W.shape[0]).double()
    scale = 1 / max(int(valid.sum()), 1) if reduction == "mean" else 1.0
    dlogits = (probs - onehot) * valid[:, None] * scale * grad_loss
    return dlogits @ W, dlogits.T @ h


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


# --- the spec of both blocks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", BLOCKS)
def test_spec_contract(block):
    spec = get_block(block)
    assert spec.name == block and spec.family == "loss"
    assert spec.arg_names == ("h", "W", "y", "ignore_index", "reduction")
    assert spec.grad_inputs == ("h", "W") and spec.outputs == ("loss",)
    assert spec.reference is _linear_ce.reference, "both blocks compute the same quantity"
    assert spec.host_ops == (), "every step of the loss runs in a kernel"
    assert spec.tolerance(torch.float16) == default_tolerance(torch.float16)
    assert "def reference" in spec.reference_source()
    assert spec.shapes is _linear_ce.SUITES and spec.hidden_shapes is _linear_ce.hidden_shapes


@pytest.mark.parametrize("block", BLOCKS)
def test_model_card_shapes_use_the_block_dims(block):
    shapes = model_shapes(block)
    assert shapes == [{"N": 8192, "V": 163840, "D": 7168}]  # Kimi: vocabulary 163840 (public), hidden 7168 (K2's)


# --- the reference --------------------------------------------------------------------------------------------------


def test_reference_hand_case():
    # logits = h @ W^T = [[1, 0, 0], [0, 1, 0], [0, 0, 0]]; row 1's target ignored
    h = f64([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    W = f64([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    y = torch.tensor([0, -100, 2])
    loss0 = math.log(math.e + 2) - 1  # logsumexp([1, 0, 0]) - 1
    loss2 = math.log(3)  # three equal logits
    for reduction, expected in [("sum", loss0 + loss2), ("mean", (loss0 + loss2) / 2)]:
        got = reference(h, W, y, -100, reduction)
        assert got.dtype == torch.float64 and got.shape == ()
        assert abs(float(got) - expected) < 1e-14


def test_reference_hand_gradients():
    # one token, logits [0, 0] (h = 0): softmax [1/2, 1/2], target 1 -> dlogits [1/2, -1/2]
    h = f64([[0.0, 0.0, 0.0]]).requires_grad_()
    W = f64([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]).requires_grad_()
    reference(h, W, torch.tensor([1]), -100, "mean").backward()
    torch.testing.assert_close(h.grad, f64([[0.5 - 2.0, 1.0 - 2.5, 1.5 - 3.0]]), rtol=0, atol=1e-15)
    torch.testing.assert_close(W.grad, torch.zeros(2, 3, dtype=torch.float64), rtol=0, atol=0)  # h = 0


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shape", [{"N": 7, "V": 33, "D": 5}, {"N": 40, "V": 100, "D": 24}, {"N": 1, "V": 9, "D": 3}])
def test_reference_matches_token_by_token_formula(shape, reduction):
    inputs = draw(shape, seed=3, reduction=reduction)
    loss, dh, dW = loss_and_grads(reference, inputs, grad_loss=0.7)
    expected = loss_f64(**inputs)
    assert abs(float(loss) - float(expected)) < 1e-12 * max(1.0, abs(float(expected)))
    edh, edW = grads_f64(**inputs, grad_loss=0.7)
    torch.testing.assert_close(dh, edh, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(dW, edW, rtol=1e-12, atol=1e-14)


def test_all_targets_ignored_gives_zero_not_nan():
    inputs = draw({"N": 6, "V": 10, "D": 4, "ignored": 100}, reduction="mean")
    assert bool((inputs["y"] == -100).all())
    # torch's own mean over no tokens is 0 / 0
    assert math.isnan(float(F.cross_entropy(inputs["h"] @ inputs["W"].T, inputs["y"], ignore_index=-100)))
    for reduction in ("mean", "sum"):
        loss, dh, dW = loss_and_grads(reference, {**inputs, "reduction": reduction}, grad_loss=2.0)
        assert float(loss) == 0.0
        assert torch.equal(dh, torch.zeros_like(dh)) and torch.equal(dW, torch.zeros_like(dW))


def test_ignored_tokens_change_nothing_but_the_count():
    inputs = draw({"N": 12, "V": 20, "D": 6, "ignored": 0}, reduction="sum")
    masked = {**inputs, "y": inputs["y"].clone()}
    masked["y"][[2, 5]] = -100
    keep = [i for i in range(12) if i not in (2, 5)]
    sub = {**inputs, "h": inputs["h"][keep], "y": inputs["y"][keep]}
    for reduction in ("mean", "sum"):
        a = reference(**{**masked, "reduction": reduction})
        b = reference(**{**sub, "reduction": reduction})
        assert abs(float(a) - float(b)) < 1e-12
    _, dh, _ = loss_and_grads(reference, masked)
    assert torch.equal(dh[[2, 5]], torch.zeros(2, 6, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_loss_is_float32_and_gradients_keep_the_input_dtype(dtype):
    inputs = draw({"N": 8, "V": 16, "D": 8}, dtype)
    loss, dh, dW = loss_and_grads(reference, inputs)
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert dh.dtype == dtype and dW.dtype == dtype
    truth = loss_f64(**inputs)  # the same rounded inputs, float64 math
    assert abs(float(loss) - float(truth)) < 1e-5 * abs(float(truth))  # float32 math, no low-precision logits


def test_float16_logits_are_computed_in_float32():
    # a logit of 300 * 300 = 90000 overflows float16 (max 65504): float16 logits would give inf - inf = nan
    h = torch.full((1, 1), 300.0, dtype=torch.float16)
    W = torch.tensor([[300.0], [299.0]], dtype=torch.float16)
    loss = reference(h, W, torch.tensor([1]), -100, "mean")
    assert loss.dtype == torch.float32
    assert abs(float(loss) - float(loss_f64(h, W, torch.tensor([1]), -100, "mean"))) < 1e-4  # ~ 300 + log1p(e^-300)


def test_float64_is_computed_in_float64():
    inputs = draw({"N": 9, "V": 30, "D": 11}, torch.float64, seed=5)
    loss = reference(**inputs)
    assert loss.dtype == torch.float64
    assert abs(float(loss) - float(loss_f64(**inputs))) < 1e-13 * abs(float(loss))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_reference_gradcheck_float64(reduction):
    inputs = draw({"N": 5, "V": 7, "D": 3}, seed=1, reduction=reduction)
    inputs["y"][1] = -100
    h = inputs["h"].clone().requires_grad_()
    W = inputs["W"].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda h, W: reference(h, W, inputs["y"], -100, reduction), (h, W))


def test_reference_refuses_an_unknown_reduction():
    inputs = draw({"N": 2, "V": 3, "D": 2})
    with pytest.raises(ValueError, match="reduction"):
        reference(inputs["h"], inputs["W"], inputs["y"], -100, "none")


# --- inputs ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_make_inputs_declared_shapes_and_dtypes(dtype):
    for suite in ("smoke", "edge"):
        for shape in SPEC.shapes[suite]:
            inputs = SPEC.make_inputs(shape, dtype, 0, "cpu")
            assert tuple(inputs) == SPEC.arg_names
            n, v, d = shape["N"], shape["V"], shape["D"]
            assert inputs["h"].shape == (n, d) and inputs["W"].shape == (v, d) and inputs["y"].shape == (n,)
            assert inputs["h"].dtype == dtype and inputs["W"].dtype == dtype and inputs["y"].dtype == torch.int64
            assert torch.isfinite(inputs["h"]).all() and torch.isfinite(inputs["W"]).all()
            y = inputs["y"]
            assert bool(((y == -100) | ((y >= 0) & (y < v))).all())
            assert int((y == -100).sum()) == round(n * shape.get("ignored", 20) / 100)
            assert inputs["ignore_index"] == -100 and inputs["reduction"] == "mean"
            assert torch.isfinite(SPEC.reference(**inputs))


def test_make_inputs_deterministic_and_alternating_reduction():
    shape = SPEC.shapes["smoke"][1]
    first, again, other = (SPEC.make_inputs(shape, torch.float32, s, "cpu") for s in (6, 6, 7))
    for name in ("h", "W", "y"):
        assert torch.equal(first[name], again[name]), name
        assert not torch.equal(first[name], other[name]), name
    assert (first["reduction"], other["reduction"]) == ("mean", "sum")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_make_inputs_same_problem_in_every_dtype(dtype):
    shape = SPEC.shapes["smoke"][0]
    f32, low = SPEC.make_inputs(shape, torch.float32, 3, "cpu"), SPEC.make_inputs(shape, dtype, 3, "cpu")
    assert torch.equal(low["h"], f32["h"].to(dtype)) and torch.equal(low["W"], f32["W"].to(dtype))
    assert torch.equal(low["y"], f32["y"])


@pytest.mark.parametrize("seed", range(3))
def test_make_inputs_look_like_a_trained_head(seed):
    inputs = SPEC.make_inputs({"N": 400, "V": 500, "D": 64}, torch.float32, seed, "cpu")
    h, W, y = inputs["h"], inputs["W"], inputs["y"]
    logits = h @ W.T
    assert 2.0 < float(logits.std()) < 4.5  # trained heads: logit std 2-4
    ignored = (y == -100).nonzero().squeeze(1)
    assert len(ignored) == 80
    run = max(len(list(g)) for g in _runs(ignored.tolist()))
    assert run >= 40, "half of the ignored targets form one contiguous span"
    valid = y != -100
    margin = logits[valid].gather(1, y[valid][:, None]).squeeze(1) - logits[valid].mean(1)
    assert float(margin.mean()) > 3, "targets lean high, as a trained model's do"
    loss = float(SPEC.reference(h, W, y, -100, "mean"))
    assert 1.0 < loss < math.log(500), loss
    counts = torch.bincount(y[valid], minlength=500)
    assert int(counts.max()) >= 5, "Zipf: the most frequent target repeats"


def _runs(values: list[int]):
    """Groups of consecutive integers."""
    group: list[int] = []
    for v in values:
        if group and v != group[-1] + 1:
            yield group
            group = []
        group.append(v)
    if group:
        yield group


# --- shape suites ---------------------------------------------------------------------------------------------------


def test_smoke_and_edge_suites():
    assert set(SPEC.shapes) == {"smoke", "edge"}
    shapes = SPEC.shapes["smoke"] + SPEC.shapes["edge"]
    for shape in shapes:
        assert {"N", "V", "D"} <= set(shape) <= {"N", "V", "D", "ignored"}
    edge = SPEC.shapes["edge"]
    assert any(s["N"] == 1 for s in edge), "a single token"
    assert any(s.get("ignored") == 100 for s in edge), "every target ignored"
    assert any(s["V"] < 64 and s["D"] < 16 for s in edge), "a vocabulary below one tile, D below one tile"
    odd = [s for s in edge if all(s[k] % 2 for k in ("N", "V", "D"))]
    assert any(s["N"] > 64 and s["V"] > 256 and s["D"] > 64 for s in odd), "several tiles of odd sizes"
    assert len({shape_label(s) for s in shapes}) == len(shapes)


def test_hidden_shapes_stay_within_the_suites():
    shapes = SPEC.shapes["smoke"] + SPEC.shapes["edge"]
    drawn = SPEC.hidden_shapes(random.Random(0))
    assert drawn == SPEC.hidden_shapes(random.Random(0)) and len(drawn) == 2
    seen = [shape for seed in range(50) for shape in SPEC.hidden_shapes(random.Random(seed))]
    for dim, low in (("N", 1), ("V", 2), ("D", 1)):
        assert all(low <= s[dim] <= max(t[dim] for t in shapes) for s in seen), dim
    assert len({shape_label(s) for s in seen}) > 90, "fresh shapes each time"


# --- the sequence-chunked PyTorch path ------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 5, 16, 40, 1000])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_chunked_loss_equals_the_reference(chunk, reduction):
    inputs = draw({"N": 40, "V": 70, "D": 9}, seed=2, reduction=reduction)
    want = loss_and_grads(reference, inputs, grad_loss=-1.3)
    got = loss_and_grads(lambda *a: chunked_loss(*a, chunk=chunk), inputs, grad_loss=-1.3)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("shape", [{"N": 1, "V": 9, "D": 4}, {"N": 10, "V": 9, "D": 4, "ignored": 100}])
def test_chunked_loss_edge_cases(shape):
    inputs = draw(shape, seed=4)
    want = loss_and_grads(reference, inputs)
    got = loss_and_grads(lambda *a: chunked_loss(*a, chunk=3), inputs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_chunked_loss_low_precision_and_frozen_weight(dtype):
    inputs = draw({"N": 30, "V": 50, "D": 16}, dtype, seed=1)
    want = loss_and_grads(reference, inputs, frozen_w=True)
    got = loss_and_grads(lambda *a: chunked_loss(*a, chunk=8), inputs, frozen_w=True)
    assert got[0].dtype == torch.float32 and got[1].dtype == dtype and got[2] is None
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=2e-3 if dtype == torch.float16 else 1e-5, atol=1e-5)


def test_chunked_loss_backward_runs_once():
    inputs = draw({"N": 6, "V": 10, "D": 4}, torch.float32)
    h = inputs["h"].clone().requires_grad_()
    loss = chunked_loss(h, inputs["W"], inputs["y"], -100, "mean", chunk=4)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        loss.backward()  # the stored gradients were scaled in place: a second pass would scale them again


def test_liger_chunk_rows():
    assert liger_chunk_rows(16384, 32000, 4096) == 2048  # Liger's worked example: BT 4096*4, V 32000, H 4096
    assert liger_chunk_rows(8192, 163840, 7168) == 512  # Kimi: the chunk's logits ~ N x D
    assert liger_chunk_rows(8192, 163840, 7168, mem_ratio=2) == 1024
    assert liger_chunk_rows(5, 100, 1000) == 5  # never more than N
    assert liger_chunk_rows(7, 10000, 1) == 1


# --- templates of both blocks ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", BLOCKS)
def test_templates_render_each_choice_to_a_candidate(block):
    templates = list_templates(block)
    assert len(templates) >= 2 and len({t.rank for t in templates}) == len(templates)
    for t in templates:
        assert t.summary and t.tradeoffs, t.ref
        assert "DLOGITS_DTYPE" in t.params and t.requires == [], "every shape is covered by masks"
        points = list(t.points())
        first = points[0]
        for point in [first] + [p for p in points if sum(p[k] != first[k] for k in p) == 1]:
            source = t.render(point)
            compile(source, f"{t.name}.py", "exec")
            assert f'BLOCK = "{block}"' in source and "def run(h, W, y, ignore_index, reduction):" in source
            kernels = re.findall(r"@triton\.jit\ndef (\w+)\(", source)
            launched = [k for k in kernels if k.endswith("_kernel")]
            assert launched and all(re.fullmatch(rf"{block}_\w*(fwd|bwd)_kernel", k) for k in launched), kernels
            assert "{{" not in source and "{%" not in source and "{#" not in source
            assert not re.search(r"torch\.(mm|matmul|addmm|logsumexp|softmax)|cross_entropy", source), "kernels only"


# --- port on the interpreter ----------------------------------------------------------------------------------------


@pytest.mark.interpreter
def test_port_promotes_a_candidate_that_verifies(settings):
    from workbench.agent.run import port_block
    from workbench.verify.harness import verify_candidate

    outcome = port_block("seq_chunked_ce", settings, seeds=1, budget=4)
    assert outcome.status == "promoted", outcome.reason
    result = verify_candidate(outcome.operator_path, seeds=1, base_seed=2024)
    assert result.passed, result.message
    directions = {c.direction for c in result.checks}
    assert {"forward:loss", "grad:h", "grad:W"} <= directions
    assert {c.dtype for c in result.checks if c.suite != "integrity"} >= {"float32", "float16"}
    assert "N=133,V=381,D=77" in {c.shape for c in result.checks}
