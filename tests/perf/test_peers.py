"""Triton peers side by side (workbench.perf.peers): a peer's own function is its candidate file; Liger's RMSNorm
captured, compiled and modelled beside ours; an autotuned kernel captured with every config it would try, and the
cost model taking the config it models fastest. Every figure is modelled; nothing here is timed."""

from __future__ import annotations

import ast
import textwrap

import pytest

from workbench.blocks import REGISTRY
from workbench.perf import cost
from workbench.perf.bench import BenchRow
from workbench.perf.peers import (
    TRITON_PACKAGES,
    against_measured,
    candidate_source,
    peer_rows,
    ratios,
    triton_peers,
)


def test_every_triton_peer_is_a_candidate_file_of_its_own_source():
    """Each peer function imports its package in its body, so its source alone, under BLOCK, is a candidate the
    sandbox runs (it imports nothing of the workbench)."""
    peers = [(name, p) for name, spec in REGISTRY.items() for p in spec.peers if p.package in TRITON_PACKAGES]
    assert {n for n, _ in peers} >= {"kda", "kda_decode", "kda_prefill", "rmsnorm", "rmsnorm_gated", "swiglu",
                                     "seq_chunked_ce", "vocab_blockwise_ce"}
    for block, peer in peers:
        tree = ast.parse(candidate_source(block, peer))
        assert f'BLOCK = "{block}"' in candidate_source(block, peer)
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(
            "workbench")]
        assert any(isinstance(n, ast.Assign) and n.targets[0].id == "run" for n in tree.body)


@pytest.mark.skipif(not triton_peers("rmsnorm"), reason="liger_kernel is not installed")
def test_liger_rmsnorm_is_captured_compiled_and_modelled_beside_ours(tmp_path):
    shapes = [{"rows": 8192, "N": 7168}]
    rows = peer_rows("rmsnorm", shapes, ["sm_90a", "gfx942"], tmp_path)
    liger = [r for r in rows if r.subject == "liger"]
    assert {(r.target, r.passes) for r in liger} == {(t, p) for t in ("sm_90a", "gfx942") for p in ("fwd", "fwd+bwd")}
    assert all(r.time_ms and r.time_ms >= r.floor_ms for r in liger)  # compiled, no kernel refused
    assert {(r.passes, r.note) for r in liger} == {("fwd", "1 launch a call"), ("fwd+bwd", "2 launches a call")}
    ours = [BenchRow(r.block, "operator", r.target, r.shape, r.passes, r.label, r.time_ms * 2, r.floor_ms, 0.5)
            for r in liger]
    assert set(ratios(liger + ours).values()) == {2.0}


AUTOTUNED = textwrap.dedent('''
    import torch
    import triton
    import triton.language as tl

    BLOCK = "rmsnorm"


    @triton.autotune(configs=[triton.Config({"BN": 64}, num_warps=1), triton.Config({"BN": 256}, num_warps=4)],
                     key=["N"])
    @triton.jit
    def scale_rows_kernel(X, W, Y, N, eps, BN: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        acc = tl.zeros([BN], dtype=tl.float32)
        for n0 in range(0, N, BN):
            cols = n0 + tl.arange(0, BN)
            x = tl.load(X + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, 0) / N + eps)
        for n0 in range(0, N, BN):
            cols = n0 + tl.arange(0, BN)
            x = tl.load(X + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
            w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
            tl.store(Y + row * N + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=cols < N)


    def run(x, weight, eps):
        y = torch.empty_like(x)
        n = x.shape[-1]
        scale_rows_kernel[(x.numel() // n,)](x, weight, y, n, eps)
        return y
''')


def test_an_autotuned_kernel_is_captured_with_every_config_and_modelled_at_its_best(tmp_path):
    from workbench.verify.harness import target_report

    path = tmp_path / "autotuned.py"
    path.write_text(AUTOTUNED)
    shapes = [{"rows": 64, "N": 1000}, {"rows": 64, "N": 5000}]
    report = target_report(path, targets=["sm_90a"], forward_only=True, shapes=shapes)
    assert report.verdict == "pass", report.message
    tuned = [b for b in report.builds if b["suite"] == "model"]
    first = [b for b in tuned if b["specialization"]["autotune"]["call"] == 1]
    assert sorted((b["specialization"]["autotune"]["config"], b["num_warps"]) for b in first) == [(0, 1), (1, 4)]
    chosen = cost.autotuner_choice(tuned, "sm_90a", "memory")
    assert len(chosen) == 2  # per tuner call (a shape), one config modelled: the one the cost model finds fastest
    assert report.launches_per_call == {"rows=64,N=1000": {"fwd": 1}, "rows=64,N=5000": {"fwd": 1}}
    spilling = {**min(first, key=lambda b: b["num_warps"]), "spilled_bytes": 512}
    other = max(first, key=lambda b: b["num_warps"])
    assert cost.autotuner_choice([spilling, other], "sm_90a", "memory") == [other]


def test_the_cost_model_is_held_to_measurements_of_ours_and_the_peers():
    """On a GPU (bench/gpu_check.sh) each subject's measured and modelled times side by side: the model's error, and
    ours / peer measured and modelled. Fabricated rows here: the arithmetic, not a GPU."""
    def row(subject, label, ms, shape="N=1"):
        return BenchRow("rmsnorm", subject, "sm_90a", shape, "fwd", label, ms, 0.05, None)

    measured = [row("operator", "measured", 0.2), row("operator", "measured", 0.2, "N=2"),
                row("liger", "measured", 0.5), row("liger", "measured", 0.3, "N=2"), row("eager", "measured", 1.0)]
    modelled = [row("operator", "modelled", 0.1), row("operator", "modelled", 0.1, "N=2"),
                row("liger", "modelled", 0.4)]
    lines = {x["subject"]: x for x in against_measured(measured, modelled)}
    assert set(lines) == {"operator", "liger"}  # eager has no modelled figure
    assert lines["operator"]["model_error"] == pytest.approx(0.2 / 0.4 - 1)
    assert lines["liger"]["ours_over_measured"] == pytest.approx(0.4 / 0.8)
    assert lines["liger"]["ours_over_modelled"] == pytest.approx(0.2 / 0.4)
