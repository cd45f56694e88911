"""The timing protocol on its CPU clock: warm-up calls untimed, fresh input clones and a cache flush before every
timed call, each timed call's result checked, median and spread reported."""

from __future__ import annotations

import pytest
import torch

from workbench.perf.timing import Timing, WallClock, time_calls


def test_each_timed_call_gets_fresh_inputs_a_flush_and_a_check():
    x = torch.ones(4)
    seen, checked = [], []

    def scale_in_place(t):
        seen.append(t.clone())
        t.mul_(2)  # an operator that writes its input: the next call must still see ones
        return t

    clock = WallClock()
    timing = time_calls(scale_in_place, {"x": x}, ("x",), clock, check=lambda out, fresh: checked.append(out.sum()),
                        warmup=2, trials=5)
    assert len(seen) == 7 and all(torch.equal(s, torch.ones(4)) for s in seen)
    assert torch.equal(x, torch.ones(4))
    assert clock.flushes == 5 and len(checked) == 5 and len(timing.trials_ms) == 5
    assert all(t >= 0 for t in timing.trials_ms)


def test_a_wrong_result_is_an_error_not_a_figure():
    def check(out, fresh):
        raise AssertionError("y off by 1")

    with pytest.raises(AssertionError, match="y off by 1"):
        time_calls(lambda t: t + 1, {"x": torch.zeros(2)}, ("x",), WallClock(), check=check, trials=3)


def test_the_backward_runs_on_fresh_leaves_inside_the_timed_call():
    grads = []
    time_calls(lambda t: (t * 3).sum(), {"x": torch.ones(3)}, ("x",), WallClock(),
               check=lambda out, fresh: grads.append(fresh["x"].grad.clone()), grad_names=("x",), backward=True,
               warmup=1, trials=2)
    assert [g.tolist() for g in grads] == [[3.0, 3.0, 3.0]] * 2  # not accumulated across calls


def test_median_and_interquartile_spread():
    timing = Timing(trials_ms=[1.0, 2.0, 3.0, 4.0, 100.0])
    assert timing.median_ms == 3.0
    assert 0 < timing.spread_ms < 100.0  # one outlier does not make the spread
    assert Timing(trials_ms=[1.0, 3.0]).spread_ms == 2.0
