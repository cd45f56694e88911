"""The port's tuning (workbench.agent.tune): the per-target descent over a template's declared launch settings, the
move to a neighbouring point where a target spills at every setting, the budget, and what the record keeps. The
probe here is a function of the settings (what compiling would show); tests/agent/test_tune_targets.py runs the
real compile-only probe."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from workbench.agent.tune import Figure, Tuner, axis, base_settings, compiled_as, neighbours
from workbench.templating import format_point, load_template

TARGETS = ["sm_80", "sm_90a", "gfx942"]


def template(tmp_path: Path, launch: str, params: str = "  BD: {choices: [128, 64]}\n  num_warps: {choices: [4, 8]}"):
    """A template whose LAUNCH_SETTINGS takes num_warps from its point, with ``launch`` declared."""
    folder = tmp_path / "blk"
    folder.mkdir(exist_ok=True)
    (folder / "t.py.j2").write_text('BLOCK = "blk"\nLAUNCH_SETTINGS = {"default": {"num_warps": {{ num_warps }}, '
                                    '"num_stages": None}}\nTUNED_SETTINGS = {{ TUNED }}\n')
    (folder / "t.yaml").write_text(f"summary: s\nparams:\n{params}\nlaunch:\n{launch}\n")
    return load_template("blk", "t")


@pytest.fixture
def warps_and_stages(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    return template(tmp_path, "  num_warps: {choices: [4, 8, 2]}\n  num_stages: {choices: [null, 1, 2, 3]}")


def launch_table(tmpl):
    return lambda params: {"default": {"num_warps": params["num_warps"], "num_stages": None}}


def figure_of(settings: dict, target: str, bd: int = 128) -> Figure:
    """What compiling would show: NVIDIA spills at 4 warps and below unless the tile is 64 wide; more stages are
    faster until 2 on sm_90a (Triton's own stages there are 3); AMD is fastest at 4 warps."""
    warps, stages = settings.get("num_warps", 4), compiled_as("num_stages", settings.get("num_stages"), target)
    spills = 96 if target.startswith("sm_") and warps <= 4 and bd == 128 else 0
    time = {2: 3.0, 4: 2.0, 8: 1.5}[warps] if target.startswith("sm_") else {2: 2.0, 4: 1.0, 8: 1.2}[warps]
    if target == "sm_90a":
        time *= {1: 0.9, 2: 0.8, 3: 0.85}[stages]
    return Figure(ok=True, spilled_bytes=spills, registers=255 if spills else 168, time_ms=time)


class FakeProbe:
    """Records each call (params, table, targets) and answers with figure_of."""

    def __init__(self):
        self.calls = []

    def __call__(self, params, table, targets):
        self.calls.append((dict(params), {t: dict(s) for t, s in table.items()}, list(targets)))
        base = {"num_warps": params["num_warps"], "num_stages": None}
        return {t: figure_of({**base, **table.get(t, {})}, t, params["BD"]) for t in targets}


def test_each_target_descends_to_its_own_best_settings_and_says_why_it_stopped(warps_and_stages):
    probe = FakeProbe()
    outcome = Tuner(warps_and_stages, {"BD": 128, "num_warps": 4}, launch_table(warps_and_stages), TARGETS, probe,
                    budget=12).run()
    # NVIDIA: 8 warps relieve the spill; sm_90a also gains from 2 stages; AMD keeps the template's 4 warps
    assert outcome.tuned == {"sm_80": {"num_warps": 8}, "sm_90a": {"num_stages": 2, "num_warps": 8}}
    assert outcome.spill_free_on() == TARGETS
    assert all(reason.startswith("local optimum") for reason in outcome.stopped.values())
    # the first probe is the passing point itself, on every target; a probe compiles only the targets it moves
    assert probe.calls[0] == ({"BD": 128, "num_warps": 4}, {}, TARGETS)
    assert all(set(table) <= set(targets) for _, table, targets in probe.calls)
    # a spilling target tries the move that relieves register pressure first: more warps
    sm80 = [t for t in outcome.trials if t.target == "sm_80"]
    assert sm80[1].settings == {"num_warps": 8, "num_stages": 2} and sm80[1].moved
    assert "every setting one step toward fewer registers" in sm80[1].why and "better than" in sm80[1].why
    # the stages the bold step changed for nothing on sm_80 are taken back: as good, nearer the template
    back = next(t for t in sm80[2:] if t.moved)
    assert back.settings == {"num_warps": 8, "num_stages": None}
    assert "as good and nearer the template's settings" in back.why
    record = sm80[1].to_dict()
    assert record["registers"] == 168 and record["spilled_bytes"] == 0 and record["measured"] is False


def test_the_probe_budget_ends_the_search_and_the_reason_says_so(warps_and_stages):
    outcome = Tuner(warps_and_stages, {"BD": 128, "num_warps": 4}, launch_table(warps_and_stages), TARGETS,
                    FakeProbe(), budget=2).run()
    # the bold step that relieved NVIDIA's spill is the spill's probe: the budget of 2 counts past it
    assert outcome.probes == 3
    assert any("probe budget of 2 spent (and 1 relieving spills)" in reason for reason in outcome.stopped.values())
    # what the one move found stands: NVIDIA spill-free at the bold step (not yet taken back to fewer changes)
    assert outcome.tuned["sm_80"] == {"num_warps": 8, "num_stages": 2}
    assert outcome.best["sm_80"].spilled_bytes == 0


def test_a_target_that_spills_at_every_setting_moves_the_point_to_a_smaller_tile(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    only_warps_4 = template(tmp_path, "  num_stages: {choices: [null, 1]}")  # no launch setting relieves the spill
    outcome = Tuner(only_warps_4, {"BD": 128, "num_warps": 4}, launch_table(only_warps_4), TARGETS, FakeProbe(),
                    budget=8).run()
    assert outcome.params == {"BD": 64, "num_warps": 4}
    assert outcome.spill_free_on() == TARGETS
    moved = [t for t in outcome.trials if t.params["BD"] == 64 and t.moved]
    assert moved and "spill at every launch setting tried: BD 128 -> 64" in moved[0].why


def test_a_spilling_target_grows_the_probe_budget_until_it_is_spill_free(warps_and_stages):
    outcome = Tuner(warps_and_stages, {"BD": 128, "num_warps": 4}, launch_table(warps_and_stages), TARGETS,
                    FakeProbe(), budget=1).run()
    # the passing point spills on NVIDIA: the budget of 1 grows to 3 while it does, the bold step relieves it, and
    # then the port's own budget, counted past the probe that relieved the spill, stops the search
    assert outcome.probes == 2 and outcome.spill_free_on() == TARGETS
    assert set(outcome.stopped.values()) == {"probe budget of 1 spent (and 1 relieving spills)"}
    stuck = Tuner(warps_and_stages, {"BD": 128, "num_warps": 2}, lambda p: {"default": {"num_warps": 2}},
                  ["sm_80"], lambda params, table, targets: {"sm_80": Figure(ok=True, spilled_bytes=8, time_ms=1.0)},
                  budget=2).run()
    # settings that relieve nothing end the launch search once two in a row did and each single relieving step
    # was tried, and the next step past a tie that way (the bold step, more warps, the next step that way, fewer
    # stages, the next step that way); the point search then finds the budget spent
    assert stuck.probes == 6 and stuck.stopped["sm_80"].startswith(
        "no relief from the last 5 settings tried (each one step toward fewer registers among them)")
    assert "(probe budget of 6 (3 x 2 while a target spills) spent)" in stuck.stopped["sm_80"]


def test_a_spill_at_the_smoke_suite_alone_is_searched_within_the_ports_own_budget(warps_and_stages):
    """kda's reduction kept 8 B a thread at one smoke shape on sm_100a, at every setting its tuning tried, and took
    three times the port's budget: a spill at the model's own sizes earns that, one at the smoke suite alone not."""
    def stuck(smoke_only):
        tuner = Tuner(warps_and_stages, {"BD": 128, "num_warps": 2}, lambda p: {"default": {"num_warps": 2}},
                      ["sm_80"], lambda params, table, targets: {"sm_80": Figure(ok=True, spilled_bytes=8, time_ms=1.0,
                                                                                 smoke_only=smoke_only)}, budget=2)
        return tuner.run()
    at_model, at_smoke = stuck(False), stuck(True)
    assert (at_model.probes, at_smoke.probes) == (6, 2)
    assert at_smoke.stopped["sm_80"] == "probe budget of 2 spent; still 0 registers, spills 8 B, 1.0000 ms " \
                                        "modelled (probe budget of 2 spent)"


def test_a_bold_step_that_fails_has_each_of_its_single_steps_tried(tmp_path, monkeypatch):
    """The attention's dK/dV kernel on sm_80: more warps and fewer stages at once spilled, and so did fewer stages
    alone; the search stopped there, before more warps alone, the step that might relieve it."""
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    stages_first = template(tmp_path, "  num_stages: {choices: [null, 1, 2, 3]}\n  num_warps: {choices: [4, 8, 2]}")

    def probe(params, table, targets):  # fewer stages spill; more warps relieve, at Triton's own stages only
        def figure(target):
            settings = {"num_warps": params["num_warps"], "num_stages": None, **table.get(target, {})}
            relieved = settings["num_warps"] == 8 and compiled_as("num_stages", settings["num_stages"], target) == 3
            return Figure(ok=True, spilled_bytes=0 if relieved else 16, time_ms=1.0)
        return {t: figure(t) for t in targets}

    outcome = Tuner(stages_first, {"BD": 128, "num_warps": 4}, launch_table(stages_first), ["sm_80"], probe,
                    budget=8).run()
    assert outcome.params == {"BD": 128, "num_warps": 4} and outcome.tuned == {"sm_80": {"num_warps": 8}}
    # the bold step, fewer stages (and, as good, the next steps that way): more than two in a row that relieve
    # nothing, and still more warps alone is tried
    moves = [t.why.split(":")[0] for t in outcome.trials[1:]]
    warps = moves.index("num_warps 4 -> 8")
    assert moves[:2] == ["every setting one step toward fewer registers a thread", "num_stages None -> 2"]
    assert warps > 2 and outcome.trials[1 + warps].moved


def test_a_step_toward_fewer_registers_that_spills_as_much_has_the_next_one_tried(warps_and_stages):
    """The attention's dK/dV kernel on sm_80 at GPT-OSS's sliding layer (its compile matrix: 4 warps keep 8 B at
    Triton's own 3 stages and at 2, none at 1; 8 warps spill 32 B at another layer): after the bold step and more
    warps, the step to 2 stages spills as much (modelled 1% slower), and the stall must not end the search before
    the step past it, to 1."""
    def probe(params, table, targets):
        def figure(target):
            settings = {"num_warps": params["num_warps"], "num_stages": None, **table.get(target, {})}
            stages = compiled_as("num_stages", settings["num_stages"], target)
            spilled = 32 if settings["num_warps"] == 8 else 0 if stages == 1 else 8
            return Figure(ok=True, spilled_bytes=spilled, time_ms=1.012 if stages == 2 else 1.0)
        return {t: figure(t) for t in targets}

    outcome = Tuner(warps_and_stages, {"BD": 128, "num_warps": 4}, launch_table(warps_and_stages), ["sm_80"], probe,
                    budget=8).run()
    moves = [t.why.split(":")[0] for t in outcome.trials[1:]]
    assert moves[:4] == ["every setting one step toward fewer registers a thread", "num_warps 4 -> 8",
                         "num_stages None -> 2", "num_stages 2 -> 1"]
    assert outcome.tuned == {"sm_80": {"num_stages": 1}} and outcome.spill_free_on() == ["sm_80"]


def stages_probe(nvidia_spills):
    """NVIDIA spills 96 B where ``nvidia_spills(params)``, at any launch setting; gfx942 is spill-free and fastest
    at 1 stage, one step below the 2 Triton compiles the template's None with there."""
    def probe(params, table, targets):
        def figure(target):
            stages = compiled_as("num_stages", table.get(target, {}).get("num_stages"), target)
            if target.startswith("sm_"):
                return Figure(ok=True, spilled_bytes=96 if nvidia_spills(params) else 0, time_ms=1.0)
            return Figure(ok=True, time_ms={3: 0.95, 2: 0.9, 1: 0.8}[stages])
        return {t: figure(t) for t in targets}
    return probe


def test_launch_settings_that_relieve_nothing_hand_over_to_the_point_search(warps_and_stages):
    """dsa_sparse_attention's reversed walk spent 16 probes on sm_90a's launch settings, none relieving its 64 B,
    before its time budget ended: now two in a row that relieve nothing end the launch search, and the point
    search comes first; the spill-free target's speed search waits for it."""
    probe = stages_probe(lambda params: params["BD"] == 128)
    calls = []
    outcome = Tuner(warps_and_stages, {"BD": 128, "num_warps": 4}, launch_table(warps_and_stages), TARGETS,
                    lambda *args: calls.append(args[0]["BD"]) or probe(*args), budget=12).run()
    assert outcome.params["BD"] == 64 and outcome.spill_free_on() == TARGETS
    # the passing point, the bold launch step, each single step of it (more warps, fewer stages) and the step past
    # the stages' tie (fewer still): then the smaller point
    assert calls[:6] == [128, 128, 128, 128, 128, 64]
    nvidia_at_128 = [t for t in outcome.trials if t.target == "sm_80" and t.params["BD"] == 128]
    assert len(nvidia_at_128) == 6 and not any(t.moved for t in nvidia_at_128[1:])
    # BD's growth back is judged by the figures its launch search there found: no probe, no second search
    assert nvidia_at_128[-1].why.endswith("growing it back: BD 64 -> 128: 0 registers, spills 96 B, 1.0000 ms "
                                          "modelled (as probed before)")
    # gfx942 reaches its best stages at the point the search ended at
    assert outcome.tuned["gfx942"] == {"num_stages": 1}


def test_where_no_point_relieves_the_spill_free_targets_speed_search_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    fixed = template(tmp_path, "  num_warps: {choices: [4, 8, 2]}\n  num_stages: {choices: [null, 1, 2, 3]}",
                     params="  BD: {choices: [128]}\n  num_warps: {choices: [4]}")
    calls = []

    def probe(params, table, targets):
        calls.append({t: dict(s) for t, s in table.items()})
        return stages_probe(lambda p: True)(params, table, targets)

    outcome = Tuner(fixed, {"BD": 128, "num_warps": 4}, launch_table(fixed), TARGETS, probe, budget=12).run()
    assert outcome.spill_free_on() == ["gfx942"] and outcome.tuned["gfx942"] == {"num_stages": 1}
    assert outcome.stopped["sm_80"].startswith("no relief from the last 4 settings tried")
    assert "no other point of the template left to try" in outcome.stopped["sm_80"]
    assert outcome.stopped["gfx942"].startswith("local optimum")
    # the resumed search remembers what gfx942 tried before the pause: no setting is probed twice
    gfx942 = [t.settings for t in outcome.trials if t.target == "gfx942"]
    assert len(gfx942) == len({format_point(s) for s in gfx942})
    # after NVIDIA's four settings, gfx942's probes carry no NVIDIA settings
    assert all(set(table) <= {"gfx942"} for table in calls[5:])


def test_while_a_target_spills_the_time_budget_is_three_times_the_ports(warps_and_stages):
    tuner = Tuner(warps_and_stages, {"BD": 128, "num_warps": 4}, launch_table(warps_and_stages), TARGETS,
                  FakeProbe(), seconds=10.0)
    tuner.started = time.monotonic() - 15
    assert tuner._spent(True) == "" and tuner._spent(False) == "time budget of 10 s spent"
    tuner.started = time.monotonic() - 31
    assert tuner._spent(True) == "time budget of 30 s spent (3 x 10 while a target spills)"


def test_the_time_budget_ends_the_search_and_the_reason_says_so(warps_and_stages):
    outcome = Tuner(warps_and_stages, {"BD": 128, "num_warps": 4}, launch_table(warps_and_stages), TARGETS,
                    FakeProbe(), budget=8, seconds=0.0).run()
    assert outcome.probes == 1  # the passing point's own figures: a probe is never cut, only not started
    assert all(reason.startswith("time budget of 0 s spent") for reason in outcome.stopped.values())


def test_a_point_move_first_takes_every_size_one_step_smaller(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    two_tiles = template(tmp_path, "  num_stages: {choices: [null, 1]}", params="  BD: {choices: [128, 64, 32]}\n"
                         "  BN: {choices: [64, 32, 16]}\n  num_warps: {choices: [4]}")
    calls = []

    def probe(params, table, targets):  # NVIDIA spills unless both tiles are smaller
        calls.append(dict(params))
        spills = 64 if params["BD"] > 64 or params["BN"] > 32 else 0
        return {t: Figure(ok=True, spilled_bytes=spills if t.startswith("sm_") else 0,
                          time_ms=params["BD"] * params["BN"] / 1e4) for t in targets}

    outcome = Tuner(two_tiles, {"BD": 128, "BN": 64, "num_warps": 4}, launch_table(two_tiles), TARGETS, probe,
                    budget=8).run()
    assert outcome.params == {"BD": 64, "BN": 32, "num_warps": 4} and outcome.spill_free_on() == TARGETS
    first_move = next(t for t in outcome.trials if t.params != {"BD": 128, "BN": 64, "num_warps": 4})
    assert first_move.moved and "every size one step smaller: BD 128 -> 64, BN 64 -> 32" in first_move.why
    assert {"BD": 32, "BN": 64, "num_warps": 4} not in calls  # no single-size move was needed


def test_the_point_descends_through_points_that_spill_less(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    two_tiles = template(tmp_path, "  num_stages: {choices: [null, 1]}", params="  BD: {choices: [128, 64, 32]}\n"
                         "  BN: {choices: [64, 32, 16]}\n  num_warps: {choices: [4]}")
    points = []

    def probe(params, table, targets):  # NVIDIA spills in proportion to the tile until it is 32 x 16
        points.append((params["BD"], params["BN"]))
        spills = 0 if params["BD"] * params["BN"] <= 512 else params["BD"] * params["BN"] // 8
        return {t: Figure(ok=True, spilled_bytes=spills if t.startswith("sm_") else 0, time_ms=1.0) for t in targets}

    outcome = Tuner(two_tiles, {"BD": 128, "BN": 64, "num_warps": 4}, launch_table(two_tiles), TARGETS, probe,
                    budget=8).run()
    assert outcome.params == {"BD": 32, "BN": 16, "num_warps": 4} and outcome.spill_free_on() == TARGETS
    # 128 x 64 spills 1024 B; every size one step smaller spills 256 B: the point moves there, and from there
    # the same bold step is spill-free (no point of the old one's neighbourhood is probed in between)
    moves = [(t.params["BD"], t.params["BN"]) for t in outcome.trials if t.moved and t.target == "sm_80"]
    assert moves[-2:] == [(64, 32), (32, 16)]
    # then the tiles the spills shrank grow back one at a time: both spill again, so the point stays
    assert [p for p in dict.fromkeys(points) if p != (128, 64)] == [(64, 32), (32, 16), (64, 16), (32, 32)]
    assert "less spill: the point moves" in next(t.why for t in outcome.trials if t.params["BD"] == 64)


def test_a_spill_past_a_register_file_shrinks_the_point_before_any_launch_setting(tmp_path, monkeypatch):
    """128 x 64 spills 8 KB a thread on NVIDIA: no number of stages relieves that, so the first probes are the bold
    point steps (while each spills less), and only the spill-free point's launch settings are searched."""
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    two_tiles = template(tmp_path, "  num_stages: {choices: [null, 1, 2]}", params="  BD: {choices: [128, 64, 32]}\n"
                         "  BN: {choices: [64, 32, 16]}\n  num_warps: {choices: [4]}")
    calls = []

    def probe(params, table, targets):  # NVIDIA spills a byte for each element past 512 of the tile
        calls.append((params["BD"], params["BN"], {t: dict(s) for t, s in table.items()}))
        spills = max(0, params["BD"] * params["BN"] - 512)
        return {t: Figure(ok=True, spilled_bytes=spills if t.startswith("sm_") else 0, time_ms=1.0) for t in targets}

    outcome = Tuner(two_tiles, {"BD": 128, "BN": 64, "num_warps": 4}, launch_table(two_tiles), TARGETS, probe,
                    budget=8).run()
    assert outcome.params == {"BD": 32, "BN": 16, "num_warps": 4} and outcome.spill_free_on() == TARGETS
    # the passing point (7680 B), then 64 x 32 (1536 B, still past HEAVY_SPILL), then 32 x 16: no table in between
    assert [(bd, bn) for bd, bn, _ in calls[:3]] == [(128, 64), (64, 32), (32, 16)]
    assert all(table == {} for *_, table in calls[:3])
    shrink = [t for t in outcome.trials if t.target == "sm_80" and t.moved][1]
    assert "spill over 1024 B a thread (or do not compile): every size one step smaller before any launch " \
           "setting: BD 128 -> 64, BN 64 -> 32" in shrink.why


def test_a_smaller_point_takes_the_warps_its_constraints_allow(tmp_path, monkeypatch):
    """moe_grouped_gemm_mxfp4's constraint: 8 warps only on a tile of at least 8192 elements. From 128 x 64 over 8
    warps the bold step is 64 x 32 over 4 (the point's warps are only its default: each target's table sets
    them), not no point at all."""
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    tiles = template(tmp_path, "  num_warps: {choices: [4, 8, 2]}", params="  BD: {choices: [128, 64, 32]}\n"
                     "  BN: {choices: [64, 32, 16]}\n  num_warps: {choices: [4, 8]}")
    (tmp_path / "blk" / "t.yaml").write_text((tmp_path / "blk" / "t.yaml").read_text().replace(
        "launch:", "constraints:\n  - \"num_warps == 4 or BD * BN >= 8192\"\nlaunch:"))
    tiles = load_template("blk", "t")

    def probe(params, table, targets):  # NVIDIA spills a byte for each element past 2048 of the tile
        spills = max(0, params["BD"] * params["BN"] - 2048)
        return {t: Figure(ok=True, spilled_bytes=spills if t.startswith("sm_") else 0, time_ms=1.0) for t in targets}

    outcome = Tuner(tiles, {"BD": 128, "BN": 64, "num_warps": 8}, launch_table(tiles), TARGETS, probe,
                    budget=8).run()
    assert outcome.params == {"BD": 64, "BN": 32, "num_warps": 4} and outcome.spill_free_on() == TARGETS
    assert outcome.trials[len(TARGETS)].why.endswith("BD 128 -> 64, BN 64 -> 32, num_warps 8 -> 4: "
                                                      "0 registers, spill-free, 1.0000 ms modelled, less spill: "
                                                      "the point moves")


def test_where_the_smallest_sizes_still_spill_the_arithmetic_moves_before_any_tile_grows(tmp_path, monkeypatch):
    """mla's reversed float32 dots spill on NVIDIA at the smallest tiles: the dtype's other choice (its numerics
    verified before it is promoted) is tried before any larger tile, alone, and taken where it spills less."""
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    tiles = template(tmp_path, "  num_warps: {choices: [4, 8, 2]}", params="  BD: {choices: [32, 16]}\n"
                     "  DOT: {choices: [float32, input]}\n  num_warps: {choices: [4]}")
    tried = []

    def probe(params, table, targets):  # float32 operands spill at any tile; input ones only past 16
        tried.append((params["BD"], params["DOT"]))
        spills = 512 if params["DOT"] == "float32" else 0 if params["BD"] == 16 else 64
        return {t: Figure(ok=True, spilled_bytes=spills if t.startswith("sm_") else 0, time_ms=1.0) for t in targets}

    outcome = Tuner(tiles, {"BD": 16, "DOT": "float32", "num_warps": 4}, launch_table(tiles), TARGETS, probe,
                    budget=8).run()
    assert outcome.params == {"BD": 16, "DOT": "input", "num_warps": 4} and outcome.spill_free_on() == TARGETS
    assert list(dict.fromkeys(tried))[:2] == [(16, "float32"), (16, "input")]  # not (32, ...) first, nor both
    move = next(t for t in outcome.trials if t.params["DOT"] == "input")
    assert "DOT float32 -> input (the arithmetic: its numerics are verified before it is promoted)" in move.why


def test_a_dtype_never_moves_to_what_the_run_found_imprecise(tmp_path, monkeypatch):
    """rmsnorm's reversed first point had float16 accumulation, which the verification found imprecise: the
    tuning never proposes it again (the tuned candidate would fail, and its spill fix with it). Without that
    finding the dtype, one change and no step along a size, is tried before the smaller size."""
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    tiles = template(tmp_path, "  num_warps: {choices: [4, 8, 2]}", params="  BD: {choices: [32, 16]}\n"
                     "  ACC: {choices: [float32, float16]}\n  num_warps: {choices: [4]}")
    tried = []

    def probe(params, table, targets):  # spills at 32 (less in float16); spill-free at 16
        tried.append((params["BD"], params["ACC"]))
        spills = 0 if params["BD"] == 16 else 64 if params["ACC"] == "float16" else 128
        return {t: Figure(ok=True, spilled_bytes=spills if t.startswith("sm_") else 0, time_ms=1.0) for t in targets}

    start = {"BD": 32, "ACC": "float32", "num_warps": 4}
    outcome = Tuner(tiles, start, launch_table(tiles), TARGETS, probe, budget=8,
                    imprecise=[{**start, "ACC": "float16"}]).run()
    assert outcome.params == {"BD": 16, "ACC": "float32", "num_warps": 4}
    assert (32, "float16") not in tried and (16, "float16") not in tried
    tried.clear()
    Tuner(tiles, start, launch_table(tiles), TARGETS, probe, budget=8).run()
    assert list(dict.fromkeys(tried))[:2] == [(32, "float32"), (32, "float16")]


def test_a_point_the_spills_shrank_grows_back_while_spill_free_and_faster(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    two_tiles = template(tmp_path, "  num_stages: {choices: [null, 1]}", params="  BD: {choices: [128, 64, 32]}\n"
                         "  BN: {choices: [64, 32, 16]}\n  num_warps: {choices: [4]}")

    def probe(params, table, targets):  # NVIDIA spills past 4096 elements a tile; a larger tile is faster
        size = params["BD"] * params["BN"]
        return {t: Figure(ok=True, spilled_bytes=64 if t.startswith("sm_") and size > 4096 else 0,
                          time_ms=1000 / size) for t in targets}

    outcome = Tuner(two_tiles, {"BD": 128, "BN": 64, "num_warps": 4}, launch_table(two_tiles), TARGETS, probe,
                    budget=8).run()
    # the bold step (64 x 32) overshoots; BD grows back to 128 (spill-free, twice as fast); BN's growth is the
    # spilling point the search began at, not probed again
    assert outcome.params == {"BD": 128, "BN": 32, "num_warps": 4} and outcome.spill_free_on() == TARGETS
    grown = next(t for t in outcome.trials if t.params["BD"] == 128 and t.params["BN"] == 32)
    assert grown.moved and "growing it back: BD 64 -> 128" in grown.why
    # the probes that relieved the spill are not the speed search's: its budget of 8 is not what stopped it
    assert not any("budget" in reason for reason in outcome.stopped.values())


def test_a_size_the_time_does_not_see_grows_back_to_the_passing_points_on_a_tie(tmp_path, monkeypatch):
    """dsa_sparse_attention's reversed walk: the bold steps shrink the rows a program takes along with the tile
    that spilled; the rows change no modelled time, so they go back to the passing point's (the template's choice,
    and the interpreter's fastest to verify), while the tile stays where it is spill-free."""
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    rows_and_keys = template(tmp_path, "  num_stages: {choices: [null, 1]}", params="  BK: {choices: [128, 64, 32]}\n"
                             "  BM: {choices: [16, 4, 1]}\n  num_warps: {choices: [4]}")

    def probe(params, table, targets):  # NVIDIA spills past 32 keys a step, more with more rows; rows cost no time
        spill = 4 * params["BM"] if params["BK"] > 32 else 0
        return {t: Figure(ok=True, spilled_bytes=spill if t.startswith("sm_") else 0, time_ms=1000 / params["BK"])
                for t in targets}

    outcome = Tuner(rows_and_keys, {"BK": 128, "BM": 16, "num_warps": 4}, launch_table(rows_and_keys), TARGETS, probe,
                    budget=8).run()
    assert outcome.params == {"BK": 32, "BM": 16, "num_warps": 4} and outcome.spill_free_on() == TARGETS
    ties = [t for t in outcome.trials if "as fast, nearer the passing point" in t.why]
    assert [t.params["BM"] for t in ties if t.target == "sm_80"] == [4, 16] and all(t.moved for t in ties)
    # the faster growth of the keys spills and is not taken
    assert not any(t.moved for t in outcome.trials if t.params["BK"] == 64 and "growing it back" in t.why)


def test_a_point_the_shrink_passed_through_grows_back_at_the_settings_found_since(tmp_path, monkeypatch):
    """dsa_sparse_attention stayed at one row a program: the bold steps took its rows from 16 to 4 (spilling past a
    register file at the template's tiles) and to 1, where sm_90a's speed search chose a smaller tile; 4 rows were
    never probed again at that tile, where they spill nothing and cost no time, nor was sm_80's tile searched there."""
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    rows = template(tmp_path, "  tile: {choices: [16384, 8192]}", params="  BM: {choices: [16, 4, 1]}\n"
                    "  num_warps: {choices: [4]}")

    def probe(params, table, targets):  # more rows than one spill at the large tile; the rows cost no time
        def figure(target):
            tile = table.get(target, {}).get("tile", 16384)
            spill = 0 if params["BM"] == 1 or (tile == 8192 and params["BM"] <= 4) else 2048 * params["BM"]
            return Figure(ok=True, spilled_bytes=spill, time_ms=0.9 if target == "sm_90a" and tile == 8192 else 1.0)
        return {t: figure(t) for t in targets}

    outcome = Tuner(rows, {"BM": 16, "num_warps": 4}, lambda p: {"default": {"tile": 16384}}, ["sm_80", "sm_90a"],
                    probe, budget=8).run()
    assert outcome.params == {"BM": 4, "num_warps": 4}
    assert outcome.tuned == {"sm_80": {"tile": 8192}, "sm_90a": {"tile": 8192}}
    assert outcome.spill_free_on() == ["sm_80", "sm_90a"]
    grown = next(t for t in outcome.trials if t.params["BM"] == 4 and "growing it back" in t.why)
    assert "BM 1 -> 4" in grown.why and "spilling: its launch settings are searched" in grown.why


def test_a_point_the_shrink_passed_through_has_its_launch_settings_searched_when_it_grows_back(tmp_path,
                                                                                                 monkeypatch):
    """dsa_sparse_attention's case on one target: 4 rows spilled past a register file at the template's tile, so
    the shrink passed on to 1 row before any launch setting; growing back, 4 rows at a smaller tile spill nothing and
    cost no more time."""
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    rows = template(tmp_path, "  tile: {choices: [16384, 8192]}", params="  BM: {choices: [16, 4, 1]}\n"
                    "  num_warps: {choices: [4]}")

    def probe(params, table, targets):
        tile = table.get("sm_80", {}).get("tile", 16384)
        spill = 0 if params["BM"] == 1 or (tile == 8192 and params["BM"] <= 4) else 2048 * params["BM"]
        return {"sm_80": Figure(ok=True, spilled_bytes=spill, time_ms=1.0 + spill / 1000)}

    outcome = Tuner(rows, {"BM": 16, "num_warps": 4}, lambda p: {"default": {"tile": 16384}}, ["sm_80"], probe,
                    budget=8).run()
    assert outcome.params == {"BM": 4, "num_warps": 4} and outcome.tuned == {"sm_80": {"tile": 8192}}
    grown = [t for t in outcome.trials if "growing it back: BM 1 -> 4" in t.why]
    assert len(grown) == 1 and grown[0].why.endswith("(as probed before), spilling: its launch settings are searched")
    relieved = next(t for t in outcome.trials if t.params["BM"] == 4 and t.settings == {"tile": 8192})
    assert relieved.moved and relieved.figure.spilled_bytes == 0


def test_a_faster_point_that_spills_grows_back_where_its_launch_settings_relieve_it(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    two_tiles = template(tmp_path, "  num_warps: {choices: [4, 8, 2]}", params="  BD: {choices: [128, 64, 32]}\n"
                         "  BN: {choices: [64, 32, 16]}\n  num_warps: {choices: [4]}")

    def probe(params, table, targets):  # a warp holds 512 elements of the tile; a larger tile is faster
        def figure(target):
            warps = table.get(target, {}).get("num_warps", params["num_warps"])
            over = params["BD"] * params["BN"] - 512 * warps
            return Figure(ok=True, spilled_bytes=max(over, 0) if target.startswith("sm_") else 0,
                          time_ms=1000 / (params["BD"] * params["BN"]))
        return {t: figure(t) for t in targets}

    outcome = Tuner(two_tiles, {"BD": 128, "BN": 64, "num_warps": 4}, launch_table(two_tiles), TARGETS, probe,
                    budget=8).run()
    # 8 warps do not hold 128 x 64; 64 x 32 fits 4 warps; 128 x 32 spills at 4 warps but is faster, and 8 warps
    # hold it: the point grows back with NVIDIA's 8 warps
    assert outcome.params == {"BD": 128, "BN": 32, "num_warps": 4}
    assert outcome.tuned == {"sm_80": {"num_warps": 8}, "sm_90a": {"num_warps": 8}}
    assert outcome.spill_free_on() == TARGETS
    assert any("spilling: its launch settings are searched" in t.why for t in outcome.trials)


def test_a_spilling_figure_that_spills_less_is_better():
    assert Figure(ok=True, spilled_bytes=100, time_ms=2.0).better_than(Figure(ok=True, spilled_bytes=200, time_ms=1.0))
    assert not Figure(ok=True, spilled_bytes=199, time_ms=1.0).better_than(Figure(ok=True, spilled_bytes=200,
                                                                                  time_ms=1.0))  # within the tie
    assert Figure(ok=True, spilled_bytes=200, time_ms=0.5).better_than(Figure(ok=True, spilled_bytes=200,
                                                                              time_ms=1.0))


def test_a_target_still_spilling_when_nothing_is_left_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    fixed = template(tmp_path, "  num_stages: {choices: [null, 1]}", params="  BD: {choices: [128]}\n"
                                                                            "  num_warps: {choices: [4]}")
    outcome = Tuner(fixed, {"BD": 128, "num_warps": 4}, launch_table(fixed), TARGETS, FakeProbe(), budget=8).run()
    assert outcome.spill_free_on() == ["gfx942"]
    assert "still 255 registers, spills 96 B" in outcome.stopped["sm_80"]


def test_a_setting_that_does_not_compile_never_becomes_the_best():
    broken, fine = Figure(ok=False, error="out of resources"), Figure(ok=True, spilled_bytes=8, time_ms=9.0)
    assert fine.better_than(broken) and not broken.better_than(fine)
    assert Figure(ok=True, time_ms=9.0).better_than(fine)  # spill-free beats faster-but-spilling
    assert not Figure(ok=True, time_ms=0.995).better_than(Figure(ok=True, time_ms=1.0))  # within the tie


def test_a_measured_neighbour_moves_the_search_only_when_faster_past_both_spreads():
    best = Figure(ok=True, time_ms=5.0).timed({"time_ms": 1.0, "spread_ms": 0.05})
    assert best.measured and best.text() == "0 registers, spill-free, 1.0000 ms measured (spread 0.0500)"
    within = Figure(ok=True).timed({"time_ms": 0.92, "spread_ms": 0.05})  # 8% faster, inside the trials' noise
    past = Figure(ok=True).timed({"time_ms": 0.85, "spread_ms": 0.05})
    assert not within.better_than(best) and past.better_than(best) and not best.better_than(past)
    # a measurement that failed (wrong at the sizes timed, crashed, timed out) has no time: anything timed beats it
    failed = Figure(ok=True, time_ms=0.1).timed({"error": "timeout: no result"})
    assert failed.time_ms is None and "not measured (timeout: no result)" in failed.text()
    assert best.better_than(failed) and not failed.better_than(best)


def test_neighbours_step_along_value_order_whatever_the_preference_order(warps_and_stages):
    assert axis([4, 8, 2]) == [2, 4, 8] and axis([1, None, 3]) == [1, 3, None]
    moves = [m[1] for m in neighbours(warps_and_stages, {"num_warps": 4, "num_stages": None}, relieve=True)]
    # a spilling target: every relieving step at once, then each, then the rest
    assert moves == ["every setting one step toward fewer registers a thread: num_warps 4 -> 8, num_stages None -> 3",
                     "num_warps 4 -> 8", "num_stages None -> 3", "num_warps 4 -> 2"]
    assert [m[1] for m in neighbours(warps_and_stages, {"num_warps": 8, "num_stages": 1}, relieve=False)] == \
        ["num_warps 8 -> 4", "num_stages 1 -> 2"]
    table = {"default": {"num_warps": 4}, "cuda": {"num_warps": 8}, "sm_90a": {"num_warps": 2}}
    assert base_settings(table, "sm_80", ["num_warps"]) == {"num_warps": 8}
    assert base_settings(table, "sm_90a", ["num_warps"]) == {"num_warps": 2}
    assert base_settings(table, "gfx942", ["num_warps"]) == {"num_warps": 4}


def test_triton_s_own_stages_stand_where_they_compile_on_each_target(warps_and_stages):
    """None in a stages setting compiles as Triton's own stages: 3 on NVIDIA, 2 on AMD. The attention's port stepped
    sm_80's dK/dV stages "None -> 3", the same compile, as its step toward fewer registers (and on AMD that step
    adds a stage). None stands in place of the number it compiles as."""
    assert axis([None, 1, 2, 3], "num_stages", "sm_80") == [1, 2, None]
    assert axis([None, 1, 2, 3], "num_stages", "gfx942") == [1, None, 3]
    assert axis([1, 2, None, 3], "state_stages", "gfx942") == [1, None, 3]
    assert axis([None, 128, 168], "bwd_maxnreg", "sm_80") == [128, 168, None]  # no cap: the top
    at_own = {"num_warps": 4, "num_stages": None}
    assert [m[1] for m in neighbours(warps_and_stages, at_own, relieve=True, target="sm_80")] == [
        "every setting one step toward fewer registers a thread: num_warps 4 -> 8, num_stages None -> 2",
        "num_warps 4 -> 8", "num_stages None -> 2", "num_warps 4 -> 2"]
    assert [m[1] for m in neighbours(warps_and_stages, at_own, relieve=True, target="gfx942")] == [
        "every setting one step toward fewer registers a thread: num_warps 4 -> 8, num_stages None -> 1",
        "num_warps 4 -> 8", "num_stages None -> 1", "num_warps 4 -> 2", "num_stages None -> 3"]
    # the number None stands for steps as None
    assert [m[1] for m in neighbours(warps_and_stages, {"num_warps": 4, "num_stages": 3}, relieve=False,
                                     target="sm_80")] == ["num_warps 4 -> 2", "num_warps 4 -> 8", "num_stages 3 -> 2"]
    assert [m[1] for m in neighbours(warps_and_stages, {"num_warps": 4, "num_stages": 1}, relieve=False,
                                     target="gfx942")][-1] == "num_stages 1 -> None"


def test_a_probe_fails_only_the_target_whose_compile_failed_and_a_sandbox_verdict_fails_every_target():
    """A launch that does not compile in time on sm_80 is sm_80's figure, not gfx942's (the report's verdict is
    the target compile error of one of them); a spill at the smoke suite captured for gfx942 is gfx942's; a
    candidate the sandbox refused has no figure anywhere."""
    from workbench.agent.tune import probe_figures
    from workbench.verify.result import VerificationResult
    from workbench.vocabulary import Verdict

    def build(target, ok=True, spilled=0, suite="model"):
        return {"target": target, "suite": suite, "ok": ok, "spilled_bytes": spilled if ok else None,
                "registers": 128 if ok else None, "error": "" if ok else "compiler did not finish within 60 s"}
    builds = [build("sm_80"), build("sm_80", ok=False), build("gfx942", spilled=8, suite="capture:smoke"),
              build("gfx942"), build("sm_90a", ok=False, suite="edge"), build("sm_90a", spilled=24, suite="smoke"),
              build("sm_90a")]
    report = VerificationResult(block="b", candidate="c", source_hash="h", backend="capture",
                                verdict=Verdict.TARGET_COMPILE_ERROR, message="sm_80: k: did not finish", builds=builds)
    figures = probe_figures(report, ["sm_80", "sm_90a", "gfx942", "gfx950"], {"gfx942": {"time_ms": 2.0}})
    assert not figures["sm_80"].ok and figures["sm_80"].error == "compiler did not finish within 60 s"
    # the interpreter's launches (suites smoke, edge) are not the target's: neither their failure nor their spill
    assert figures["sm_90a"].ok and figures["sm_90a"].spilled_bytes == 0
    # the smoke suite captured for the target counts: its spill is the target's (at the smoke suite alone: the
    # port's own budget), its time the model suite's
    assert (figures["gfx942"].ok, figures["gfx942"].spilled_bytes, figures["gfx942"].time_ms) == (True, 8, 2.0)
    assert figures["gfx942"].smoke_only and not figures["gfx942"].at_model
    assert figures["gfx950"].error == "no model-suite launch captured"
    report.verdict, report.message = Verdict.TIMEOUT, "the capture did not finish"
    assert [f.error for f in probe_figures(report, ["sm_90a", "gfx942"], {}).values()] == \
        ["the capture did not finish"] * 2
