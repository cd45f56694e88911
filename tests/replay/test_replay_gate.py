"""The agent's last gate before promotion: a short replay with the candidate in its block's place. A candidate whose
curve holds is promoted (the replay recorded against the run); one whose curve leaves the band is not."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from workbench.agent.run import port_block
from workbench.replay.arch import architecture
from workbench.replay.presets import get_preset
from workbench.replay.references import reference_key
from workbench.replay.train import RunResult
from workbench.store import get_engine, records
from workbench.store.queries import run_steps

pytestmark = pytest.mark.interpreter
FAST = {"seeds": 1, "suites": ["smoke"], "dtypes": ["float32"], "budget": 3}
STEPS = 3
PRO = architecture("kimi-k3.1-pro", get_preset("tiny").layers)


def test_a_candidate_that_holds_its_curve_is_promoted(settings):
    outcome = port_block("situ", settings, replay_steps=STEPS, **FAST)
    assert outcome.status == "promoted", outcome.reason
    gate = [s for s in run_steps(get_engine(settings.db_url), outcome.run_id) if s.node == "replay"]
    assert len(gate) == 1 and gate[0].data["status"] == "pass" and f"{STEPS} scratch steps" in gate[0].message
    replays = records.find_reference_replay(get_engine(settings.db_url), "kimi-k3.1-pro",
                                            reference_key(get_preset("tiny"), PRO, "scratch", STEPS, 0, None))
    assert replays is not None and len(replays["curve"]) == STEPS
    manifest = json.loads(Path(outcome.operator_path).with_suffix(".json").read_text())
    assert manifest["replay"] == {"replay_id": gate[0].data["replay_id"], "model": "kimi-k3.1-pro",
                                  "mode": "scratch", "steps": STEPS}  # the evidence says it was replayed


def test_a_candidate_whose_curve_leaves_the_band_is_not_promoted(settings):
    """The recorded reference is replaced by a curve 1% higher from step 1 on (what a real reference would look like
    if the candidate carried a systematic error): the passing candidate fails the gate and the run ends blocked."""
    preset = get_preset("tiny")
    key = reference_key(preset, PRO, "scratch", STEPS, 0, None)
    from workbench.replay.ops import load_ops, reference_ops
    from workbench.replay.train import train

    truth = train(preset, PRO, "scratch", STEPS, 0, load_ops(reference_ops(PRO.blocks)))
    shifted: RunResult = dataclasses.replace(truth, curve=[c * (1.01 if i else 1) for i, c in enumerate(truth.curve)])
    records.save_reference_replay(get_engine(settings.db_url), model="kimi-k3.1-pro", mode="scratch",
                                  preset=preset.name, seed=0, backend="interpreter", key=key, result=asdict(shifted))
    outcome = port_block("situ", settings, replay_steps=STEPS, **FAST)
    assert outcome.status == "blocked"
    assert "every passing candidate failed the replay gate" in outcome.reason and "left the band at step 1" in \
        outcome.reason
    assert not (settings.operators_dir / "situ").exists()
