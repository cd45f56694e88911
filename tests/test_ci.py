"""`workbench ci`: every promoted operator re-verified, regressions against the baseline fail the job with a reason
naming exactly the broken operator; JUnit XML lists every operator x check."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from sqlmodel import Session, select
from typer.testing import CliRunner

from workbench.cli import app
from workbench.config import Settings
from workbench.operators import promote_file
from workbench.store import CIJob, get_engine
from workbench.templating import load_template
from workbench.verify.harness import source_hash

pytestmark = pytest.mark.interpreter
runner = CliRunner()


def _promote(settings, tmp_path, block: str, template: str, edit: tuple[str, str] | None = None) -> None:
    t = load_template(block, template)
    source = t.render(next(p for p in t.points() if not t.unmet(p, {"rows": 1, "N": 8192})))
    if edit:
        assert edit[0] in source
        source = source.replace(edit[0], edit[1])
    path = tmp_path / f"{block}_{template}.py"
    path.write_text(source)
    promote_file(path, settings.operators_dir, block, {"block": block, "template": template,
                                                       "source_hash": source_hash(source), "promoted_at": "1"})


@pytest.fixture(scope="module")
def baseline_operators(tmp_path_factory) -> Path:
    """rmsnorm and swiglu promoted and their baseline written by `workbench ci --update-baseline`, once for the
    module (in a store and folders of its own): the operators folder."""
    root = tmp_path_factory.mktemp("ci-baseline")
    with pytest.MonkeyPatch.context() as env:
        for name, value in (("DB", f"sqlite:///{root / 'workbench.db'}"), ("OPERATORS", str(root / "operators")),
                            ("HOME", str(root / "home")), ("REPLAYS", str(root / "replays")), ("REPLAY_STEPS", "0")):
            env.setenv(f"WORKBENCH_{name}", value)
        settings = Settings.load()
        _promote(settings, root, "rmsnorm", "row_block")
        _promote(settings, root, "swiglu", "flat")
        result = runner.invoke(app, ["ci", "--update-baseline", "--json", "--no-replays", "--no-parity"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "passed"
    return root / "operators"


@pytest.fixture
def baseline(settings, baseline_operators):
    """The module's baseline operators copied into this test's operators folder: the baseline's entries."""
    shutil.copytree(baseline_operators, settings.operators_dir)
    return json.loads((settings.operators_dir / "ci_baseline.json").read_text())


def test_ci_passes_on_intact_operators_and_the_junit_lists_every_check(settings, tmp_path, baseline):
    junit = tmp_path / "junit.xml"
    result = runner.invoke(app, ["ci", "--junit", str(junit), "--no-replays", "--no-parity"])
    assert result.exit_code == 0, result.output
    suite = ET.parse(junit).getroot()
    names = {(c.get("classname"), c.get("name")) for c in suite.iter("testcase")}
    for block, entry in baseline.items():
        assert {(f"operators.{block}", key) for key in entry["checks"]} <= names
    assert ("operators.rmsnorm", "grad:weight float16") in names and ("operators.swiglu", "integrity") in names
    assert suite.get("failures") == "0"
    with Session(get_engine(settings.db_url)) as s:
        assert s.exec(select(CIJob).order_by(CIJob.id.desc())).first().junit_path == str(junit)


def test_a_wrong_gradient_fails_exactly_that_operator(settings, tmp_path, baseline):
    _promote(settings, tmp_path, "rmsnorm", "row_block",
             edit=("dw_part.sum(0).to(weight.dtype)", "(0.5 * dw_part.sum(0)).to(weight.dtype)"))
    junit = tmp_path / "junit.xml"
    result = runner.invoke(app, ["ci", "--junit", str(junit), "--no-replays", "--no-parity"])
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("regression:")]
    assert lines and all(line.startswith("regression: rmsnorm") for line in lines)
    assert any("grad:weight" in line and "now fails" in line for line in lines)
    failed = {c.get("classname") for c in ET.parse(junit).getroot().iter("testcase") if c.find("failure") is not None}
    assert failed == {"operators.rmsnorm"}


