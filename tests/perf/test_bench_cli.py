"""``workbench bench`` with no GPU: it says so, prints the modelled table of the promoted operator on the targets
asked for, and keeps every figure in the store labelled modelled; a name it does not know is one line."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from sqlmodel import Session, select
from typer.testing import CliRunner

from workbench.cli import app
from workbench.store.db import get_engine
from workbench.store.models import Benchmark

runner = CliRunner()


@pytest.mark.interpreter
def test_bench_without_a_gpu_prints_and_records_modelled_figures(settings):
    shutil.copytree(Path("operators/rmsnorm"), settings.operators_dir / "rmsnorm")
    result = runner.invoke(app, ["bench", "rmsnorm", "--target", "sm_90a", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["gpu"] is False
    rows = [r for r in report["rows"] if r["subject"] == "operator"]
    assert {(r["label"], r["target"]) for r in rows} == {("modelled", "sm_90a")}
    assert {r["passes"] for r in rows} == {"fwd", "fwd+bwd"} and len(rows) == 2 * 4  # four model-suite widths
    peers = {r["subject"] for r in report["rows"]} - {"operator"}  # Liger's RMSNorm beside ours where installed
    assert peers == ({"liger"} if importlib.util.find_spec("liger_kernel") else set())
    assert all(r["floor_ms"] > 0 and (r["time_ms"] is None or r["time_ms"] >= r["floor_ms"]) for r in rows)
    with Session(get_engine(settings.db_url)) as session:
        stored = session.exec(select(Benchmark)).all()
    assert stored and {b.label for b in stored} == {"modelled"} and {b.backend for b in stored} == {"sm_90a"}
    assert {b.metric for b in stored} >= {"time:fwd", "floor:fwd+bwd", "roofline_fraction:fwd+bwd"}
    text = runner.invoke(app, ["bench", "rmsnorm", "--target", "sm_90a", "--no-peers"], catch_exceptions=False).stdout
    assert text.startswith("no GPU: torch sees no CUDA device") and "modelled" in text and "liger" not in text


def test_bench_of_an_unknown_block_is_one_line(settings):
    result = runner.invoke(app, ["bench", "nope"])
    assert result.exit_code == 2
    assert "unknown block 'nope'" in result.output and len(result.output.strip().splitlines()) == 1
