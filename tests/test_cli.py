"""The CLI: every command, --json, exit codes, and one-line answers to user mistakes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.blocks import REGISTRY
from workbench.cli import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_blocks_lists_the_catalog(settings):
    result = invoke("blocks", "--json")
    assert result.exit_code == 0
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert set(rows) >= {"rmsnorm", "swiglu"}
    assert rows["rmsnorm"]["templates"] == ["row_block", "col_tiled"]
    assert rows["rmsnorm"]["status"] == "not started" and rows["rmsnorm"]["suites"]["edge"] >= 5
    assert "rmsnorm" in invoke("blocks").stdout


def test_models_and_plan(settings):
    cards = json.loads(invoke("models", "--json").stdout)
    assert [c["name"] for c in cards] == ["kimi-k3", "kimi-k3.1-pro"]
    plan = json.loads(invoke("plan", "kimi-k3.1-pro", "--json").stdout)
    status = {b["block"]: b["status"] for b in plan["blocks"]}
    assert len(status) == 31 and status["rmsnorm"] == status["mla"] == "not started"
    assert status["moe_grouped_gemm_mxfp4"] == "not started" and "quantized_weights" not in status  # MXFP4 covered
    assert "latent_moe" not in status  # latent MoE: facts, no block
    assert all((s == "no spec") == (name not in REGISTRY) for name, s in status.items())
    assert plan["facts"]["routed_experts"]["value"] == 896
    assert "assumed" in invoke("plan", "kimi-k3.1-pro").stdout.lower()


@pytest.mark.parametrize("args, message", [
    (("port", "nosuch"), "unknown block 'nosuch'"),
    (("plan", "nosuch"), "unknown model 'nosuch'"),
    (("port",), "name a block to port"),
    (("port", "rmsnorm", "--start", "row_block:BOGUS=1"), "unknown parameter 'BOGUS'"),
    (("port", "rmsnorm", "--start", "nosuch:BLOCK_N=64"), "no template 'nosuch'"),
    (("port", "rmsnorm", "--backend", "tpu"), "unknown backend 'tpu'"),
    (("port", "rmsnorm", "--suites", "smokee"), "unknown shape suite 'smokee'"),
    (("port", "rmsnorm", "--backend", "interpreter", "--dtypes", "bfloat16"), "does not run on the interpreter"),
    (("port", "rmsnorm", "--backend", "interpreter", "--suites", "model"), "does not run on the interpreter"),
    (("port", "rmsnorm", "--budget", "0"), "must be at least 1"),
    (("verify", "missing.py"), "no such file"),
    (("show", "nosuch"), "no run 'nosuch'"),
    (("port", "rmsnorm", "--proposer", "magic"), "unknown proposer 'magic'"),
    (("port", "--resume", "nosuch"), "no run 'nosuch'"),
    (("port", "rmsnorm", "swiglu", "--resume", "nosuch"), "--resume continues one run"),
    (("approve", "nosuch"), "no run 'nosuch'"),
    (("reject", "nosuch", "--why", "too slow"), "no run 'nosuch'"),
])
def test_user_mistakes_are_one_line_and_exit_2(settings, args, message):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.output


def test_llm_proposer_without_an_endpoint_is_one_line(settings, monkeypatch):
    monkeypatch.delenv("WORKBENCH_LLM_BASE_URL", raising=False)
    for proposer in ("llm", "hybrid"):
        result = runner.invoke(app, ["port", "rmsnorm", "--proposer", proposer])
        assert result.exit_code == 2 and "needs an endpoint: --llm-base-url or $WORKBENCH_LLM_BASE_URL" in result.stderr
        assert result.stderr.strip().count("\n") == 0


def test_verify_a_file_that_is_not_a_candidate(settings, tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("x = 1\n")
    result = runner.invoke(app, ["verify", str(plain)])
    assert result.exit_code == 2 and "not a candidate" in result.stderr


@pytest.mark.interpreter
def test_port_then_runs_show_and_verify_the_operator(settings):
    result = invoke("port", "swiglu", "--seeds", "1", "--suites", "smoke", "--json")
    assert result.exit_code == 0, result.output
    (outcome,) = json.loads(result.stdout)
    assert outcome["status"] == "promoted" and Path(outcome["operator_path"]).is_file()

    runs = json.loads(invoke("runs", "--json").stdout)
    assert runs[0]["id"] == outcome["run_id"] and runs[0]["status"] == "promoted"
    shown = json.loads(invoke("show", outcome["run_id"][:17], "--json").stdout)
    assert [s["node"] for s in shown["steps"]] == ["plan", "render", "contract", "verify", "tune", "replay",
                                                   "promote", "record"]
    assert shown["steps"][4]["message"] == "tuning off: no GPU targets required"  # WORKBENCH_TARGETS="" in the tests
    assert shown["steps"][5]["message"] == "replay gate off"  # WORKBENCH_REPLAY_STEPS=0 in the tests
    assert shown["candidates"][0]["status"] == "pass"
    assert "Agent trace" in invoke("show", outcome["run_id"]).stdout

    blocks = {r["name"]: r for r in json.loads(invoke("blocks", "--json").stdout)}
    assert blocks["swiglu"]["status"] == "promoted"

    verified = invoke("verify", outcome["operator_path"], "--suites", "smoke", "--seeds", "1", "--json")
    assert verified.exit_code == 0 and json.loads(verified.stdout)["verdict"] == "pass"


@pytest.mark.interpreter
@pytest.mark.e2e
def test_console_script_verify_exit_codes(settings, tmp_path):
    """The installed `workbench` script, as a user runs it: 0 pass, 1 fail, 2 usage error."""
    exe = shutil.which("workbench", path=str(Path(sys.executable).parent))
    good = tmp_path / "good.py"
    good.write_text("import torch\nBLOCK = 'swiglu'\n\ndef run(a, b):\n    return a * 0 + b * 0\n")
    failed = subprocess.run([exe, "verify", str(good), "--suites", "smoke", "--seeds", "1", "--dtypes", "float32"],
                            capture_output=True, text=True, timeout=300)
    assert failed.returncode == 1 and "fail" in failed.stdout
    usage = subprocess.run([exe, "verify", str(tmp_path / "nope.py")], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "no such file" in usage.stderr
