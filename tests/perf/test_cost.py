"""The cost model: the work of each block against hand counts, the roofline floor, and the penalties that make a
spill-free or tensor-core build the cheaper one. Every figure is modelled; nothing here is timed."""

from __future__ import annotations

import pytest

from workbench.agent.rank import rank_passing
from workbench.backends import DEFAULT_TARGETS, TARGETS
from workbench.blocks import REGISTRY
from workbench.models import model_shapes
from workbench.perf import cost


def _build(kernel="k_fwd_kernel", target="sm_90a", **over) -> dict:
    return {"kernel": kernel, "target": target, "suite": "model", "ok": True, "registers": 128, "spilled_bytes": 0,
            "ctas_per_sm": 2, "num_warps": 8, "uses_dot": False, "tensor_cores": None, **over}


def test_every_block_and_every_default_target_has_figures_with_their_source():
    assert set(cost.WORK) == set(REGISTRY)
    assert all(t.peaks.source for t in TARGETS.values())  # every target, the defaults among them, has its peaks
    assert set(DEFAULT_TARGETS) <= set(TARGETS)
    h200 = TARGETS["sm_90a"].peaks
    assert (h200.hbm_bytes_s, h200.bf16_flops, h200.sms) == (4.8e12, 989e12, 132)


def test_rmsnorm_moves_its_rows_twice_forward_and_three_times_backward():
    # 8192 x 7168 bf16: read x, write y (and the weight, and one float32 rstd per row)
    fwd, bwd = cost.WORK["rmsnorm"]({"rows": 8192, "N": 7168})
    assert fwd.bytes == 2 * (2 * 8192 * 7168 + 7168) + 4 * 8192
    assert bwd.bytes == 2 * (3 * 8192 * 7168 + 2 * 7168) + 4 * 8192  # x, dy, dx; w and dw
    assert fwd.tensor_flops == 0


def test_matrix_blocks_count_two_flops_per_multiply_add():
    fwd, _ = cost.WORK["lora_linear"]({"N": 16, "IN": 64, "OUT": 48, "r": 8})
    assert fwd.tensor_flops == 2 * 16 * 48 * 64 + 2 * 16 * 8 * (64 + 48)  # x W^T, then (x A^T) B^T
    fwd, bwd = cost.WORK["moe_grouped_gemm"]({"N": 585, "k": 16, "D": 3584, "F": 3072, "E": 896})
    assert fwd.tensor_flops == 3 * 2 * 585 * 16 * 3584 * 3072  # gate, up and down projections of every row
    assert bwd.tensor_flops == 2 * fwd.tensor_flops
    fwd, _ = cost.WORK["dsa_sparse_attention"]({"B": 1, "T": 8, "H": 2, "HKV": 1, "D": 16, "topk": 4, "gated": 0})
    assert fwd.tensor_flops == 2 * 2 * 8 * 4 * 2 * 16  # q k^T and p v over each query's top-k keys


def test_the_floor_is_the_slower_roof():
    peaks = TARGETS["sm_90a"].peaks
    assert cost.floor_s(cost.Work(bytes=4.8e12), peaks) == pytest.approx(1.0)
    assert cost.floor_s(cost.Work(bytes=1.0, tensor_flops=989e12), peaks) == pytest.approx(1.0)
    assert cost.floor_s(cost.Work(bytes=1.0, tensor_flops=67e12), peaks, tensor_cores=False) == pytest.approx(1.0)


def test_the_spill_free_point_of_two_otherwise_equal_candidates_is_preferred():
    shape = model_shapes("rmsnorm")[0]
    clean = cost.estimate("rmsnorm", shape, "sm_90a", [_build()])
    spilling = cost.estimate("rmsnorm", shape, "sm_90a", [_build(spilled_bytes=256)])
    assert clean.time_s == clean.floor_s and clean.fraction == 1.0 and clean.label == "modelled"
    assert spilling.time_s == pytest.approx(clean.time_s * (1 + 256 / (4 * 128)))
    assert spilling.penalties == ("k_fwd_kernel: spills 256 B/thread (x1.50)",)
    passing = [{"iteration": i, "template": "t", "worst_ratio": ratio, "target_report": {"spill_free_on": free},
                "modelled": cost.modelled_summary("rmsnorm", [shape], builds, ["sm_90a"])}
               for i, ratio, free, builds in ((1, 0.1, [], [_build(spilled_bytes=256)]),
                                              (2, 0.5, ["sm_90a"], [_build()]))]
    ranked, why = rank_passing(passing, ["sm_90a"])
    assert [a["iteration"] for a in ranked] == [2, 1]  # despite its larger error: the gate, then modelled time
    assert why.startswith("ranked 2 passing (spill-free on every required target first") and "#1 t" in why


