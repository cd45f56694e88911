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


def test_the_gated_norm_of_the_other_activation_is_told_apart():
    """rmsnorm_gated with the sigmoid gate held to Qwen3-Next's silu-gated norm (and with silu to Kimi Linear's
    sigmoid-gated one) is far off: the activation is part of the variant."""
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearRMSNormGated
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated

    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 16, generator=g, dtype=torch.float64).requires_grad_()
    gate = (4 * torch.randn(4, 16, generator=g, dtype=torch.float64)).requires_grad_()
    for cls, other in ((Qwen3NextRMSNormGated, "sigmoid"), (KimiLinearRMSNormGated, "silu")):
        norm = cls(16, eps=1e-5).to(torch.float64)
        row = _compare("rmsnorm_gated", cls.__name__, lambda norm=norm, other=other: get_block("rmsnorm_gated")
                       .reference(x, norm.weight, gate, 1e-5, other), lambda norm=norm: norm(x, gate),
                       [x, norm.weight, gate])
        assert row.output_rel > 1e-2 and row.grad_rel > 1e-2, row


def test_dynamic_taps_in_the_modules_order_are_told_apart():
    """Inkling2's dynamic convolution indexes its taps by backward distance, kda_short_conv oldest input first: the
    taps handed over unflipped compute another convolution, far off."""
    from workbench.integrations.families.inkling2 import dynamic_taps
    from workbench.integrations.references import _inkling2_dynamic_conv, _leaf

    g = torch.Generator().manual_seed(9)
    module, x, given = _inkling2_dynamic_conv(g), _leaf(2, 9, 12, g=g), _leaf(2, 9, 16, g=g)
    weight, taps = dynamic_taps(module, given)
    row = _compare("kda_short_conv", "Inkling2DynamicShortConvolution, taps unflipped",
                   lambda: get_block("kda_short_conv").reference(x, weight.flip(1), False, 9 ** -0.5, taps.flip(-1)),
                   lambda: module(x, given), [x, given, module.static_weight, module.weight_proj.weight])
    assert row.output_rel > 1e-2 and row.grad_rel > 1e-2, row


def test_the_references_table_updates_a_serving_cache_in_place_as_the_op_does():
    """A decode block's reference returns an updated copy of its cache; in the table a probe computes with, the cache
    passed is updated and returned, as the promoted op does (a forward that keeps only y, as the families' do, would
    otherwise decode its next step from a stale state)."""
    from workbench.integrations.ops import references

    spec = get_block("kda_short_conv_decode")
    inputs = spec.make_inputs({"N": 2, "SLOTS": 3, "D": 8, "W": 4, "L": 3}, torch.float64, 0)
    cache = inputs["conv_cache"]
    want_y, want_cache = spec.reference(**{**inputs, "conv_cache": cache.clone()})
    y, returned = references()["kda_short_conv_decode"](*inputs.values())
    assert returned is cache and torch.equal(cache, want_cache) and torch.equal(y, want_y)
