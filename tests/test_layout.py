"""The layout planner (workbench/layout, `workbench layout`): the model read from a card adds up to the card's weights
and the published totals; each kind of per-card memory and traffic follows from the layout the way its formula says
(held on hand-computed cases); Kimi K3.1 Pro's LoRA under FSDP2 + EP64 on 128 cards fits an H200 while expert data
parallelism does not; a balanced pipeline split is never slower than the uniform one and moves layers off the stage
that holds the loss head; bad input is one line. The plan held to a replay's measured memory is tested beside the
distributed replays (tests/replay/test_replay_layout.py)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.errors import WorkbenchError
from workbench.layout import compare_experts, from_card, from_replay, plan_layout
from workbench.layout.plan import GB, Layer, parse_layout
from workbench.models import get_model
from workbench.weights import BYTES_PER_WEIGHT

MODEL = "kimi-k3.1-pro"
runner = CliRunner()


@pytest.fixture(scope="module")
def k31():
    return from_card(MODEL)


def test_the_model_adds_up_to_the_cards_weights_and_the_published_totals(k31):
    card = get_model(MODEL).weights
    assert abs(k31.params - card["params"]) < len(k31.layers)  # parts spread over the layers, rounded per layer
    weights = k31.weight_bytes()
    assert weights["stored"] == pytest.approx(card["bytes_published"], rel=1e-9)
    assert 5.5e12 < weights["bf16"] < 5.7e12  # "about 5.6 TB of bf16 weights"
    assert 1.35e12 < weights["4bit"] < 1.45e12  # "about 1.4 TB at 4 bits"
    assert sum(layer.expert_params for layer in k31.layers) == 92 * 896 * 3 * 3584 * 3072
    assert k31.expert_format == "mxfp4" and k31.experts == 896 and k31.active == 16
    assert [layer.kind for layer in k31.layers].count("K") == get_model(MODEL).facts["kda_layers"]["value"]


def test_lora_under_fsdp2_ep64_on_128_cards_fits_an_h200_and_sums_to_the_model(k31):
    plan = plan_layout(k31, 128, "fsdp2+ep64", lora=64)
    assert plan.fits and plan.expert_parallel == 64 and plan.mode == "lora"
    stage = plan.stages[0]
    experts = sum(layer.expert_params for layer in k31.layers)
    dense = k31.params - experts
    adapters = sum(layer.adapters for layer in k31.layers) * 64
    # every card: its 1/64 of the experts (two replicas over 128 cards) in MXFP4, its 1/128 of the dense weights in
    # bf16, its shard of the fp32 adapters
    base = experts / 64 * BYTES_PER_WEIGHT["mxfp4"] + dense / 128 * 2
    assert stage.memory["weights"] == pytest.approx(base + 4 * adapters / 128, rel=1e-9)
    assert stage.memory["gradients"] == pytest.approx(4 * adapters / 128, rel=1e-9)
    assert stage.memory["optimizer"] == pytest.approx(2 * stage.memory["gradients"], rel=1e-12)
    assert 0 < stage.memory["activations"] < plan.hbm_gb * GB - stage.hbm + stage.memory["activations"]
    assert stage.hbm < 141 * GB and stage.host == 0
    sent = stage.sent
    routed = [layer for layer in k31.layers if layer.expert_params]
    expected = sum(4 * k31.tokens * 16 * 63 / 64 * layer.routed_width * 2 for layer in routed)
    assert sent["all_to_all"] == pytest.approx(expected, rel=1e-12)
    assert sent["all_gather"] == pytest.approx(2 * 127 / 128 * dense * 2, rel=1e-9)
    assert sent["reduce_scatter"] == pytest.approx(127 / 128 * adapters * 4, rel=1e-9)
    assert sent["expert_all_reduce"] == 0 and sent["pipeline"] == 0  # frozen experts; no pipeline


def test_expert_data_parallelism_does_not_fit_where_expert_parallelism_does(k31):
    plan = plan_layout(k31, 128, "fsdp2+ep64", lora=64)
    ep64, edp, ep128 = compare_experts(k31, plan, lora=64)
    assert (edp.layout, ep128.layout) == ("fsdp2+edp", "fsdp2+ep128")
    assert not edp.fits and edp.stages[0].sent["all_to_all"] == 0
    assert edp.stages[0].memory["weights"] > 1e12  # every routed expert on every card
    assert ep128.stages[0].hbm < ep64.stages[0].hbm
    ratio = ep128.stages[0].sent["all_to_all"] / ep64.stages[0].sent["all_to_all"]
    assert ratio == pytest.approx((127 / 128) / (63 / 64))
    # a full fine-tune trains the experts: their gradients are all-reduced over the two replicas of ep64
    full = plan_layout(k31, 128, "fsdp2+ep64")
    assert full.stages[0].sent["expert_all_reduce"] > 0 and not full.fits


def test_recomputation_and_caching_move_the_activations_where_they_say(k31):
    kept = plan_layout(k31, 128, "fsdp2+ep64", lora=64, recompute="none")
    recomputed = plan_layout(k31, 128, "fsdp2+ep64", lora=64)
    assert kept.stages[0].memory["activations"] > 10 * recomputed.stages[0].memory["activations"]
    assert not kept.fits and recomputed.fits
    gemm = sum(layer.saved.get("moe_grouped_gemm", 0) for layer in k31.layers) * k31.tokens
    host = plan_layout(k31, 128, "fsdp2+ep64", lora=64, recompute="none", cache={"moe_grouped_gemm": "host"})
    assert host.stages[0].host == pytest.approx(gemm)
    assert kept.stages[0].memory["activations"] - host.stages[0].memory["activations"] == pytest.approx(gemm)
    # with recomputation a block cached in HBM keeps its tensors there instead of being recomputed
    hbm = plan_layout(k31, 128, "fsdp2+ep64", lora=64, cache={"moe_grouped_gemm": "hbm"})
    extra = hbm.stages[0].memory["activations"] - recomputed.stages[0].memory["activations"]
    assert extra == pytest.approx(gemm, rel=0.01)


def test_a_balanced_pipeline_is_never_slower_than_the_uniform_one(k31):
    for pp in (2, 4):
        uniform = plan_layout(k31, 128, "fsdp2+ep16", lora=64, pipeline=pp, split="uniform")
        balanced = plan_layout(k31, 128, "fsdp2+ep16", lora=64, pipeline=pp, split="balanced")
        assert balanced.fits
        assert max(s.flops for s in balanced.stages) <= max(s.flops for s in uniform.stages)
        for plan in (uniform, balanced):
            assert plan.stages[0].first == 0 and plan.stages[-1].last == len(k31.layers)
            assert all(a.last == b.first for a, b in zip(plan.stages, plan.stages[1:], strict=False))
            assert plan.stages[0].sent["pipeline"] > 0 and plan.bubble == pytest.approx((pp - 1) / (3 * pp - 1))


def test_a_heavy_loss_head_moves_layers_off_the_last_stage():
    """Skywork-MoE's case: the last stage carries the head and the loss; the uniform split leaves it the slowest,
    the balanced one gives it fewer layers and a shorter step."""
    model = from_replay(MODEL, "tiny", 2)
    layer = model.layers[0]
    layers = tuple(replace(layer, flops=1e6) for _ in range(8))
    model = replace(model, layers=layers, head_flops=4e6)
    uniform = plan_layout(model, 4, "fsdp2+ep2", pipeline=2, split="uniform")
    balanced = plan_layout(model, 4, "fsdp2+ep2", pipeline=2, split="balanced")
    assert [s.last - s.first for s in uniform.stages] == [4, 4]
    assert [s.last - s.first for s in balanced.stages] == [6, 2]  # 6 layers vs 2 layers and a head as heavy as 4
    assert balanced.step_floor_s < uniform.step_floor_s * 0.8


def test_the_balanced_split_respects_memory_before_compute():
    model = from_replay(MODEL, "tiny", 2)
    heavy = replace(model.layers[0], flops=1e6, saved={"kda": 1e6})
    light = replace(model.layers[0], flops=1e6, saved={"kda": 1.0})
    model = replace(model, layers=(heavy, heavy, light, light, light, light), head_flops=0.0)
    free = plan_layout(model, 2, "fsdp2+ep1", pipeline=2, recompute="none", micro_batches=2)
    assert [s.last - s.first for s in free.stages] == [3, 3]
    budget = (free.stages[0].hbm - 1e6 * model.tokens) / GB  # the first stage cannot hold both heavy layers
    tight = plan_layout(model, 2, "fsdp2+ep1", pipeline=2, recompute="none", micro_batches=2, hbm_gb=budget)
    assert tight.fits and [s.last - s.first for s in tight.stages] == [1, 5]


@pytest.mark.parametrize("layout, cards, pp, message", [
    ("fsdp2+tp8", 8, 1, "unknown layout 'fsdp2+tp8'"),
    ("fsdp2+ep8", 12, 1, "expert parallel 8 does not divide the 12 cards of a stage"),
    ("fsdp2+ep8", 16, 3, "16 cards do not split into 3 pipeline stages"),
    ("fsdp2+ep6", 12, 1, "896 routed experts do not split over 6 cards"),
])
def test_a_layout_that_does_not_split_is_one_line(layout, cards, pp, message):
    with pytest.raises(WorkbenchError, match=re.escape(message)):
        parse_layout(layout, cards, pp, 896)


def test_the_command_prints_the_tables_and_json(k31):
    result = runner.invoke(app, ["layout", MODEL, "--cards", "128", "--layout", "fsdp2+ep64", "--lora", "0"],
                           terminal_width=200)
    assert result.exit_code == 0, result.output
    text = result.output
    assert "2,779.5B parameters; weights 5,558.97 GB in bf16, 1,559.94 GB as stored" in text
    assert "LoRA r=64" in text and "Memory per card, GB (modelled; HBM 141 GB" in text
    assert "Sent per card per step, GB (modelled)" in text and "fsdp2+edp" in text and "modelled from card" in text
    data = json.loads(runner.invoke(app, ["layout", MODEL, "--cards", "128", "--layout", "fsdp2+ep16", "--lora",
                                          "64", "--pp", "4", "--json"]).output)
    assert data["params"] == k31.params and data["plan"]["lora_rank"] == 64 and len(data["plan"]["stages"]) == 4
    assert [p["split"] for p in data["splits"]] == ["uniform", "balanced"]
    assert [p["layout"] for p in data["experts"]] == ["fsdp2+ep16", "fsdp2+edp", "fsdp2+ep32"]  # 32 cards a stage
    assert all(p["fits"] in (True, False) for p in data["experts"]) and data["against"] == []


@pytest.mark.parametrize("args, message", [
    (["no-such-model"], "no-such-model"),
    ([MODEL, "--layout", "ep64"], "unknown layout 'ep64'"),
    ([MODEL, "--cache", "kda"], "bad --cache 'kda'"),
    ([MODEL, "--cache", "nothing:host"], "saves nothing in a block 'nothing'"),
    ([MODEL, "--cache", "kda:disk"], "the tier is hbm or host"),
    ([MODEL, "--recompute", "some"], "unknown --recompute 'some'"),
    ([MODEL, "--target", "sm_42"], "unknown target 'sm_42'"),
    ([MODEL, "--against", "7", "--db", "sqlite://"], "no replay #7"),
])
def test_bad_input_is_one_line(args, message):
    result = runner.invoke(app, ["layout", *args])
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output


def test_the_replay_model_is_counted_from_its_modules():
    """The tiny replay model, float32 throughout: the planner's weights are the parameters of the module as FSDP2
    holds them over the ranks."""
    import torch

    from workbench.replay.arch import architecture
    from workbench.replay.model import replay_model
    from workbench.replay.presets import get_preset

    preset = get_preset("tiny")
    with torch.device("meta"):
        module = replay_model(preset, architecture(MODEL, preset.layers))
    model = from_replay(MODEL, "tiny", 2)
    assert model.params == sum(p.numel() for p in module.parameters()) + 5 * preset.hidden  # over 2 ranks, FSDP2
    # pads each [1, D] AttnRes pseudo-query (two a layer and the final one) to a row a rank
    assert model.tokens == preset.tokens_per_step // 2 and model.dense_format == "float32"
    assert isinstance(model.layers[0], Layer) and model.layers[0].expert_params == 0  # K3's dense first layer
    assert model.layers[-1].expert_params > 0
