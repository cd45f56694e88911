"""Shape suites, work and onboarding shared by the row-wise blocks (rmsnorm, swiglu, situ): inputs are [rows, N], the
op acts along N."""

from __future__ import annotations

from workbench.blocks._config import Found, ModelConfig
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


GATED_ACTIVATIONS = {"silu": "swiglu", "swish": "swiglu", "situ": "situ"}
"""A config's hidden_act -> the gated activation block that computes it (the FFNs' and the routed experts')."""


def gated_activation_found(model: ModelConfig, block: str, role: str, fields: tuple[str | None, ...] = ()
                           ) -> list[Found]:
    """``block``'s entries when the config's hidden_act is the one it computes: one per gated FFN outside the routed
    experts (the shared experts, the dense layers), ``role`` formatted with ``where`` and ``act``; ``fields``: the
    config fields of the activation's own constants."""
    act, act_field = model.activation()
    if GATED_ACTIVATIONS.get(act) != block:
        return []
    return [Found(role.format(where=where, act=act), layers, [shape], [act_field, *fields, *ffn_fields])
            for where, layers, shape, ffn_fields in model.gated_ffns()]
