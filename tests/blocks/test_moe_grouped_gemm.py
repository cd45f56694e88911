"""moe_grouped_gemm: the reference against a dense gather-the-expert formulation (SwiGLU and SiTU) and a
hand-computed case, SiTU inputs that reach its caps, gradients, the input factory, and ports on the interpreter (the
agent's pick, and small tiles of the tile map)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from workbench.blocks import get_block
from workbench.blocks.moe_grouped_gemm import hidden_shapes, make_inputs, reference

SPEC = get_block("moe_grouped_gemm")
ALL_SHAPES = SPEC.shapes["smoke"] + SPEC.shapes["edge"]


def dense_formulation(x, offsets, w1, w3, w2, activation, beta, linear_beta, limit=None, alpha=1.0, up_offset=0.0):
    """Every row gathers its own expert's weights (group found by searchsorted), all in float64, one einsum per
    projection, the activation written out (SwiGLU's clamp, alpha and up offset as GPT-OSS's _apply_gate writes
    them); rows past offsets[E] are masked to zero."""
    x, w1, w3, w2 = x.double(), w1.double(), w3.double(), w2.double()
    rows = torch.arange(x.shape[0])
    group = torch.searchsorted(offsets[1:], rows, right=True)
    inside = group < w1.shape[0]
    g = group.clamp(max=w1.shape[0] - 1)
    a = torch.einsum("md,mfd->mf", x, w1[g])
    b = torch.einsum("md,mfd->mf", x, w3[g])
    if activation == "swiglu":
        if limit is not None:
            a, b = a.clamp(max=limit), b.clamp(min=-limit, max=limit)
        h = a * torch.sigmoid(alpha * a) * (b + up_offset)
    else:
        h = beta * torch.tanh(a / beta) * torch.sigmoid(a) * linear_beta * torch.tanh(b / linear_beta)
    y = torch.einsum("mf,mdf->md", h, w2[g])
    return y * inside[:, None]


@pytest.mark.parametrize("shape", ALL_SHAPES, ids=str)
def test_reference_matches_dense_formulation(shape):
    inputs = make_inputs(shape, torch.float64, seed=5)
    got = reference(**inputs)
    torch.testing.assert_close(got, dense_formulation(**inputs), rtol=1e-12, atol=1e-12)


def test_hand_case_with_an_empty_expert_and_a_tail_row():
    x = torch.tensor([[1.0], [2.0], [3.0], [7.0]], dtype=torch.float64)
    offsets = torch.tensor([0, 2, 2, 3])  # expert 0: rows 0-1, expert 1: none, expert 2: row 2; row 3: tail
    w1 = torch.tensor([1.0, 5.0, -1.0], dtype=torch.float64).view(3, 1, 1)
    w3 = torch.tensor([2.0, 5.0, 1.0], dtype=torch.float64).view(3, 1, 1)
    w2 = torch.tensor([3.0, 5.0, 2.0], dtype=torch.float64).view(3, 1, 1)

    def silu(v: float) -> float:
        return v / (1 + math.exp(-v))

    expected = [3 * silu(1) * 2, 3 * silu(2) * 4, 2 * silu(-3) * 3, 0.0]
    torch.testing.assert_close(reference(x, offsets, w1, w3, w2, "swiglu", 4.0, 25.0).flatten(),
                               torch.tensor(expected, dtype=torch.float64))
    with pytest.raises(ValueError, match="unknown activation 'gelu'"):
        reference(x, offsets, w1, w3, w2, "gelu", 4.0, 25.0)


def test_situ_inputs_reach_both_caps_and_leave_swiglu():
    shape = {"N": 64, "k": 2, "D": 64, "F": 64, "E": 2, "hot": 0, "drop": 0, "act": 1}
    inputs = make_inputs(shape, torch.float64, seed=2)
    assert inputs["activation"] == "situ" and (inputs["beta"], inputs["linear_beta"]) == (4.0, 25.0)
    rows = inputs["offsets"][1]
    a, b = inputs["x"][:rows] @ inputs["w1"][0].T, inputs["x"][:rows] @ inputs["w3"][0].T
    assert (a.abs() > 4).float().mean() > 0.1 and (b.abs() > 25).float().mean() > 0.05
    situ_y = reference(**inputs)
    swiglu_y = reference(**{**inputs, "activation": "swiglu"})
    assert (situ_y - swiglu_y).abs().max() > 0.1 * swiglu_y.abs().max()  # the caps change the result


def test_gradcheck_float64_including_an_empty_expert_and_tail_rows():
    inputs = make_inputs({"N": 4, "k": 2, "D": 3, "F": 2, "E": 4, "hot": 1, "drop": 1}, torch.float64, seed=0)
    offsets = inputs["offsets"]
    act = (inputs["activation"], inputs["beta"], inputs["linear_beta"])
    counts = offsets.diff()
    assert (counts == 0).any() and offsets[-1] < 8  # the case exercises an empty group and a tail
    leaves = [inputs[n].clone().requires_grad_(True) for n in ("x", "w1", "w3", "w2")]
    assert torch.autograd.gradcheck(lambda x, a, b, c: reference(x, offsets, a, b, c, *act), leaves)
    situ_inputs = make_inputs({"N": 4, "k": 2, "D": 3, "F": 2, "E": 4, "hot": 1, "drop": 1, "act": 1},
                              torch.float64, seed=0)
    situ_leaves = [situ_inputs[n].clone().requires_grad_(True) for n in ("x", "w1", "w3", "w2")]
    assert torch.autograd.gradcheck(lambda x, a, b, c: reference(x, offsets, a, b, c, "situ", 4.0, 25.0),
                                    situ_leaves)
    y = reference(leaves[0], offsets, *leaves[1:], *act)
    dx, dw1 = torch.autograd.grad(y.sum(), leaves[:2])
    assert (dx[int(offsets[-1]):] == 0).all()  # no gradient reaches the tail rows
    for ex in torch.nonzero(counts == 0).flatten().tolist():
        assert (dw1[ex] == 0).all()  # nor an empty expert's weights


def test_low_precision_output_dtype_and_accuracy():
    inputs = make_inputs({"N": 12, "k": 2, "D": 32, "F": 32, "E": 4, "hot": 0, "drop": 0}, torch.float16, seed=1)
    y = reference(**inputs)
    assert y.dtype == torch.float16
    want = dense_formulation(**inputs)
    assert want.abs().max() > 0.5  # O(1) outputs: the tolerance's absolute floor cannot hide an error
    torch.testing.assert_close(y.double(), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_make_inputs_shapes_dtypes_and_determinism(dtype):
    shape = {"N": 21, "k": 3, "D": 40, "F": 24, "E": 6, "hot": 0, "drop": 1, "act": 0}
    a, b = make_inputs(shape, dtype, seed=3), make_inputs(shape, dtype, seed=3)
    assert a["x"].shape == (63, 40) and a["x"].dtype == dtype
    assert a["w1"].shape == a["w3"].shape == (6, 24, 40) and a["w2"].shape == (6, 40, 24)
    assert a["offsets"].dtype == torch.int64 and a["offsets"].shape == (7,)
    assert a["offsets"][0] == 0 and (a["offsets"].diff() >= 0).all() and a["offsets"][-1] <= 63
    for name in ("x", "offsets", "w1", "w3", "w2"):
        assert torch.equal(a[name], b[name])
    assert not torch.equal(a["x"], make_inputs(shape, dtype, seed=4)["x"])


def test_make_inputs_hot_expert_takes_every_row():
    inputs = make_inputs({"N": 24, "k": 1, "D": 24, "F": 40, "E": 8, "hot": 1, "drop": 0}, torch.float32, seed=0)
    assert int(inputs["offsets"].diff().max()) == 24


def test_hidden_shapes_respect_constraints():
    clamped = 0
    for seed in range(30):
        for shape in hidden_shapes(random.Random(seed)):
            assert set(ALL_SHAPES[0]) <= set(shape) <= {*ALL_SHAPES[0], "limit", "alpha_milli"}
            assert 1 <= shape["k"] <= shape["E"] <= 8 and (shape["act"] == 0 or "limit" not in shape)
            clamped += "limit" in shape
    assert clamped > 10


def test_the_suites_clamp_and_the_clamp_acts():
    """A clamped shape in the smoke suite and the alpha form in the edge suite; their gates and ups reach past the
    limit (the gradient is 0 there), and SiTU takes no SwiGLU variant."""
    clamped = [s for s in ALL_SHAPES if s.get("limit")]
    assert any(s in SPEC.shapes["smoke"] for s in clamped) and any(s.get("alpha_milli") for s in clamped)
    inputs = make_inputs(SPEC.shapes["smoke"][2], torch.float64, seed=0)
    x, w1 = inputs["x"][: int(inputs["offsets"][-1])], inputs["w1"]
    a = torch.einsum("md,efd->emf", x, w1)
    assert inputs["limit"] == 3.0 and float((a > 3).double().mean()) > 0.1
    with pytest.raises(ValueError, match="SwiGLU's variants"):
        reference(**{**inputs, "activation": "situ"})


# --- ports on the interpreter ----------------------------------------------------------------------------------


@pytest.mark.interpreter
def test_port_promotes_a_verified_candidate(settings):
    from workbench.agent.run import port_block
    from workbench.verify.harness import verify_candidate

    outcome = port_block("moe_grouped_gemm", settings, seeds=1)
    assert outcome.status == "promoted", outcome.reason
    result = verify_candidate(outcome.operator_path, seeds=1, suites=["smoke"], base_seed=4321)  # another seed
    assert result.passed, result.message
    assert {"forward:y", "grad:x", "grad:w1", "grad:w3", "grad:w2"} <= {c.direction for c in result.checks}


@pytest.mark.interpreter
def test_small_tiles_split_groups_over_several_row_tiles(tmp_path):
    """BLOCK_M = BLOCK_N = BLOCK_K = 16: groups span several row tiles, D and F several column tiles and
    reduction steps, so the tile map and every mask are exercised (the agent's first pick uses 64-wide tiles)."""
    from workbench.templating import load_template
    from workbench.verify.harness import verify_candidate

    template = load_template("moe_grouped_gemm", "tile_map")
    point = next(p for p in template.points() if p["BLOCK_M"] == p["BLOCK_N"] == p["BLOCK_K"] == 16)
    path = tmp_path / "moe_grouped_gemm_small_tiles.py"
    path.write_text(template.render(point))
    result = verify_candidate(path, suites=["smoke"], dtypes=["float32"], seeds=1, base_seed=7)
    assert result.passed, result.message
