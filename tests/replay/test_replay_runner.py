"""`workbench replay` end to end: the reference recorded, found again in the store or the exported file, the
record of each replay, the plot, and clear errors for bad input or a broken operator (nothing left running)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from faulty_ops import CRASHING, HANGING
from sqlmodel import Session, select
from typer.testing import CliRunner

from workbench.ci import CI_REPLAY_MODELS
from workbench.cli import app
from workbench.replay.faults import write_op
from workbench.replay.presets import get_preset
from workbench.replay.references import base_path, reference_file
from workbench.replay.runner import run_replay
from workbench.store import LossReplay, get_engine

MODEL = "kimi-k3.1-pro"
CARDS = CI_REPLAY_MODELS  # the shipped cards, each with its replay references in replays/
REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _rows(settings) -> list[LossReplay]:
    with Session(get_engine(settings.db_url)) as s:
        return list(s.exec(select(LossReplay).order_by(LossReplay.id)))


@pytest.mark.slow  # training child processes, 17-51 s each: the whole suite's
def test_cli_records_the_reference_once_and_holds_a_replay_against_it(settings, tmp_path):
    first = runner.invoke(app, ["replay", MODEL, "--ops", "reference", "--steps", "4", "--json"])
    assert first.exit_code == 0, first.output
    outcome = json.loads(first.output)
    assert outcome["status"] == "pass" and outcome["reference_source"] == "run"
    assert len(outcome["curve"]) == 4 and outcome["curve"] == outcome["reference_curve"]
    assert Path(outcome["plot"]).is_file() and Path(outcome["plot"]).read_bytes()[:4] == b"\x89PNG"
    again = runner.invoke(app, ["replay", MODEL, "--ops", "reference", "--steps", "4"])
    assert again.exit_code == 0, again.output
    assert "reference from the store" in again.output and "pass" in again.output
    rows = _rows(settings)
    assert [r.kind for r in rows] == ["reference", "operators", "operators"]
    assert rows[1].status == "pass" and rows[1].curve == rows[0].curve and rows[1].steps == 4
    assert rows[1].ops["band"] == get_preset("tiny").band_rtol and rows[1].detail["checks"]["band"]["passed"]


@pytest.mark.slow  # training child processes, 17-51 s each: the whole suite's
def test_an_exported_reference_serves_a_fresh_store(settings, tmp_path):
    run_replay(MODEL, "scratch", settings, ops=["reference"], steps=3, export=True)
    exported = reference_file(settings, MODEL, get_preset("tiny"), "scratch", 3, 0)
    assert json.loads(exported.read_text())["result"]["curve"]
    fresh = settings.__class__(db_url=f"sqlite:///{tmp_path / 'other.db'}", operators_dir=settings.operators_dir,
                               work_dir=settings.work_dir, replays_dir=settings.replays_dir)
    assert run_replay(MODEL, "scratch", fresh, ops=["reference"], steps=3).reference_source == "file"


@pytest.mark.slow  # training child processes, 17-51 s each: the whole suite's
def test_a_lora_replay_trains_its_base_checkpoint_once(settings):
    outcome = run_replay(MODEL, "lora", settings, ops=["reference"], steps=3)
    base = base_path(settings, MODEL, get_preset("tiny"))
    assert outcome.status == "pass" and base.is_file()
    stamp = base.stat().st_mtime_ns
    run_replay(MODEL, "lora", settings, ops=["reference"], steps=3, rerun_reference=True)
    assert base.stat().st_mtime_ns == stamp


@pytest.mark.parametrize("args, message", [
    (["replay", "no-such-model"], "unknown model"),
    (["replay", MODEL, "--mode", "finetune"], "unknown replay mode 'finetune'"),
    (["replay", MODEL, "--preset", "huge"], "unknown replay preset 'huge'"),
    (["replay", MODEL, "--ops", "bogus"], "bad --ops word 'bogus'"),
    (["replay", MODEL, "--ops", "kda=/no/such/file.py"], "no such file"),
    (["replay", MODEL, "--ops", "nosuchblock=reference"], "unknown block 'nosuchblock'"),
])
def test_bad_input_is_one_line_and_exit_2_with_nothing_recorded(settings, args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and message in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert _rows(settings) == []


@pytest.mark.slow  # training child processes, 17-51 s each: the whole suite's
def test_a_crashing_operator_ends_the_replay_as_an_error_with_its_reason(settings, tmp_path):
    crash = write_op(tmp_path, "kda_crash", CRASHING, block="kda")
    result = runner.invoke(app, ["replay", MODEL, "--steps", "2", "--ops", f"kda={crash}"])
    assert result.exit_code == 1
    assert "training failed at step 0: RuntimeError: illegal memory access (simulated)" in result.output
    replay = _rows(settings)[-1]
    assert replay.kind == "operators" and replay.status == "error" and replay.finished_at is not None


@pytest.mark.slow  # training child processes, 17-51 s each: the whole suite's
def test_a_hanging_operator_is_killed_at_the_timeout(settings, tmp_path):
    run_replay(MODEL, "scratch", settings, ops=["reference"], steps=2)  # the reference first, without a timeout
    hang = write_op(tmp_path, "situ_hang", HANGING, block="situ")
    outcome = run_replay(MODEL, "scratch", settings, ops=[f"situ={hang}"], steps=2, timeout_s=15)
    assert outcome.status == "error" and "timed out after 15 s (at step 0)" in outcome.reason
    assert _rows(settings)[-1].status == "error"


@pytest.mark.interpreter
@pytest.mark.slow
def test_promoted_operators_on_the_interpreter_stay_in_the_band(settings):
    """Every promoted operator of the repository at once, through the Triton interpreter (a few steps): kimi-k3's
    tiny model runs KDA (with its short convolution and bounded gate) and MLA, kimi-k3.1-pro's KDA and gated DSA,
    both latent MoE with SiTU experts and a SiTU shared expert. Then --ops library, in the replay's sandboxed
    child: the same operators called through workbench.kernels' custom ops give the operator files' curve exactly,
    and the record names each op "library:<file>"."""
    shutil.copytree(REPO / "operators", settings.operators_dir)
    curves = {}
    for model in CARDS:
        outcome = run_replay(model, "scratch", settings, steps=2)
        assert outcome.status == "pass", (model, outcome.reason)
        used = {k: v for k, v in _rows(settings)[-1].ops.items() if k != "band"}
        assert all(v != "reference" for v in used.values()), (model, used)
        curves[model] = outcome.curve
    library = run_replay(MODEL, "scratch", settings, ops=["library"], steps=2)
    assert library.status == "pass", library.reason
    assert library.curve == curves[MODEL] and len(library.curve) == 2
    used = {k: v for k, v in _rows(settings)[-1].ops.items() if k != "band"}
    assert all(v.startswith("library:") for v in used.values()), used


@pytest.mark.parametrize("model", CARDS)
def test_the_references_kept_in_the_repository_match_the_code(model):
    """replays/ holds the reference runs CI compares against: each file's key must be what the code computes now
    (a change to the replay model, the data or a block's reference makes them stale: re-record them with
    `workbench replay <model> --mode <mode> --steps <n> --ops reference --rerun-reference --export-reference`)."""
    from workbench.ci import CI_REPLAYS
    from workbench.config import Settings
    from workbench.replay.arch import architecture
    from workbench.replay.references import BASE_SEED, reference_key

    repo = Settings(db_url="sqlite://", operators_dir=REPO / "operators",
                                    work_dir=REPO / ".workbench", replays_dir=REPO / "replays")
    tiny = get_preset("tiny")
    arch = architecture(model, tiny.layers)
    base = base_path(repo, model, tiny)
    meta = json.loads(base.with_suffix(".json").read_text())
    assert meta["key"] == reference_key(tiny, arch, "base", tiny.base_steps, BASE_SEED, None), "stale base checkpoint"
    wanted = {(mode, steps) for mode, steps in CI_REPLAYS} | {(m, tiny.default_steps(m)) for m in ("scratch", "lora")}
    for mode, steps in sorted(wanted):
        shipped = json.loads(reference_file(repo, model, tiny, mode, steps, 0).read_text())
        assert shipped["key"] == reference_key(tiny, arch, mode, steps, 0, base if mode == "lora" else None), \
            f"stale reference {mode} {steps} steps"
        assert len(shipped["result"]["curve"]) == steps
