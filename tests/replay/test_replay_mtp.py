"""The MTP option of a scratch replay (workbench.replay.mtp): its reference recorded under a key and a file of its
own, its loss recorded beside the main one and held against the reference's; the main model starts where a replay
without MTP starts; the default replays are untouched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sqlmodel import Session, select

from workbench.config import Settings
from workbench.errors import WorkbenchError
from workbench.replay.compare import judge_curve
from workbench.replay.presets import get_preset
from workbench.replay.references import reference_file
from workbench.replay.runner import plan_replay, run_replay
from workbench.store import LossReplay, get_engine

MODEL = "kimi-k3.1-pro"
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # three training child processes (the reference twice, the replay)
def test_an_mtp_replay_holds_both_losses_against_a_reference_of_its_own(settings, tmp_path):
    shutil.copytree(REPO / "replays" / MODEL, settings.replays_dir / MODEL)
    outcome = run_replay(MODEL, "scratch", settings, ops=["reference"], steps=4, mtp=True, export=True)
    assert outcome.status == "pass" and outcome.reference_source == "run"
    assert outcome.checks["mtp"]["passed"] and outcome.checks["mtp"]["steps"] == 4
    with Session(get_engine(settings.db_url)) as s:
        row = s.exec(select(LossReplay).where(LossReplay.kind == "operators")).one()
    assert len(row.detail["mtp_curve"]) == 4 and row.detail["mtp_curve"] == row.detail["reference_mtp_curve"]
    assert row.detail["mtp_curve"] != outcome.curve  # a loss of its own, beside the main one
    # the main model starts where the default replay starts: the shipped reference's first loss
    shipped = json.loads(reference_file(settings, MODEL, get_preset("tiny"), "scratch", 4, 0).read_text())
    assert outcome.curve[0] == shipped["result"]["curve"][0] and outcome.curve[1:] != shipped["result"]["curve"][1:]
    exported = json.loads(reference_file(settings, MODEL, get_preset("tiny"), "scratch-mtp", 4, 0).read_text())
    assert exported["result"]["mtp_curve"] == row.detail["mtp_curve"]
    fresh = Settings(db_url=f"sqlite:///{tmp_path / 'other.db'}", operators_dir=settings.operators_dir,
                     work_dir=settings.work_dir, replays_dir=settings.replays_dir)
    again = run_replay(MODEL, "scratch", fresh, ops=["reference"], steps=4, mtp=True)
    assert again.reference_source == "file" and again.status == "pass"
    default = run_replay(MODEL, "scratch", fresh, ops=["reference"], steps=4)
    # ... and the default replay still reads the main reference, which the MTP run left as it was (the curves
    # themselves are bit-identical only on one machine: the shipped file was recorded on another CPU)
    assert default.reference_source == "file" and default.reference_curve == shipped["result"]["curve"]
    assert default.status == "pass" and default.curve[0] == outcome.curve[0]


def test_mtp_is_a_single_process_scratch_option(settings):
    for kwargs in ({"mode": "lora"}, {"mode": "scratch", "ranks": 2}):
        mode = kwargs.pop("mode")
        with pytest.raises(WorkbenchError, match="--mtp trains a scratch replay in one process"):
            plan_replay(MODEL, mode, settings, mtp=True, **kwargs)
    assert plan_replay(MODEL, "scratch", settings, mtp=True).mtp


def test_a_second_curve_is_judged_step_by_step():
    preset = get_preset("tiny")
    assert judge_curve([5.0, 4.0], [5.0, 4.0], preset)["passed"]
    off = judge_curve([5.0, 4.1], [5.0, 4.0], preset)
    assert not off["passed"] and off["left_band_step"] == 1
    assert not judge_curve([5.0], [5.0, 4.0], preset)["passed"]
    assert judge_curve([5.0, float("nan")], [5.0, 4.0], preset)["left_band_step"] == 1