def test_a_dot_kernel_without_tensor_cores_pays_the_vector_peak_and_an_unresident_one_does_not_run():
    shape = {"N": 8192, "IN": 7168, "OUT": 7168, "r": 64}
    tc = cost.estimate("lora_linear", shape, "sm_90a", [_build(uses_dot=True, tensor_cores=True)])
    fma = cost.estimate("lora_linear", shape, "sm_90a", [_build(uses_dot=True, tensor_cores=False)])
    assert tc.bound == "compute" and fma.time_s / tc.time_s == pytest.approx(989 / 67)
    assert fma.penalties == ("no tensor cores: k_fwd_kernel",)
    stuck = cost.estimate("lora_linear", shape, "sm_90a", [_build(ctas_per_sm=0)])
    assert stuck.time_s is None and stuck.fraction is None and stuck.penalties == ("k_fwd_kernel: cannot be resident",)


def test_too_few_resident_warps_slow_a_memory_bound_kernel_more_than_a_compute_bound_one():
    rows = model_shapes("rmsnorm")[0]  # memory-bound: needs 16 of the H200 SM's 64 warps resident
    full = cost.estimate("rmsnorm", rows, "sm_90a", [_build(ctas_per_sm=4, num_warps=4)])
    thin = cost.estimate("rmsnorm", rows, "sm_90a", [_build(ctas_per_sm=1, num_warps=4)])
    assert full.time_s == full.floor_s and full.penalties == ()
    assert thin.time_s == pytest.approx(4 * thin.floor_s)
    assert thin.penalties == ("k_fwd_kernel: 4 of 64 warps resident per SM (needs 16) (x4.00)",)
    gemm = {"N": 8192, "IN": 7168, "OUT": 7168, "r": 64}  # compute-bound: 8 warps are enough
    one_cta = cost.estimate("lora_linear", gemm, "sm_90a", [_build(ctas_per_sm=1, num_warps=8, uses_dot=True,
                                                                   tensor_cores=True)])
    assert one_cta.bound == "compute" and one_cta.time_s == one_cta.floor_s
    # a pipelined dot kernel keeps num_stages - 1 tile loads in flight per warp: one CTA of 8 warps at 3 stages is
    # enough for the memory-bound roof, at 1 stage it is not
    piped = cost.estimate("rmsnorm", rows, "sm_90a", [_build(ctas_per_sm=1, num_warps=8, num_stages=3, uses_dot=True,
                                                             tensor_cores=True)])
    flat = cost.estimate("rmsnorm", rows, "sm_90a", [_build(ctas_per_sm=1, num_warps=8, num_stages=1, uses_dot=True,
                                                            tensor_cores=True)])
    assert piped.time_s == piped.floor_s and flat.time_s == pytest.approx(2 * flat.floor_s)
    # spills and occupancy of one kernel multiply; the worst kernel's product applies
    both = cost.estimate("rmsnorm", rows, "sm_90a", [_build(ctas_per_sm=2, num_warps=4, spilled_bytes=512),
                                                     _build("k_bwd_kernel", spilled_bytes=1024)])
    assert both.time_s == pytest.approx(both.floor_s * 2 * 2)
    assert both.penalties == ("k_fwd_kernel: spills 512 B/thread, 8 of 64 warps resident per SM (needs 16) "
                              "(x4.00)",)
    # on AMD the CU holds 32 waves: 8 resident are a quarter
    amd = cost.estimate("rmsnorm", rows, "gfx942", [_build(target="gfx942", ctas_per_sm=2, num_warps=4)])
    assert amd.time_s == amd.floor_s


def test_the_forward_alone_ignores_the_backward_kernels():
    shape = model_shapes("rmsnorm")[0]
    fwd = cost.estimate("rmsnorm", shape, "gfx942", [_build("k_bwd_kernel", "gfx942", spilled_bytes=512)],
                        backward=False)
    assert fwd.penalties == () and fwd.time_s == fwd.floor_s


def test_an_unknown_block_is_named():
    with pytest.raises(KeyError, match="no cost model for block 'nope'"):
        cost.work("nope", {})
