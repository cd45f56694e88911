"""Selective caching: what the named blocks save for backward lives in the host tier and comes back for the
backward; the curve, the trained parameters and the eval top-k are bit-identical to the run without caching, and
the device tier holds less."""

from __future__ import annotations

import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.replay.arch import architecture
from workbench.replay.ops import load_ops, reference_ops
from workbench.replay.presets import get_preset
from workbench.replay.tiers import Tiers, accounted, cached_ops, parse_cache
from workbench.replay.train import train

TINY = get_preset("tiny")
PRO = architecture("kimi-k3.1-pro", TINY.layers)
CACHED = ("moe_grouped_gemm", "kda", "attnres")


def _run(cache: tuple[str, ...]) -> tuple:
    tiers = Tiers()
    ops = cached_ops(load_ops(reference_ops(PRO.blocks)), cache, tiers, account=True)
    return train(TINY, PRO, "scratch", 4, 0, ops), tiers


@pytest.mark.slow  # two in-process trainings of 4 steps
def test_caching_in_the_host_tier_is_bit_identical_and_moves_bytes_off_the_device():
    torch.set_num_threads(1)
    plain, plain_tiers = _run(())
    cached, cached_tiers = _run(CACHED)
    assert cached.curve == plain.curve and cached.grad_norms == plain.grad_norms
    assert cached.fingerprints == plain.fingerprints
    assert (cached.topk_values, cached.topk_ids) == (plain.topk_values, plain.topk_ids)
    assert plain_tiers.to_host == 0 and plain_tiers.peak["host"] == 0
    # every saved tensor goes out once; it comes back when its backward runs (at most once)
    assert 0 < cached_tiers.to_device <= cached_tiers.to_host
    assert cached_tiers.peak["device"] < plain_tiers.peak["device"]
    assert cached_tiers.live == {"device": 0, "host": 0}  # everything released after the backward
    # at the device tier's peak, its bytes by the block that saved them add up to the peak; the cached blocks held
    # none there
    assert sum(plain_tiers.device_peak_by_block.values()) == plain_tiers.peak["device"]
    assert sum(cached_tiers.device_peak_by_block.values()) == cached_tiers.peak["device"]
    assert all(plain_tiers.device_peak_by_block[b] > 0 for b in CACHED)
    assert all(cached_tiers.device_peak_by_block.get(b, 0) == 0 for b in CACHED)


def test_saved_bytes_are_counted_by_the_block_that_saved_them():
    """A block's op saves its input (the ``x * w`` product); the glue around it saves another; each counted under
    its name while the graph holds it, released with the graph."""
    tiers = Tiers()
    ops = cached_ops({"scale": lambda x, w: x * w}, (), tiers, account=True)
    x = torch.randn(8, 4, requires_grad=True)
    w = torch.randn(8, 4, requires_grad=True)
    with accounted(tiers):
        y = ops["scale"](x.exp(), w)  # exp saves its output (glue); the product saves both of its inputs
    assert tiers.device_by_block == {"glue": 128, "scale": 128}  # w is a leaf that needs grad: not an activation
    assert tiers.device_peak_by_block == {"glue": 128, "scale": 128} and tiers.peak["device"] == 256
    y.sum().backward()
    del y
    assert tiers.device_by_block == {"glue": 0, "scale": 0} and tiers.live["device"] == 0


def test_the_cache_spec_names_blocks_of_the_model_and_a_tier():
    assert parse_cache("moe_grouped_gemm,kda:host", PRO.blocks) == ("moe_grouped_gemm", "kda")
    assert parse_cache(None, PRO.blocks) == ()
    for bad, message in [("kda", "bad --cache"), ("kda:disk", "bad --cache"), (":host", "bad --cache"),
                         ("mla:host", "block 'mla' is not part of the replay model")]:
        with pytest.raises(WorkbenchError, match=message):
            parse_cache(bad, PRO.blocks)
