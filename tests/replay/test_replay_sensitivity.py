"""The replay catches operators that a loose single-operator check lets through: a gradient scaled by 0.98, a
biased rounding. Each such operator passes a 3% comparison against the float64 reference on the block's own inputs,
and fails the replay, with the step where its curve left the band; an exact operator that only rounds differently
passes. Replays run the way the CLI runs them (child processes, the store, the reference recorded once)."""

from __future__ import annotations

import pytest
import torch

from workbench.blocks import get_block
from workbench.config import Settings
from workbench.replay.faults import FLOAT64, GRAD_SCALED, ROUNDED_UP, write_op
from workbench.replay.runner import run_replay

LOOSE_RTOL = 3e-2
MODEL = "kimi-k3.1-pro"


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Settings:
    """One store for the module with the reference run recorded in it first, so that every replay, in any order,
    reads it from the store."""
    root = tmp_path_factory.mktemp("sensitivity")
    settings = Settings(db_url=f"sqlite:///{root / 'workbench.db'}",
                                        operators_dir=root / "operators", work_dir=root / "home",
                                        replays_dir=root / "replays")
    assert run_replay(MODEL, "scratch", settings, ops=["reference"]).reference_source == "run"
    return settings


def _loose_check(block: str, path) -> float:
    """Largest error (relative to each quantity's max) of the operator's outputs and gradients against the float64
    reference, on the block's first smoke shape."""
    import importlib.util

    spec = get_block(block)
    module_spec = importlib.util.spec_from_file_location(f"loose_{block}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    inputs = spec.make_inputs(spec.shapes["smoke"][0], torch.float32, 0, "cpu")
    worst = 0.0
    results = []
    for fn, dtype in ((module.run, torch.float32), (spec.reference, torch.float64)):
        args = {k: (v.detach().to(dtype).requires_grad_(k in spec.grad_inputs) if torch.is_tensor(v) and
                    v.is_floating_point() else v) for k, v in inputs.items()}
        out = fn(*args.values())
        outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.is_floating_point() and o.requires_grad]
        torch.manual_seed(1)
        sum((o.double() * torch.randn(o.shape, dtype=torch.float64)).sum() for o in outs).backward()
        results.append([o.detach().double() for o in outs] +
                       [args[k].grad.double() for k in spec.grad_inputs if args.get(k) is not None
                        and torch.is_tensor(args[k]) and args[k].grad is not None])
    for mine, truth in zip(*results, strict=True):
        worst = max(worst, float((mine - truth).abs().max() / truth.abs().max().clamp_min(1e-30)))
    return worst


FAULTY = [
    ("attnres", "grad_sources_x0.98", GRAD_SCALED, {"index": 0, "factor": 0.98}),
    ("moe_combine", "grad_y_x0.98", GRAD_SCALED, {"index": 0, "factor": 0.98}),
    ("kda", "round_up_8_bits", ROUNDED_UP, {"bits": 8}),
]


@pytest.mark.slow  # a training child process per fault, 7-27 s each: the whole suite's
@pytest.mark.parametrize(("block", "name", "template", "fields"), FAULTY, ids=[f"{b}-{n}" for b, n, *_ in FAULTY])
def test_a_small_systematic_error_passes_a_loose_check_and_fails_the_replay(shared, tmp_path, block, name, template,
                                                                          fields):
    path = write_op(tmp_path, f"{block}_{name}", template, block=block, **fields)
    assert 0 < _loose_check(block, path) <= LOOSE_RTOL
    outcome = run_replay(MODEL, "scratch", shared, ops=["reference", f"{block}={path}"])
    assert outcome.status == "fail"
    assert outcome.left_band_step is not None and 0 < outcome.left_band_step < len(outcome.reference_curve)
    assert f"left the band at step {outcome.left_band_step}" in outcome.reason
    assert not outcome.checks["parameters"]["passed"]


def test_an_exact_operator_that_rounds_differently_stays_in_the_band(shared, tmp_path):
    path = write_op(tmp_path, "attnres_float64", FLOAT64, block="attnres")
    assert _loose_check("attnres", path) < 1e-5
    outcome = run_replay(MODEL, "scratch", shared, ops=["reference", f"attnres={path}"])
    assert outcome.status == "pass", outcome.reason
    assert outcome.left_band_step is None and outcome.checks["parameters"]["worst_error"] < 1e-4
    assert outcome.reference_source == "store"  # recorded once, by the module's fixture
