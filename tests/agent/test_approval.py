"""Human approval: `workbench port --approve` stops before promotion; `workbench approve` promotes, `workbench reject
--why` ends the run without an operator."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from workbench.agent.run import port_block
from workbench.cli import app
from workbench.dashboard.frames import runs_frame
from workbench.status import block_status
from workbench.store import get_engine
from workbench.store.queries import find_run, run_steps

pytestmark = pytest.mark.interpreter

runner = CliRunner()
FAST = ["--seeds", "1", "--suites", "smoke", "--dtypes", "float32", "--budget", "2"]


def test_approve_promotes_the_run_that_waited(settings):
    result = runner.invoke(app, ["port", "rmsnorm", "--approve", *FAST, "--json"])
    assert result.exit_code == 0, result.output
    (waiting,) = json.loads(result.stdout)
    run_id = waiting["run_id"]
    assert waiting["status"] == "waiting_approval" and waiting["operator_path"] is None
    assert f"`workbench approve {run_id}`" in waiting["reason"] and "worst error" in waiting["reason"]
    assert not (settings.operators_dir / "rmsnorm").exists()

    engine = get_engine(settings.db_url)
    run = find_run(engine, run_id)
    assert run.status == "waiting_approval" and run.finished_at is None and run.config["approve"] is True
    assert list(runs_frame(engine, status="waiting_approval")["id"]) == [run_id]
    assert block_status(engine, settings.operators_dir, "rmsnorm")[0] == "numerics pass"
    assert [s.node for s in run_steps(engine, run_id)][-1] == "approve"

    resumed = runner.invoke(app, ["port", "--resume", run_id])
    assert resumed.exit_code == 2 and f"`workbench approve {run_id}`" in resumed.stderr

    approved = runner.invoke(app, ["approve", run_id])
    assert approved.exit_code == 0, approved.output
    assert "approved: promote" in approved.stdout and f"promoted rmsnorm after 1 candidates (run {run_id})" \
        in approved.stdout
    run = find_run(engine, run_id)
    assert run.status == "promoted" and run.operator_path and run.finished_at is not None
    manifest = json.loads((settings.operators_dir / "rmsnorm").glob("*.json").__next__().read_text())
    assert manifest["run_id"] == run_id and manifest["approval"] == {"approved": True, "why": ""}
    assert [s.node for s in run_steps(engine, run_id)][-4:] == ["approve", "approve", "promote", "record"]

    again = runner.invoke(app, ["approve", run_id])
    assert again.exit_code == 2 and "is not waiting for approval (it is promoted)" in again.stderr


def test_reject_ends_the_run_with_the_reason_and_no_operator(settings):
    waiting = port_block("rmsnorm", settings, approve=True, seeds=1, suites=["smoke"], dtypes=["float32"], budget=2)
    assert waiting.status == "waiting_approval"

    missing = runner.invoke(app, ["reject", waiting.run_id])
    assert missing.exit_code == 2 and "--why" in missing.output

    rejected = runner.invoke(app, ["reject", waiting.run_id, "--why", "wide rows spill registers; prefer col_tiled"])
    assert rejected.exit_code == 0, rejected.output
    engine = get_engine(settings.db_url)
    run = find_run(engine, waiting.run_id)
    why = "wide rows spill registers; prefer col_tiled"
    assert run.status == "rejected" and run.reason == f"not promoted at review: {why}"
    assert run.operator_path is None and run.best_candidate_id is not None and run.finished_at is not None
    assert not (settings.operators_dir / "rmsnorm").exists()
    assert block_status(engine, settings.operators_dir, "rmsnorm")[0] == "blocked"
    steps = [(s.node, s.message) for s in run_steps(engine, waiting.run_id)]
    assert ("approve", f"rejected: {why}") in steps
    assert steps[-2:] == [("promote", f"not promoted at review: {why}"),
                          ("record", f"rejected: not promoted at review: {why}")]

    resumed = runner.invoke(app, ["port", "--resume", waiting.run_id])
    assert resumed.exit_code == 2 and "has ended (rejected)" in resumed.stderr
