"""The catalog's references against the published code that computes the same math (transformers 5.23, PEFT 0.21),
in float64 with transformers' float32 casts turned into float64: outputs and gradients agree to rounding; the
variants the catalog lacks are told apart, not passed off as the same."""

from __future__ import annotations

import pytest
import torch

from workbench.blocks import get_block
from workbench.integrations.references import COMPARISONS, Float64Casts, _compare, _gate_inputs


@pytest.mark.parametrize("comparison", COMPARISONS, ids=lambda c: c.__name__)
def test_the_reference_computes_what_the_published_module_computes(comparison):
    found = comparison()
    for row in found if isinstance(found, list) else [found]:
        if row.same:
            assert row.output_rel < 1e-12 and row.grad_rel < 1e-12, row
        else:
            assert row.output_rel > 1e-2 and row.note, row  # another variant: named, and far from ours


def test_float32_casts_become_float64_inside_the_mode():
    x = torch.ones(3, dtype=torch.float64)
    with Float64Casts():
        assert x.float().dtype == torch.float64 and x.to(torch.float32).dtype == torch.float64
        assert torch.zeros(2, dtype=torch.float32).dtype == torch.float64
        assert torch.softmax(x, -1, dtype=torch.float32).dtype == torch.float64
    assert x.float().dtype == torch.float32


def test_a_look_alike_is_told_apart():
    """The comparison can fail: the bounded gate (lower bound -5) held to Kimi Linear's softplus gate is far off."""
    from transformers.models.kimi_linear.configuration_kimi_linear import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearForgetGate

    gate, x = _gate_inputs(KimiLinearConfig, KimiLinearForgetGate, 5)
    row = _compare("kda_gate", "KimiLinearForgetGate", lambda: get_block("kda_gate").reference(
        gate.f_b_proj(gate.f_a_proj(x)).view(2, 5, 2, 4), gate.A_log.view(2), gate.dt_bias.view(2, 4), -5.0),
        lambda: gate(x), [x, gate.A_log, gate.dt_bias])
    assert row.output_rel > 1e-2
