"""The constant-output integrity check on hand-made trials: a constant where the truth varies by more than the
quantity's allowed error is flagged; a gradient that is zero in exact arithmetic, rounding noise in the truth and
exact zeros from the kernel, is not; gradients are paired with their truth by name."""

from __future__ import annotations

import torch

from workbench.blocks import get_block
from workbench.verify.integrity import evaluate
from workbench.verify.result import Check

SPEC = get_block("rmsnorm")


def _trial(y_truth, dw_truth, y_out, dw_out, bound: float):
    dx = torch.linspace(-1, 1, 8, dtype=torch.float64).reshape(2, 4)
    exp = {"id": 0, "kind": "trial", "shape": "rows=2,N=4", "dtype": "float32", "seed": 0,
           "truth": ((y_truth,), {"x": dx, "weight": dw_truth}),
           "lowp": ((y_truth.float(),), {"x": dx.float(), "weight": (dw_truth + 1e-9).float()})}
    got = {"outputs": [y_out], "grads": {"x": dx.float(), "weight": dw_out}, "launches_fwd": 1, "launches_bwd": 1,
           "ops": {}, "profiled_ops": []}
    checks = [Check(suite="smoke", shape="rows=2,N=4", dtype="float32", seed=0, direction=d, passed=True,
                    bound=bound) for d in ("forward:y", "grad:x", "grad:weight")]
    return evaluate(SPEC, {"events": []}, [exp], {0: got}, {0: checks})


def test_a_constant_gradient_within_its_bound_of_a_varying_truth_is_not_flagged():
    y = torch.linspace(0, 1, 8, dtype=torch.float64).reshape(2, 4)
    noise = torch.tensor([1e-12, -3e-12, 2e-12, 0.0], dtype=torch.float64)  # zero in exact arithmetic
    assert _trial(y, noise, y.float(), torch.zeros(4), bound=1e-6) == []


def test_a_constant_gradient_past_its_bound_is_flagged():
    y = torch.linspace(0, 1, 8, dtype=torch.float64).reshape(2, 4)
    varying = torch.tensor([0.5, -0.25, 0.75, 0.1], dtype=torch.float64)
    failed = _trial(y, varying, y.float(), torch.zeros(4), bound=1e-6)
    assert [c.direction for c in failed] == ["integrity:constant_output"]
    assert failed[0].reason == "constant output where the truth varies: [rows=2,N=4] float32"
