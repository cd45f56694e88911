"""Shape suites and work shared by the row-wise blocks (rmsnorm, swiglu, situ): inputs are [rows, N], the op acts
along N."""

from __future__ import annotations

from workbench.blocks.base import BF16, Shape, Work

ROW_SUITES = {
    "smoke": [{"rows": 4, "N": 64}, {"rows": 16, "N": 256}],
    # a single element, a single row, non-power-of-two widths, a width just past a power of two, odd row counts
    "edge": [
        {"rows": 1, "N": 1},
        {"rows": 1, "N": 123},
        {"rows": 7, "N": 1000},
        {"rows": 3, "N": 4097},
        {"rows": 33, "N": 123},
    ],
}


def gated_activation_work(s: Shape) -> tuple[Work, Work]:
    """swiglu's a, b [rows, N] or situ's gate_up [rows, 2N] -> y [rows, N]."""
    e = s["rows"] * s["N"]
    return Work(BF16 * 3 * e), Work(BF16 * 5 * e)
