"""The agent end to end on the Triton interpreter: recovery through named repairs, exhaustion, broken templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.agent.run import port_block
from workbench.store import get_engine
from workbench.store.queries import find_run, run_candidates, run_steps
from workbench.verify.harness import verify_candidate

pytestmark = pytest.mark.interpreter


def test_bad_start_recovers_through_named_repairs_and_promotes(settings):
    """Start with float16 accumulation and a 64-wide row tile: the host code refuses wider rows with a clear
    error, which the agent reads as coverage and repairs the tile, then the accumulator (whose overflow left an
    output constant), and promotes a candidate that passes full verification."""
    outcome = port_block("rmsnorm", settings, start="row_block:BLOCK_N=64,ACC_DTYPE=float16", seeds=1, budget=6)
    assert outcome.status == "promoted", outcome.reason
    engine = get_engine(settings.db_url)
    candidates = run_candidates(engine, outcome.run_id)
    assert len(candidates) == 3 and candidates[-1].status == "pass"
    assert [c.status for c in candidates[:2]] == ["runtime_error", "constant_output"]
    assert "this operator takes rows of at most 64" in candidates[0].message
    assert (candidates[0].params["BLOCK_N"], candidates[0].params["ACC_DTYPE"]) == (64, "float16")
    assert (candidates[2].params["BLOCK_N"], candidates[2].params["ACC_DTYPE"]) == (8192, "float32")
    messages = [s.message for s in run_steps(engine, outcome.run_id)]
    assert any("precision repair" in m and "ACC_DTYPE float16 -> float32" in m for m in messages)
    assert any("coverage repair" in m and "BLOCK_N 64 -> 8192" in m for m in messages)
    diagnoses = sorted(s.message.split(":")[0] for s in run_steps(engine, outcome.run_id) if s.node == "diagnose")
    assert diagnoses == ["coverage", "precision"]

    operator = Path(outcome.operator_path)
    manifest = json.loads(operator.with_suffix(".json").read_text())
    assert operator.parent == settings.operators_dir / "rmsnorm"
    assert manifest["template"] == "row_block" and manifest["params"]["BLOCK_N"] == 8192
    assert manifest["run_id"] == outcome.run_id and manifest["verification"]["verdict"] == "pass"
    assert "params: BLOCK_N=8192" in operator.read_text()
    assert verify_candidate(operator, seeds=1, base_seed=1234).passed


def test_budget_runs_out_and_the_run_ends_blocked(settings):
    outcome = port_block("rmsnorm", settings, start="row_block:BLOCK_N=64,ACC_DTYPE=float16", seeds=1, budget=1,
                         dtypes=["float16"], suites=["smoke"])
    assert outcome.status == "blocked"
    assert "budget of 1 candidates spent" in outcome.reason
    assert "last diagnosis" in outcome.reason
    engine = get_engine(settings.db_url)
    run = find_run(engine, outcome.run_id)
    assert run.status == "blocked" and run.finished_at is not None and run.best_candidate_id is not None
    assert not (settings.operators_dir / "rmsnorm").exists()


def test_template_rendering_invalid_python_is_diagnosed_and_the_next_template_promoted(settings, copied_templates):
    broken = copied_templates("rmsnorm") / "row_block.py.j2"
    source = broken.read_text()
    kernel = "def rmsnorm_fwd_kernel(X, W, Y, RSTD, stride_x, stride_y, N, eps, BLOCK_N: tl.constexpr):"
    assert source.count(kernel) == 1  # row_block's own kernel: col_tiled, which shares its host code, stays valid
    broken.write_text(source.replace(kernel, kernel.removesuffix(":")))
    outcome = port_block("rmsnorm", settings, seeds=1, dtypes=["float32"], suites=["smoke"], budget=3)
    assert outcome.status == "promoted"
    engine = get_engine(settings.db_url)
    first, second = run_candidates(engine, outcome.run_id)[:2]
    assert first.template == "row_block" and first.status == "compile_error"
    assert "SyntaxError" in first.message and first.message.count("\n") == 0
    assert second.template == "col_tiled" and second.status == "pass"
    revise = [s.message for s in run_steps(engine, outcome.run_id) if s.node == "revise"]
    assert "no repair rule for compile_error" in revise[0] and "other templates first" in revise[0]


def test_a_template_only_the_interpreter_accepts_is_refused_on_the_target_and_the_next_template_promoted(
        settings, copied_templates):
    """row_block's forward kernel reads a module-level float that is not a tl.constexpr: it passes on the
    interpreter and sm_90a's compiler rejects it, so the run refuses it as target_compile_error, goes to the other
    template, and the promoted operator's manifest says where it compiles."""
    broken = copied_templates("rmsnorm") / "row_block.py.j2"
    source = broken.read_text()
    assert source.count("/ N + eps)") == 1
    broken.write_text(source.replace("/ N + eps)", "/ N + eps * ONE)").replace(
        "import triton.language as tl\n", "import triton.language as tl\n\nONE = 1.0\n", 1))
    outcome = port_block("rmsnorm", settings, seeds=1, dtypes=["float32"], suites=["smoke"], budget=3,
                         targets=["sm_90a"])
    assert outcome.status == "promoted", outcome.reason
    engine = get_engine(settings.db_url)
    first, second = run_candidates(engine, outcome.run_id)[:2]
    assert first.template == "row_block" and first.status == "target_compile_error"
    assert first.message.startswith("sm_90a: rmsnorm_fwd_kernel: ") and "ONE" in first.message
    assert second.template == "col_tiled" and second.status == "pass"
    revise = [s.message for s in run_steps(engine, outcome.run_id) if s.node == "revise"]
    assert "target_compile_error" in revise[0] and "other templates first" in revise[0]
    manifest = json.loads(Path(outcome.operator_path).with_suffix(".json").read_text())
    assert manifest["target_report"]["targets"] == ["sm_90a"] and manifest["target_report"]["compiles_on"] == ["sm_90a"]
    assert manifest["replay"] == {}  # the suite runs without the replay gate (WORKBENCH_REPLAY_STEPS=0)
