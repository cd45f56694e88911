"""The kda block: the recurrent reference against an independent transition-matrix formulation, against the chunked
(WY) reference at 1e-10 in float64, and against hand-computed cases; delta-rule properties; gradients by gradcheck;
the input factory, the shape suites and the hidden-shape draws; and one port on the Triton interpreter."""

from __future__ import annotations

import math
import random

import pytest
import torch

from workbench.blocks import REGISTRY, get_block
from workbench.blocks.kda import GATE_NORMALIZERS, SHAPES, chunked_reference, hidden_shapes, make_inputs, reference
from workbench.models import model_shapes

SPEC = get_block("kda")
DIMS = ("B", "T", "H", "HV", "K", "V", "h0")
NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def shape(b=1, t=5, h=1, hv=1, dk=4, dv=3, h0=1) -> dict:
    return {"B": b, "T": t, "H": h, "HV": hv, "K": dk, "V": dv, "h0": h0}


def transition_form(q, k, v, g, beta, scale, initial_state):
    """Independent formulation, one (batch, value head) at a time in float64 with explicit matrices:
    S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,  o_t = S_t^T q_t * scale."""
    b, t_len, h, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    group = hv // h
    o = torch.zeros(b, t_len, hv, dv, dtype=torch.float64)
    final = torch.zeros(b, hv, dk, dv, dtype=torch.float64)
    eye = torch.eye(dk, dtype=torch.float64)
    for bi in range(b):
        for vh in range(hv):
            s = torch.zeros(dk, dv, dtype=torch.float64) if initial_state is None else initial_state[bi, vh].double()
            for t in range(t_len):
                kt, qt = k[bi, t, vh // group].double(), q[bi, t, vh // group].double()
                bt = float(beta[bi, t, vh])
                s = (eye - bt * torch.outer(kt, kt)) @ torch.diag(g[bi, t, vh].double().exp()) @ s \
                    + bt * torch.outer(kt, v[bi, t, vh].double())
                o[bi, t, vh] = s.T @ qt * scale
            final[bi, vh] = s
    return o, final


# --- the reference against independent formulations --------------------------------------------------------------


CASES = [shape(), shape(b=2, t=9, h=2, hv=4, dk=5, dv=6, h0=0), shape(t=1, hv=3, dk=3, dv=2)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", range(3))
def test_reference_matches_the_transition_matrix_form(case, seed):
    inputs = make_inputs(case, torch.float64, seed)
    o, final = reference(**inputs)
    o2, final2 = transition_form(**inputs)
    torch.testing.assert_close(o, o2, rtol=0, atol=1e-12)
    torch.testing.assert_close(final, final2, rtol=0, atol=1e-12)


CHUNK_CASES = [
    (shape(t=70, dk=16, dv=16), 64),              # one full chunk and a tail
    (shape(b=2, t=37, h=2, hv=4, dk=24, dv=20, h0=0), 16),  # GVA, odd dims, no initial state, 3 chunks + tail
    (shape(t=64, hv=2, dk=8, dv=8), 64),          # exactly one chunk
    (shape(t=1, hv=2, dk=8, dv=8), 64),           # one token in a chunk of 64
    (shape(b=2, t=130, h=2, hv=2, dk=12, dv=7), 32),
]


@pytest.mark.parametrize("case, chunk", CHUNK_CASES)
@pytest.mark.parametrize("seed", range(3))  # typical, slow and strong decay (GATE_NORMALIZERS)
def test_chunked_reference_equals_the_recurrence_in_float64(case, chunk, seed):
    inputs = make_inputs(case, torch.float64, seed)
    o, final = reference(**inputs)
    o2, final2 = chunked_reference(**inputs, chunk_size=chunk)
    assert o2.shape == o.shape and final2.shape == final.shape
    assert (o - o2).abs().max() < 1e-10
    assert (final - final2).abs().max() < 1e-10


def test_chunked_reference_gradients_equal_the_recurrence():
    inputs = make_inputs(shape(b=2, t=21, h=1, hv=2, dk=6, dv=5), torch.float64, 2)
    grads = []
    for fn in (reference, lambda **kw: chunked_reference(**kw, chunk_size=8)):
        leaves = {n: inputs[n].clone().requires_grad_() for n in NAMES}
        o, final = fn(**leaves, scale=inputs["scale"])
        grads.append(torch.autograd.grad((o * o.cos()).sum() + final.sin().sum(), list(leaves.values())))
    for name, a, b in zip(NAMES, *grads, strict=True):
        assert (a - b).abs().max() < 1e-10, name


def test_chunked_reference_survives_strong_decay_in_float32():
    # about -7 per token: a chunk of 64 reaches -450 in log space; exponentiating the raw cumsum would give inf / 0
    inputs = make_inputs(shape(t=64, dk=16, dv=16), torch.float32, 2)
    assert GATE_NORMALIZERS[2] == 0.1 and float(inputs["g"].sum(1).min()) < -200
    o, final = chunked_reference(**inputs, chunk_size=64)
    o_ref, final_ref = reference(**inputs)
    assert torch.isfinite(o).all() and torch.isfinite(final).all()
    torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(final, final_ref, rtol=1e-4, atol=1e-5)


# --- hand-computed cases and properties ------------------------------------------------------------------------------


def t64(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_one_step_one_channel_by_hand():
    s0, g, beta, k, v, q = 2.0, math.log(0.5), 0.25, 0.8, 3.0, 0.6
    decayed = s0 * 0.5                                   # 1.0
    s1 = decayed + beta * k * (v - k * decayed)          # 1 + 0.25 * 0.8 * (3 - 0.8) = 1.44
    o, final = reference(t64(q).view(1, 1, 1, 1), t64(k).view(1, 1, 1, 1), t64(v).view(1, 1, 1, 1),
                         t64(g).view(1, 1, 1, 1), t64(beta).view(1, 1, 1), 1.0, t64(s0).view(1, 1, 1, 1))
    assert s1 == pytest.approx(1.44)
    assert float(final) == pytest.approx(s1, abs=1e-15)
    assert float(o) == pytest.approx(q * s1, abs=1e-15)   # read after the write


def test_two_orthogonal_keys_are_stored_and_read_back():
    # no decay, beta = 1, k1 = e1 then k2 = e2 with an empty state: S = e1 v1^T + e2 v2^T exactly
    k = torch.zeros(1, 2, 1, 2, dtype=torch.float64)
    k[0, 0, 0, 0] = k[0, 1, 0, 1] = 1.0
    v = t64(1.0, 2.0, 3.0, -4.0, 5.0, 6.0).view(1, 2, 1, 3)
    q = k.clone()                                        # each step queries its own key
    g = torch.zeros(1, 2, 1, 2, dtype=torch.float64)
    beta = torch.ones(1, 2, 1, dtype=torch.float64)
    o, final = reference(q, k, v, g, beta, 0.5, None)
    torch.testing.assert_close(final[0, 0], v[0, :, 0], rtol=0, atol=1e-15)
    torch.testing.assert_close(o, 0.5 * v, rtol=0, atol=1e-15)


@pytest.mark.parametrize("seed", range(3))
def test_beta_one_makes_the_state_return_the_value_just_written(seed):
    # delta rule with beta = 1 and |k| = 1: S_t^T k_t = v_t whatever the history and the decay
    inputs = make_inputs(shape(b=2, t=6, h=1, hv=2, dk=5, dv=4), torch.float64, seed)
    inputs["beta"] = torch.ones_like(inputs["beta"])
    inputs["k"] = inputs["k"] / inputs["k"].norm(dim=-1, keepdim=True)  # unit norm in float64, not just float32
    state = inputs["initial_state"]
    for t in range(6):
        step = {n: (x[:, t:t + 1] if n in ("q", "k", "v", "g", "beta") else x) for n, x in inputs.items()}
        _, state = reference(**{**step, "initial_state": state})
        k_t = inputs["k"][:, t].repeat_interleave(2, dim=1)                   # [B, HV, K]
        torch.testing.assert_close(torch.einsum("bhk,bhkv->bhv", k_t, state), inputs["v"][:, t], rtol=0, atol=1e-12)


def test_strong_decay_forgets_the_past():
    # g = -60 on every channel: the state before a step is gone (exp(-60) ~ 1e-26), so each output is what a single
    # step from an empty state gives
    inputs = make_inputs(shape(t=4, dk=3, dv=2), torch.float64, 0)
    inputs["g"] = torch.full_like(inputs["g"], -60.0)
    o, _ = reference(**inputs)
    for t in range(4):
        step = {n: (x[:, t:t + 1] if n in ("q", "k", "v", "g", "beta") else x) for n, x in inputs.items()}
        o_t, _ = reference(**{**step, "initial_state": None})
        torch.testing.assert_close(o[:, t:t + 1], o_t, rtol=0, atol=1e-20)


def test_value_heads_of_one_group_share_q_and_k():
    # GVA: value heads 2h and 2h+1 read q/k head h; with identical v, g, beta and h0 they give identical outputs
    inputs = make_inputs(shape(t=5, h=2, hv=4, dk=3, dv=2), torch.float64, 1)
    for name in ("v", "g", "beta"):
        inputs[name][:, :, 1::2] = inputs[name][:, :, 0::2]
    inputs["initial_state"][:, 1::2] = inputs["initial_state"][:, 0::2]
    o, final = reference(**inputs)
    torch.testing.assert_close(o[:, :, 1::2], o[:, :, 0::2], rtol=0, atol=0)
    torch.testing.assert_close(final[:, 1::2], final[:, 0::2], rtol=0, atol=0)
    assert not torch.allclose(o[:, :, 0], o[:, :, 2])  # different q/k heads differ


def test_output_dtypes_and_float32_math_for_half_inputs():
    inputs = make_inputs(shape(t=7, dk=8, dv=8), torch.float16, 0)
    o, final = reference(**inputs)
    assert o.dtype == torch.float16 and final.dtype == torch.float32
    truth_o, truth_final = reference(**{n: (x.double() if isinstance(x, torch.Tensor) else x)
                                        for n, x in inputs.items()})
    torch.testing.assert_close(o.double(), truth_o.to(torch.float16).double(), rtol=2e-3, atol=1e-4)
    torch.testing.assert_close(final.double(), truth_final, rtol=1e-5, atol=1e-6)
    o64, final64 = reference(**make_inputs(shape(), torch.float64, 0))
    assert o64.dtype == final64.dtype == torch.float64


# --- gradients -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [reference, lambda *a: chunked_reference(*a, chunk_size=2)],
                         ids=["recurrent", "chunked"])
def test_gradcheck_float64(fn):
    inputs = make_inputs(shape(b=1, t=3, h=1, hv=2, dk=2, dv=3), torch.float64, 0)
    leaves = tuple(inputs[n].clone().requires_grad_() for n in NAMES)
    assert torch.autograd.gradcheck(lambda q, k, v, g, beta, h0: fn(q, k, v, g, beta, inputs["scale"], h0), leaves)


def test_gradients_without_initial_state():
    inputs = make_inputs(shape(t=4, h0=0), torch.float64, 1)
    assert inputs["initial_state"] is None
    leaves = tuple(inputs[n].clone().requires_grad_() for n in NAMES[:5])
    assert torch.autograd.gradcheck(lambda q, k, v, g, beta: reference(q, k, v, g, beta, inputs["scale"], None),
                                    leaves)


# --- inputs ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_make_inputs_shapes_dtypes_and_ranges(dtype):
    for suite in ("smoke", "edge"):
        for case in SHAPES[suite]:
            inputs = make_inputs(case, dtype, 0)
            assert tuple(inputs) == SPEC.arg_names
            b, t, h, hv, dk, dv = (case[d] for d in DIMS[:6])
            expected = {"q": (b, t, h, dk), "k": (b, t, h, dk), "v": (b, t, hv, dv), "g": (b, t, hv, dk),
                        "beta": (b, t, hv)}
            for name, size in expected.items():
                assert tuple(inputs[name].shape) == size and inputs[name].dtype == dtype, name
            assert inputs["scale"] == pytest.approx(dk ** -0.5)
            h0 = inputs["initial_state"]
            if case["h0"]:
                assert tuple(h0.shape) == (b, hv, dk, dv)
                assert h0.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
            else:
                assert h0 is None
            assert float(inputs["g"].max()) <= 0 and 0 < float(inputs["beta"].min()) <= float(inputs["beta"].max()) < 1
            norms = inputs["k"].double().norm(dim=-1)
            torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=5e-3)
            assert float(inputs["q"].min()) >= 0 and float(inputs["v"].min()) >= 0  # uniform draws
            SPEC.reference(**inputs)


def test_make_inputs_deterministic_and_dtype_consistent():
    case = SHAPES["smoke"][0]
    first, again, other = (make_inputs(case, torch.float32, s) for s in (7, 7, 8))
    half = make_inputs(case, torch.float16, 7)
    for name in NAMES:
        assert torch.equal(first[name], again[name]), name
        assert not torch.equal(first[name], other[name]), name
    for name in NAMES[:5]:
        assert torch.equal(half[name], first[name].to(torch.float16)), name
    assert torch.equal(half["initial_state"], first["initial_state"])  # the state stays float32


def test_gate_strength_follows_the_seed():
    means = [float(make_inputs(shape(t=64, dk=32), torch.float32, s)["g"].mean()) for s in range(3)]
    assert -1.2 < means[0] < -0.5        # logsigmoid(N(0, 1)): about -0.8 per token
    assert -0.12 < means[1] < -0.05      # / 10: slow decay, long memory
    assert -12 < means[2] < -5           # / 0.1: strong decay


def test_make_inputs_refuses_bad_gva_ratio():
    with pytest.raises(ValueError, match="multiple"):
        make_inputs(shape(h=2, hv=3), torch.float32, 0)


# --- spec, suites, hidden shapes, model card -------------------------------------------------------------------------


def test_spec_contract():
    assert REGISTRY["kda"] is SPEC
    assert SPEC.arg_names == ("q", "k", "v", "g", "beta", "scale", "initial_state")
    assert SPEC.grad_inputs == NAMES
    assert SPEC.outputs == ("o", "final_state")
    assert SPEC.host_ops == ()  # every sum of partials is a Triton kernel
    outs = SPEC.reference(**make_inputs(SHAPES["smoke"][0], torch.float32, 0))
    assert isinstance(outs, tuple) and len(outs) == 2


def test_suites_cover_the_edge_cases():
    edge = SHAPES["edge"]
    every = SHAPES["smoke"] + edge
    for case in every:
        assert set(case) == set(DIMS) and case["HV"] % case["H"] == 0
    assert any(c["T"] == 1 for c in edge)
    assert any(c["T"] > 64 and c["T"] % 64 for c in edge), "a tail past a 64-token chunk"
    assert any(c["HV"] // c["H"] == 4 for c in edge), "GVA 1:4"
    assert any(c["H"] > 1 and c["HV"] > c["H"] for c in every), "several q/k heads, each with several value heads"
    assert any(c["K"] & (c["K"] - 1) and c["V"] & (c["V"] - 1) for c in edge), "non-power-of-two head dims"
    assert any(c["V"] > 32 for c in edge), "several V tiles"
    assert any(c["B"] > 1 for c in every)
    assert {c["h0"] for c in every} == {0, 1}
    # interpreter budget: sequential steps of a recurrent kernel, summed over the suites
    assert sum(c["B"] * c["HV"] * c["T"] for c in every) <= 320


def test_hidden_shapes_meet_the_constraints():
    for seed in range(200):
        for case in hidden_shapes(random.Random(seed)):
            assert set(case) == set(DIMS)
            assert case["HV"] % case["H"] == 0 and 1 <= case["T"] <= 40 and case["B"] * case["HV"] <= 4
            assert 1 <= case["K"] <= 32 and 1 <= case["V"] <= 32 and case["h0"] in (0, 1)
    drawn = [c for s in range(50) for c in hidden_shapes(random.Random(s))]
    assert len({tuple(c.values()) for c in drawn}) > 50


def test_model_card_shape_uses_the_block_dims():
    shapes = model_shapes("kda")
    assert shapes and all(set(s) == set(DIMS) and s["HV"] % s["H"] == 0 for s in shapes)
    assert {s["K"] for s in shapes} == {128}


# --- the port on the interpreter -------------------------------------------------------------------------------------


@pytest.mark.interpreter
def test_port_promotes_a_candidate_that_verifies(settings):
    from workbench.agent.run import port_block
    from workbench.verify.harness import verify_candidate

    outcome = port_block("kda", settings, seeds=1, budget=3)
    assert outcome.status == "promoted", outcome.reason
    result = verify_candidate(outcome.operator_path, seeds=1, suites=["smoke"], base_seed=2024)  # another seed
    assert result.passed, result.message
    directions = {c.direction for c in result.checks}
    assert {"forward:o", "forward:final_state"} | {f"grad:{n}" for n in NAMES} <= directions
    assert {c.dtype for c in result.checks if c.suite not in ("integrity", "-")} >= {"float32", "float16"}


def test_the_promoted_reduction_is_stack_free_at_every_width_on_the_five_targets(tmp_path):
    """kda_reduce_kernel (the backward's sum over V tiles and GVA heads) as the promoted operator's host launches it,
    REDUCE_TILE sums a program over widths 16 to 256, compiled for the five targets: no stack. Its earlier fixed 32
    rows kept an 8-byte stack frame on sm_100a at 16 wide (4 sums a thread) and on sm_80 at 256 (64 a thread)."""
    import importlib.util
    from pathlib import Path

    from workbench.backends import DEFAULT_TARGETS, get_targets
    from workbench.operators import newest_promoted
    from workbench.verify.aot import compile_for_targets

    path = Path(newest_promoted(Path(__file__).parents[2] / "operators")["kda"]["path"])
    spec = importlib.util.spec_from_file_location("promoted_kda", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    signature = {"x": "*fp32", "y": "*bf16", "R": "i32", "N": "i32", "S": "i32", "M": "i32", "BN": "constexpr",
                 "BM": "constexpr"}
    launches = [{"kernel": "kda_reduce_kernel", "module": "candidate", "file": "", "suite": "model",
                 "options": {"num_warps": 4}, "signature": signature,
                 "constexprs": {"BN": max(1, module.REDUCE_TILE // width), "BM": width}} for width in (16, 64, 256)]
    report = compile_for_targets(path, "reduce", launches, get_targets(list(DEFAULT_TARGETS)), cache_dir=tmp_path)
    assert len(report.builds) == 15 and all(b.ok for b in report.builds), [b.error for b in report.builds]
    assert {(b.target, b.spilled_bytes) for b in report.builds if b.spilled_bytes} == set()