def test_a_broken_tail_mask_fails_exactly_that_operator(settings, tmp_path, baseline):
    _promote(settings, tmp_path, "swiglu", "flat", edit=("mask = offs < numel", "mask = offs < numel - 1"))
    result = runner.invoke(app, ["ci", "--changed-only", "--json", "--no-replays", "--no-parity"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert [op["block"] for op in report["operators"]] == ["swiglu"]  # rmsnorm unchanged: not re-verified
    assert report["regressions"] and all(r.startswith("swiglu") for r in report["regressions"])
    assert any("unwritten" in r or "now fails" in r for r in report["regressions"])


def test_a_changed_only_baseline_update_keeps_the_operators_it_left_alone(settings, tmp_path, baseline):
    _promote(settings, tmp_path, "swiglu", "flat", edit=("BLOCK = ", "ALSO = 1\nBLOCK = "))
    result = runner.invoke(app, ["ci", "--changed-only", "--update-baseline", "--json", "--no-replays", "--no-parity"])
    assert result.exit_code == 0, result.output
    assert [op["block"] for op in json.loads(result.stdout)["operators"]] == ["swiglu"]
    written = json.loads((settings.operators_dir / "ci_baseline.json").read_text())
    assert set(written) == {"rmsnorm", "swiglu"} and written["rmsnorm"] == baseline["rmsnorm"]
    assert written["swiglu"]["source_hash"] != baseline["swiglu"]["source_hash"]


def test_a_result_accepted_in_the_baseline_file_stands_against_an_older_passing_job(settings, baseline):
    """kda's smoke-shape spill on sm_100a was accepted in the baseline file; the store's last passing job predated it
    and reported it again, and a --changed-only --update-baseline wrote the stale entry back. The file's entry for the
    operator promoted now stands; the store's serves the operators the file has no current entry for."""
    from workbench.ci import load_baseline

    stale = json.loads(json.dumps(baseline))
    stale["rmsnorm"]["checks"]["spill_free:sm_90a"] = True
    stale["swiglu"]["source_hash"] = "an older swiglu"
    accepted = json.loads(json.dumps(baseline))
    accepted["rmsnorm"]["checks"]["spill_free:sm_90a"] = False  # the regression accepted in the repository
    accepted["swiglu"]["source_hash"] = "an operator no longer promoted"
    (settings.operators_dir / "ci_baseline.json").write_text(json.dumps(accepted))
    with Session(get_engine(settings.db_url)) as s:
        s.add(CIJob(commit="old", status="passed", summary={"operators": stale}))
        s.commit()
    loaded = load_baseline(settings)
    assert loaded["rmsnorm"]["checks"]["spill_free:sm_90a"] is False  # the file's, for the operator promoted now
    assert loaded["swiglu"]["source_hash"] == "an older swiglu"  # the store's: the file's entry is not current


def test_ci_replays_the_loss_curves_with_every_promoted_operator(settings, tmp_path, baseline):
    """As CI runs on a fresh clone: the reference curves and LoRA base checkpoints come from the repository's
    replays/ (their keys match the code: tests/replay/test_replay_runner.py), only the operators train."""
    shutil.copytree(Path(__file__).parents[1] / "replays", settings.replays_dir)
    junit = tmp_path / "junit.xml"
    result = runner.invoke(app, ["ci", "--changed-only", "--junit", str(junit), "--json", "--no-parity"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [(r["model"], r["mode"], r["status"]) for r in report["replays"]] == [
        (model, mode, "pass") for model in ("kimi-k3", "kimi-k3.1-pro") for mode in ("scratch", "lora")]
    replays = [c for c in ET.parse(junit).getroot().iter("testcase") if c.get("classname") == "replays"]
    assert [c.get("name") for c in replays] == [f"{model} {name}" for model in ("kimi-k3", "kimi-k3.1-pro")
                                                for name in ("scratch tiny 4 steps", "lora tiny 3 steps")]
    assert all(c.find("failure") is None for c in replays)


def test_ci_runs_parity_for_every_card_that_names_a_transformers_class(settings, tmp_path, baseline):
    """kimi-k3 (onboarded from the published config, run through workbench.kimi_k3's model) gets a parity run,
    recorded under the job; kimi-k3.1-pro (derived: its DSA is from the release notes) none. Only rmsnorm and swiglu
    are promoted here: the parity swaps rmsnorm in (K3's MLPs are SiTU) and names every other module left alone."""
    junit = tmp_path / "junit.xml"
    result = runner.invoke(app, ["ci", "--changed-only", "--no-replays", "--junit", str(junit), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [(p["source"].split()[0], p["status"]) for p in report["parity"]] == [("kimi-k3", "pass")]
    cases = [c for c in ET.parse(junit).getroot().iter("testcase") if c.get("classname") == "parity"]
    assert [c.find("failure") for c in cases] == [None]
    from workbench.store.queries import parity_runs

    (row,) = parity_runs(get_engine(settings.db_url))
    assert row.ci_job_id == report["job"] and row.patch["blocks"] == ["rmsnorm"]
    assert any("no promoted operator for mla" in m["reason"] for m in row.patch["modules"])


def _result(compiles: list[str], spill_free: list[str]):
    from workbench.verify.result import VerificationResult

    targets = ["sm_90a", "gfx942"]
    builds = [{"kernel": "k", "target": t, "suite": "model", "ok": t in compiles,
               "spilled_bytes": 0 if t in spill_free else 256} for t in targets]
    findings = [f"spills: {t} k 256 B/thread at the model suite" for t in compiles if t not in spill_free]
    return VerificationResult(block="rmsnorm", candidate="/x/op.py", source_hash="h", backend="interpreter",
                              verdict="pass", message="ok", targets=targets, builds=builds, findings=findings)


def test_ci_regresses_on_a_target_that_compiled_before_and_on_new_spills():
    from workbench.ci import regressions, summarize

    before = summarize("rmsnorm", _result(["sm_90a", "gfx942"], ["gfx942"])).baseline_entry()
    assert before["checks"]["compiles:sm_90a"] and not before["checks"]["spill_free:sm_90a"]
    same = summarize("rmsnorm", _result(["sm_90a", "gfx942"], ["gfx942"]))
    assert regressions(same, before) == []
    lost_target = summarize("rmsnorm", _result(["gfx942"], ["gfx942"]))
    assert any("compiles:sm_90a: passed before, now fails" in r for r in regressions(lost_target, before))
    new_spills = summarize("rmsnorm", _result(["sm_90a", "gfx942"], []))
    found = regressions(new_spills, before)
    assert any("spill_free:gfx942: passed before, now fails" in r and "spills: gfx942 k 256" in r for r in found)
