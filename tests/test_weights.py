"""The weights model (workbench/weights.py) held to transformers: for each published config whose class reads every
field the formulas use, the count equals the parameters of the class built on the meta device; Kimi K3's count
against its published figures (about 2.8T parameters, about 5.6 TB in bfloat16); the card's section and the plan."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from test_onboard import DEEPSEEK_V3, DEEPSEEK_V32, LLAMA, MIXTRAL, SHARED, write

from workbench.onboard import onboard
from workbench.weights import BYTES_PER_WEIGHT


def _transformers_parameters(config: dict) -> int:
    """Parameters of the config's transformers class, built on the meta device (no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())


@pytest.mark.parametrize("name", ["kimi-linear-48b-a3b", "deepseek-v3", "deepseek-v3.2", "llama", "mixtral"])
def test_counts_equal_the_transformers_class(tmp_path, name):
    config = {"kimi-linear-48b-a3b": lambda: json.loads((SHARED / "kimi-linear-48b-a3b.config.json").read_text()),
              "deepseek-v3": lambda: DEEPSEEK_V3, "deepseek-v3.2": lambda: DEEPSEEK_V32, "llama": lambda: LLAMA,
              "mixtral": lambda: MIXTRAL}[name]()
    weights = onboard(write(tmp_path, config))["weights"]
    assert weights["params"] == _transformers_parameters(config)
    assert weights["params"] == sum(part["params"] for part in weights["parts"].values())
    if name == "deepseek-v3":
        assert round(weights["params"] / 1e9) == 671  # the published figure
        assert weights["uncounted"] == ["1 multi-token-prediction layer(s) (num_nextn_predict_layers; published "
                                        "totals leave them out too)"]


def test_kimi_k3_against_its_published_figures():
    """About 2.8T parameters (5.6 TB in bfloat16); the routed experts, 98% of them, ship in MXFP4 at 4.25 bits."""
    weights = onboard(SHARED / "kimi-k3.config.json")["weights"]
    parts = weights["parts"]
    assert 2.75e12 < weights["params"] < 2.85e12 and 5.5e12 < weights["bytes_bf16"] < 5.7e12
    experts = parts["routed_experts"]
    assert experts["format"] == "mxfp4" and experts["params"] == 92 * 896 * 3 * 3584 * 3072
    assert {p["format"] for name, p in parts.items() if name != "routed_experts"} == {"bf16"}
    rest = weights["params"] - experts["params"]
    assert weights["bytes_published"] == round(experts["params"] * BYTES_PER_WEIGHT["mxfp4"] + rest * 2)
    assert 1.5e12 < weights["bytes_published"] < 1.6e12  # 4 bits alone would be 1.39 TB; scales and bf16 parts
    assert "combined routed output" in parts["latent_projections"]["note"]
    assert weights["uncounted"] == ["the vision tower (vision_config)"]  # AttnRes's vectors counted now
    assert parts["attnres"]["params"] == 7168 * (4 * 93 + 2)


def test_kimi_k3_equals_its_model_built_from_the_published_code():
    """The count equals the parameters of workbench.kimi_k3's model (K3's published serving code) built from the
    config on the meta device, part by part where the names say which: the KDA layers with a low-rank forget gate
    (f_a_proj [128, 7168], f_b_proj [12288, 128]) and a full-rank output gate (g_proj [12288, 7168]), AttnRes's
    pseudo-queries and key norms, the latent projections with the norm of the combined routed output."""
    from workbench.kimi_k3 import KimiK3Config, KimiK3ForCausalLM

    data = json.loads((SHARED / "kimi-k3.config.json").read_text())
    weights = onboard(SHARED / "kimi-k3.config.json")["weights"]
    with torch.device("meta"):
        model = KimiK3ForCausalLM(KimiK3Config.from_published(data))
    named = dict(model.named_parameters())
    assert weights["params"] == sum(p.numel() for p in named.values())
    kda = model.model.layers[0].self_attn
    assert (kda.f_a_proj.weight.shape, kda.f_b_proj.weight.shape, kda.g_proj.weight.shape) == \
        ((128, 7168), (96 * 128, 128), (96 * 128, 7168))
    assert not hasattr(kda, "g_a_proj")  # use_full_rank_gate: the output gate is full rank
    kda_prefixes = tuple(f"model.layers.{i}.self_attn." for i, kind in enumerate(model.config.layer_kinds)
                         if kind == "K")
    assert weights["parts"]["kda_attention"]["params"] == sum(
        p.numel() for n, p in named.items() if n.startswith(kda_prefixes))
    assert weights["parts"]["attnres"]["params"] == sum(p.numel() for n, p in named.items() if "_res_" in n)
    assert weights["parts"]["latent_projections"]["params"] == sum(
        p.numel() for n, p in named.items() if "routed_expert_" in n)


def test_the_card_and_the_plan_show_the_weights(settings):
    from typer.testing import CliRunner

    from workbench.cli import app
    from workbench.models import get_model

    base, derived = get_model("kimi-k3"), get_model("kimi-k3.1-pro")
    assert base.weights == onboard(SHARED / "kimi-k3.config.json")["weights"]
    assert derived.weights == base.weights  # inherited
    runner = CliRunner()
    plan = json.loads(runner.invoke(app, ["plan", "kimi-k3", "--json"]).output)
    assert plan["weights"]["params"] == base.weights["params"]
    text = runner.invoke(app, ["plan", "kimi-k3.1-pro"]).output.replace("\n", " ")
    assert "Weights (modelled from the config): 2,779B parameters, 5.56 TB in bfloat16, 1.56 TB as published" in text
    assert "the kimi-k3 card's count" in text
