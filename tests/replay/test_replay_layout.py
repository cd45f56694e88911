"""Replays under the target's parallel layout: 2 ranks on CPU (gloo), dense parameters sharded with FSDP2, routed
experts split across the ranks. The curve stays in the band of the single-process reference shipped in replays/;
a defect on one rank fails the replay naming the step and the rank; a rank that crashes or hangs ends the replay as
an error naming the rank, with nothing left running; the store record is finished either way."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from faulty_ops import CRASHING, HANGING
from sqlmodel import Session, select
from typer.testing import CliRunner

from workbench.cli import app
from workbench.config import Settings
from workbench.errors import WorkbenchError
from workbench.replay.compare import judge_ranks
from workbench.replay.distributed import Layout
from workbench.replay.faults import HEADER, ROUNDED_UP, write_op
from workbench.replay.launcher import RANK_NAME
from workbench.replay.presets import get_preset
from workbench.replay.runner import plan_replay, run_replay
from workbench.store import LossReplay, get_engine

MODEL = "kimi-k3.1-pro"
REPO = Path(__file__).resolve().parents[2]
KILLED = HEADER + '''
import os
import signal


def run(*args):
    os.kill(os.getpid(), signal.SIGKILL)
'''


def _is_rank(argv: list[bytes], comm: bytes) -> bool:
    """A rank started cold (``python -m workbench.replay.distributed``) or forked by a warm launcher (it names
    itself; its command line is the warm server's, which loads the module too but is no rank)."""
    cold = any(a == b"-m" and b == b"workbench.replay.distributed" for a, b in zip(argv, argv[1:], strict=False))
    return cold or comm.startswith(RANK_NAME.encode())


def _ranks_running() -> set[int]:
    """Pids of the replay rank processes this test process started, or left behind: its descendants, and ranks
    whose parents are gone (reparented to init). Another test process's ranks, under a live parent of their own,
    are not ours to count."""
    parents, ranks = {}, set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                comm = (entry / "comm").read_bytes().strip()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            if _is_rank(argv, comm):
                ranks.add(int(entry.name))

    def ours_or_orphaned(pid: int) -> bool:
        if parents.get(pid, 1) <= 1:
            return True
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    return {pid for pid in ranks if ours_or_orphaned(pid)}


def _last_row(settings: Settings) -> LossReplay:
    with Session(get_engine(settings.db_url)) as s:
        return s.exec(select(LossReplay).order_by(LossReplay.id.desc())).first()


@pytest.mark.slow  # two distributed trainings (the layout reference and the replay), about 20 s each
@pytest.mark.parametrize("mode, steps", [("scratch", 4), ("lora", 3)])
def test_two_ranks_stay_in_the_band_of_the_single_process_reference(shared, mode, steps):
    outcome = run_replay(MODEL, mode, shared, ops=["reference"], steps=steps, ranks=2)
    # the single-process reference shipped in replays/: read from its file, or from the module's store where an
    # earlier replay of the same key put it (never a reference run of its own)
    assert outcome.reference_source in ("file", "store")
    assert outcome.status == "pass", outcome.reason
    assert len(outcome.curve) == steps
    checks = outcome.checks
    assert checks["band"]["max_relative_deviation"] < 1e-5
    assert checks["parameters"]["passed"] and checks["eval_topk"]["passed"] and checks["ranks"]["passed"]
    row = _last_row(shared)
    assert row.status == "pass" and row.layout["ranks"] == 2
    assert row.layout["sharding"] == "fsdp2" and row.layout["experts"] == "ep"
    assert row.detail["layout_equivalence"]["status"] == "pass"
    assert len(row.detail["rank_curves"]) == 2 and all(len(c) == steps for c in row.detail["rank_curves"])


@pytest.mark.slow
def test_the_layout_planner_is_held_to_what_the_ranks_measured(shared):
    """Each rank measures what it holds (parameters, gradients, optimizer state: exact bytes; the peak of what the
    forward saves for backward); `workbench layout --against` plans the same model and layout and sets the two side
    by side. The planner's parameter-derived kinds match to a few percent (the indexer's weights, which take no
    gradient, are the difference); its activations count what a block must keep (inputs and outputs), a floor: the
    reference blocks keep their intermediates too, so the measured peak is several times the floor."""
    outcome = run_replay(MODEL, "scratch", shared, ops=["reference"], steps=4, ranks=2)
    assert outcome.status == "pass", outcome.reason
    row = _last_row(shared)
    memory = row.detail["rank_memory"]
    assert len(memory) == 2 and all(m["params_trainable"] > 0 and m["saved_device_peak"] > 0 for m in memory)
    assert all(m["params_frozen"] == 0 and m["saved_host_peak"] == 0 for m in memory)  # scratch, no --cache
    result = CliRunner().invoke(app, ["layout", MODEL, "--against", str(row.id), "--db", shared.db_url, "--json"])
    assert result.exit_code == 0, result.output
    held = {r["kind"]: r for r in json.loads(result.output)["against"]}
    assert held["weights"]["ratio"] == pytest.approx(1.0, abs=1e-9)
    assert held["gradients"]["ratio"] == pytest.approx(1.0, abs=0.03)
    assert held["optimizer"]["ratio"] == pytest.approx(1.0, abs=0.03)
    assert 0.1 < held["activations"]["ratio"] < 1.0
    assert held["host"]["measured"] == 0 and held["host"]["modelled"] == 0
    # the activations by the block that saved them: every block the model calls, and the glue between them
    by_block = {r["block"]: r for r in json.loads(result.output)["against_by_block"]}
    assert set(by_block) == set(memory[0]["saved_by_block"]) and "glue" in by_block
    assert all(r["measured"] > 0 and r["modelled"] > 0 for r in by_block.values())
    peak = max(m["saved_device_peak"] for m in memory)
    assert sum(memory[0]["saved_by_block"].values()) == memory[0]["saved_device_peak"]
    assert sum(r["measured"] for r in by_block.values()) >= peak


@pytest.mark.slow
def test_caching_to_the_host_tier_leaves_every_curve_bit_identical(shared):
    cache = "moe_grouped_gemm,kda,attnres:host"
    uncached = run_replay(MODEL, "scratch", shared, ops=["reference"], steps=4)
    single = run_replay(MODEL, "scratch", shared, ops=["reference"], steps=4, cache=cache)
    # bit for bit against the same run without caching on this machine (the shipped reference file was recorded on
    # another CPU, whose float32 products may round otherwise: it is the band that holds across machines)
    assert single.status == "pass" and uncached.status == "pass" and single.curve == uncached.curve
    assert _last_row(shared).layout["cache"] == ["moe_grouped_gemm", "kda", "attnres"]
    plain = run_replay(MODEL, "scratch", shared, ops=["reference"], steps=4, ranks=2)
    plain_ranks = _last_row(shared).detail["rank_curves"]
    cached = run_replay(MODEL, "scratch", shared, ops=["reference"], steps=4, ranks=2, cache=cache)
    assert cached.status == "pass" and cached.curve == plain.curve
    assert _last_row(shared).detail["rank_curves"] == plain_ranks


@pytest.mark.slow
def test_the_dispatch_in_chunks_overlapping_the_experts_stays_in_the_band(shared):
    outcome = run_replay(MODEL, "scratch", shared, ops=["reference"], steps=4, ranks=2, chunks=2)
    assert outcome.status == "pass", outcome.reason
    assert outcome.checks["band"]["max_relative_deviation"] < 1e-5 and outcome.checks["ranks"]["passed"]
    assert _last_row(shared).layout["chunks"] == 2


@pytest.mark.interpreter
@pytest.mark.slow
def test_promoted_operators_on_two_ranks_stay_in_the_band(settings):
    """Every promoted operator on every rank, through the Triton interpreter (2 steps): the operators read the rows
    the All-to-All delivered (waited for and plain tensors, not the collective's lazy wrapper)."""
    shutil.copytree(REPO / "operators", settings.operators_dir)
    shutil.copytree(REPO / "replays" / MODEL, settings.replays_dir / MODEL)
    outcome = run_replay(MODEL, "scratch", settings, steps=4, ranks=2)
    assert outcome.status == "pass", outcome.reason
    assert outcome.checks["ranks"]["passed"]
    used = {k: v for k, v in _last_row(settings).ops.items() if k != "band"}
    assert all(v != "reference" for v in used.values())


@pytest.mark.slow
def test_a_defect_on_one_rank_fails_naming_the_step_and_the_rank(shared, tmp_path):
    # 2 bits: K3's latent MoE RMS-normalises the combined output before its up projection, which absorbs most of a
    # rounding bias (at 6 bits rank 1's loss stays in its band; the trained parameters still differ)
    rounded = write_op(tmp_path, "combine_rounded", ROUNDED_UP, block="moe_combine", bits=2)
    outcome = run_replay(MODEL, "scratch", shared, ops=["reference"], steps=4, ranks=2,
                         rank_ops={1: [f"moe_combine={rounded}"]})
    assert outcome.status == "fail"
    assert outcome.checks["ranks"]["rank"] == 1 and outcome.checks["ranks"]["step"] == 0
    assert "first to leave: rank 1 left its band at step 0" in outcome.reason
    row = _last_row(shared)
    assert row.status == "fail" and row.layout["rank_ops"] == {"1": {"moe_combine": "combine_rounded.py"}}


@pytest.mark.slow
@pytest.mark.parametrize("fault, expected", [
    (CRASHING, "training failed at step 0: rank 1: RuntimeError: illegal memory access (simulated)"),
    (KILLED, "training failed at step 0: rank 1: the process died (exit -9)"),
])
def test_a_rank_that_crashes_ends_the_replay_naming_it(shared, tmp_path, fault, expected):
    before = _ranks_running()
    crash = write_op(tmp_path, "situ_crash", fault, block="situ")
    outcome = run_replay(MODEL, "scratch", shared, ops=["reference"], steps=4, ranks=2,
                         rank_ops={1: [f"situ={crash}"]})
    assert outcome.status == "error" and expected in outcome.reason
    assert _ranks_running() <= before
    row = _last_row(shared)
    assert row.status == "error" and row.finished_at is not None and row.reason == outcome.reason


@pytest.mark.slow
def test_a_rank_that_hangs_is_named_and_every_rank_stopped_within_the_timeout(shared, tmp_path):
    run_replay(MODEL, "scratch", shared, ops=["reference"], steps=4, ranks=2)  # the layout reference first
    before = _ranks_running()
    hang = write_op(tmp_path, "situ_hang", HANGING, block="situ")
    start = time.monotonic()
    outcome = run_replay(MODEL, "scratch", shared, ops=["reference"], steps=4, ranks=2,
                         rank_ops={1: [f"situ={hang}"]}, timeout_s=120, collective_timeout_s=8)
    assert time.monotonic() - start < 120
    assert outcome.status == "error"
    assert "rank 1 hung at step 0: rank(s) 0 timed out waiting for it in a collective" in outcome.reason
    assert _ranks_running() <= before
    row = _last_row(shared)
    assert row.status == "error" and row.finished_at is not None


def test_the_layout_is_checked_before_anything_runs(settings):
    with pytest.raises(WorkbenchError, match="3 ranks"):
        plan_replay(MODEL, "scratch", settings, ranks=3)  # 8 experts, 2 sequences
    with pytest.raises(WorkbenchError, match="unknown layout 'tp'"):
        plan_replay(MODEL, "scratch", settings, ranks=2, layout="tp")
    with pytest.raises(WorkbenchError, match="needs --ranks 2"):
        plan_replay(MODEL, "scratch", settings, layout="fsdp2+ep")
    with pytest.raises(WorkbenchError, match="--dispatch-chunks 17: a rank has only 16 tokens"):
        plan_replay(MODEL, "scratch", settings, ranks=2, chunks=17)
    with pytest.raises(WorkbenchError, match="--dispatch-chunks needs --ranks 2"):
        plan_replay(MODEL, "scratch", settings, chunks=2)
    with pytest.raises(WorkbenchError, match="no rank 2 among 2"):
        plan_replay(MODEL, "scratch", settings, ranks=2, rank_ops={2: ["situ=reference"]})
    plan = plan_replay(MODEL, "scratch", settings, ranks=2, rank_ops={1: ["situ=reference"]})
    assert plan.layout == Layout(2, "fsdp2", "ep") and plan.rank_ops == {1: {"situ": "reference"}}
    result = CliRunner().invoke(app, ["replay", MODEL, "--ranks", "2", "--rank-ops", "situ=reference"])
    assert result.exit_code == 2 and "bad --rank-ops 'situ=reference'" in result.output
    with Session(get_engine(settings.db_url)) as s:
        assert s.exec(select(LossReplay)).first() is None  # nothing recorded


def test_the_rank_check_names_the_first_step_and_the_rank_furthest_outside():
    preset = get_preset("tiny")
    reference = [[6.0, 5.0, 4.0], [6.0, 5.0, 4.0]]
    assert judge_ranks(reference, reference, preset)["passed"]
    off = judge_ranks([[6.0, 5.02, 4.1], [6.0, 5.05, 4.0]], reference, preset)
    assert (off["passed"], off["step"], off["rank"]) == (False, 1, 1)
    assert off["loss"] == 5.05 and off["reference"] == 5.0


def test_the_layout_reference_key_covers_the_layout_code(monkeypatch):
    """The expert-parallel MoE and the training loop of a layout run live in distributed.py (the launcher starts the
    ranks): an edit there changes the layout reference's key, so no replay is held to a reference recorded before."""
    import inspect

    from workbench.replay import distributed, launcher, references

    layout = Layout(2, "fsdp2", "ep")
    key = references.layout_key("k" * 32, layout)
    assert key == references.layout_key("k" * 32, layout) and key != references.layout_key("j" * 32, layout)
    assert distributed in references.LAYOUT_MODULES and launcher in references.LAYOUT_MODULES
    edited = [inspect.getsource(m) + ("# edited\n" if m is distributed else "") for m in references.LAYOUT_MODULES]
    monkeypatch.setattr(inspect, "getsource", lambda module: edited[references.LAYOUT_MODULES.index(module)])
    assert references.layout_key("k" * 32, layout) != key
