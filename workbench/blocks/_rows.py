"""Shape suites shared by the row-wise blocks (rmsnorm, swiglu): inputs are [rows, N], the op acts along N."""

from __future__ import annotations

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
