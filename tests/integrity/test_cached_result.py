"""The cached-result check on its own: identical outputs for two seeds are a replayed result only where the
reference, rounded to the candidate's precision, differs between them."""

from __future__ import annotations

import torch

from workbench.verify.integrity import _cached


def _trial(trial_id: int, seed: int, output: list[float], lowp: list[float], truth: list[float]):
    exp = {"id": trial_id, "kind": "random", "shape": "rows=1,N=1", "dtype": "float16", "seed": seed,
           "lowp": ([torch.tensor(lowp, dtype=torch.float16)], {}),
           "truth": ([torch.tensor(truth, dtype=torch.float64)], {})}
    return exp, {"outputs": [torch.tensor(output, dtype=torch.float16)]}


def _check(*trials) -> str:
    expected = [exp for exp, _ in trials]
    return _cached(expected, {exp["id"]: got for exp, got in trials})


def test_a_replayed_output_is_caught():
    first = _trial(0, 10, [1.5], [1.5], [1.5002])
    second = _trial(1, 11, [1.5], [2.25], [2.2501])  # the right answer is 2.25: 1.5 was replayed
    assert _check(first, second) == "[rows=1,N=1] float16: seed 11 returned seed 10's output"


def test_outputs_that_round_alike_are_no_evidence():
    """Two saturated seeds: the truths differ in float64, the float16 results are the same 100.0."""
    first = _trial(0, 10, [100.0], [100.0], [99.99991])
    second = _trial(1, 11, [100.0], [100.0], [99.99997])
    assert _check(first, second) == ""
