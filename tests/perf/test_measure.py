"""Measured times in the search, on the CPU stand-ins (the Triton interpreter and the wall clock): a verified
candidate timed in a sandboxed child with every timed output checked, a wrong one refused a time, and a port
that ranks its passing candidates by the measured times instead of the modelled ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.agent.rank import rank_passing
from workbench.agent.run import port_block
from workbench.backends import INTERPRETER
from workbench.perf.measure import measure_candidate
from workbench.store import get_engine
from workbench.store.queries import run_steps

OPERATORS = Path(__file__).resolve().parents[2] / "operators"
SHAPES = [{"rows": 4, "N": 64}, {"rows": 3, "N": 100}]


@pytest.mark.interpreter
def test_a_verified_candidate_gets_a_measured_time_and_a_wrong_one_none(tmp_path):
    good = next((OPERATORS / "rmsnorm").glob("*.py"))
    wrong = tmp_path / good.name
    wrong.write_text(good.read_text() + "\n\n_run = run\n\n\ndef run(x, weight, eps):\n"
                                        "    return _run(x, weight, eps) * 1.01\n")
    figure = measure_candidate(good, "rmsnorm", SHAPES, INTERPRETER, dtype="float32", timeout_s=300, trials=2)
    assert figure["label"] == "measured" and figure["device"] == "interpreter" and figure["shapes"] == 2
    assert figure["time_ms"] > 0 and figure["spread_ms"] >= 0
    refused = measure_candidate(wrong, "rmsnorm", SHAPES, INTERPRETER, dtype="float32", timeout_s=300, trials=2)
    assert "time_ms" not in refused and refused["error"].startswith("rows=4") and "y off by" in refused["error"]


def test_measured_times_rank_instead_of_the_modelled_ones():
    def attempt(i, measured_ms, modelled_ms):
        return {"iteration": i, "template": "t", "worst_ratio": 0.1, "target_report": {"spill_free_on": ["sm_90a"]},
                "modelled": {"sm_90a": {"time_ms": modelled_ms}},
                "measured": {"label": "measured", "device": "NVIDIA H200", "time_ms": measured_ms}
                if measured_ms else {"label": "measured", "device": "NVIDIA H200", "error": "timeout: no result"}}

    # the model prefers #1; the GPU says #2 is faster; #3 could not be timed and goes last whatever its model says
    ranked, why = rank_passing([attempt(1, 2.0, 1.0), attempt(2, 1.5, 3.0), attempt(3, None, 0.1)], ["sm_90a"])
    assert [a["iteration"] for a in ranked] == [2, 1, 3]
    assert "then measured time" in why and "#2 t 1.500 ms measured on NVIDIA H200" in why
    assert "#3 t not measured (timeout: no result)" in why


@pytest.mark.interpreter
def test_a_port_that_measures_ranks_its_passing_candidates_by_their_times(settings):
    outcome = port_block("rmsnorm", settings, explore=2, seeds=1, dtypes=["float32"], suites=["smoke"],
                         targets=[], measure=True)
    assert outcome.status == "promoted", outcome.reason
    steps = run_steps(get_engine(settings.db_url), outcome.run_id)
    measured = [s for s in steps if s.node == "measure"]
    assert len(measured) == 2 and all(" ms measured on interpreter " in s.message for s in measured)
    rank = next(s.message for s in steps if s.node == "rank")
    assert rank.startswith("ranked 2 passing") and "then measured time" in rank
    manifest = json.loads(Path(outcome.operator_path).with_suffix(".json").read_text())
    assert manifest["measured"]["label"] == "measured" and manifest["measured"]["time_ms"] > 0
    fastest = min(s.data["time_ms"] for s in measured)
    assert manifest["measured"]["time_ms"] == fastest
