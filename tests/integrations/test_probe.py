"""Onboarding by probe (workbench.integrations.probe, kinds, tiny): families transformers ships, thirteen the
workbench has no integration for and the seven it has, onboarded from their config classes' defaults as a new user
would: every module class of the full model has exactly one row, the claims are what the family's code computes
(measured in float64 against the references), a variant the catalog lacks is named with its measured distance, and
the hand-written integrations lose nothing. bench/onboard_probe.py prints the table."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import CONFIG_MAPPING
from typer.testing import CliRunner

from workbench.cli import app
from workbench.errors import WorkbenchError
from workbench.integrations import kinds as K
from workbench.integrations import probe as P
from workbench.integrations import tiny as T
from workbench.onboard import onboard

UNREGISTERED = ("glm4_moe", "ernie4_5_moe", "minimax_m2", "gpt_oss", "mixtral", "qwen3_moe", "deepseek_v4",
                "longcat_flash", "olmoe", "exaone_moe", "solar_open", "bailing_hybrid", "hy_v4")
REGISTERED = ("deepseek_v3", "deepseek_v32", "glm5_next", "glm_moe_dsa", "inkling2", "kimi_linear", "qwen3_next")
runner = CliRunner()


@pytest.fixture(scope="module")
def cards() -> dict[str, dict]:
    """Every family's card, onboarded once for the module (about 20 s for the twenty on two cores)."""
    return {model_type: onboard(model_type) for model_type in UNREGISTERED + REGISTERED}


def rows(card: dict) -> dict[str, dict]:
    return {m["cls"]: m for m in card["transformers"]["modules"]}


def full_model_classes(model_type: str) -> list[str]:
    """Every module class of the family's full model (built on the meta device, independently of the probe)."""
    return [type(m).__name__ for m in T.build(CONFIG_MAPPING[model_type](), whole=True).modules()]


@pytest.mark.parametrize("model_type", UNREGISTERED + REGISTERED)
def test_every_module_class_has_exactly_one_row(cards, model_type):
    card = cards[model_type]
    listed = [m["cls"] for m in card["transformers"]["modules"]]
    assert len(listed) == len(set(listed))
    assert set(full_model_classes(model_type)) <= set(listed)  # nothing the model computes is missing
    for row in card["transformers"]["modules"]:
        assert row["status"] in P.STATUSES, row
        if row["status"] == P.COVERED and "within" not in row:
            assert row["error"]["output"] <= P.PROBE_REL_MAX and row["error"]["grad"] <= P.PROBE_REL_MAX, row
    for block, info in card["blocks"].items():  # every claim says what proves it, or how it differs
        assert "gap" in info or "evidence" in info or "differs" in info, block


def test_routers_are_read_from_the_code_whatever_the_fields_are_called(cards):
    # GLM-4.5: no scoring_func field, a correction bias on the router: sigmoid (a field reading gave softmax)
    glm = rows(cards["glm4_moe"])["Glm4MoeTopkRouter"]
    assert glm["status"] == "covered" and glm["params"]["score"]["value"] == "sigmoid"
    assert cards["glm4_moe"]["blocks"]["moe_router"]["shapes"][0]["mode"] == 0  # sigmoid + renormalize
    # MiniMax-M2: the bias lives on the MoE block and is passed to the router's forward
    minimax = rows(cards["minimax_m2"])["MiniMaxM2TopKRouter"]["params"]
    assert (minimax["score"]["value"], minimax["bias"]["value"]) == ("sigmoid", "argument")
    # ERNIE 4.5: softmax scores, the selection bias on a child module (its "statics")
    ernie = rows(cards["ernie4_5_moe"])
    assert ernie["Ernie4_5_MoeTopKRouter"]["params"]["score"]["value"] == "softmax"
    assert ernie["Ernie4_5_MoeTopKRouter"]["params"]["bias"]["value"] == "child moe_statics"
    assert ernie["Ernie4_5_MoeStatics"]["within"] == ["Ernie4_5_MoeTopKRouter"]
    # EXAONE-MoE: the config's route scale, read from the class (the json has no such field)
    exaone = rows(cards["exaone_moe"])["ExaoneMoeTopkRouter"]["params"]["scale"]
    assert exaone == {"value": 2.5, "source": "module ExaoneMoeTopkRouter.routed_scaling_factor"}
    assert cards["exaone_moe"]["facts"]["route_scale"]["source"] == "probe"
    # Qwen3-MoE's default does not renormalize: the probe says so (moe_router has no such softmax mode)
    qwen = rows(cards["qwen3_moe"])["Qwen3MoeTopKRouter"]
    assert qwen["status"] == "covered" and qwen["params"]["renormalize"]["value"] is False


def test_variants_the_catalog_lacks_are_named_with_their_measured_distance(cards):
    v4 = rows(cards["deepseek_v4"])
    # clamped SwiGLU, measured on inputs that reach the clamp: swiglu's and moe_grouped_gemm's clamped variant
    for cls in ("DeepseekV4MLP", "DeepseekV4Experts"):
        assert v4[cls]["status"] == "covered" and v4[cls]["params"]["limit"] == {"value": 10.0,
                                                                                 "source": f"module {cls}.limit"}
        assert max(v4[cls]["error"].values()) < 1e-10
    router = v4["DeepseekV4TopKRouter"]  # sqrt(softplus) scores: moe_router's mode 4, read from the config
    assert router["status"] == "covered" and router["params"]["score"]["value"] == "sqrtsoftplus"
    assert max(router["error"].values()) < 1e-10
    assert v4["DeepseekV4HashRouter"]["status"] == "no spec" and "gap" in cards["deepseek_v4"]["blocks"]["hash_router"]
    # mHC (Sinkhorn-normalised comb) through hyper_connection; HY-V4's pre/post-only form is another variant
    hc = v4["DeepseekV4HyperConnection"]
    assert hc["status"] == "covered" and hc["blocks"] == ["hyper_connection"] and max(hc["error"].values()) < 1e-10
    assert hc["params"]["sinkhorn_iters"] == {"value": 20,
                                              "source": "module DeepseekV4HyperConnection.hc_sinkhorn_iters"}
    assert "evidence" in cards["deepseek_v4"]["blocks"]["hyper_connection"]
    # each sub-layer's expand and mix, a step of the decoder layer's forward: proven by the hyper_connected_layer kind,
    # which computes the layer with that step swapped
    layer = v4["DeepseekV4DecoderLayer"]
    assert layer["status"] == "covered" and layer["blocks"] == ["hyper_connection_mix"]
    assert max(layer["error"].values()) < 1e-10 and layer["params"]["mlp_input_ids"]["value"] is True  # hash routing
    mix = cards["deepseek_v4"]["blocks"]["hyper_connection_mix"]
    assert mix["evidence"].startswith("probe: DeepseekV4DecoderLayer") and "differs" not in mix
    glm5_mix = cards["glm5_next"]["blocks"]["hyper_connection_mix"]  # proven through the family's layer patch
    assert glm5_mix["evidence"].startswith("probe: Glm5NextTextDecoderLayer")
    assert rows(cards["hy_v4"])["HYV4HyperConnection"]["status"] == "no spec"
    assert "HY-V4" in cards["hy_v4"]["blocks"]["hyper_connection"]["differs"]
    oss = rows(cards["gpt_oss"])
    assert oss["GptOssTopKRouter"]["status"] == "differs" and "bias" in oss["GptOssTopKRouter"]["differs"]
    assert oss["GptOssExperts"]["status"] == "no spec" and "has_bias" in oss["GptOssExperts"]["differs"]
    attention = oss["GptOssAttention"]  # learnt per-head sinks and a sliding window: the attention block's variant
    assert attention["status"] == "covered" and attention["blocks"] == ["attention", "rotary"]
    assert attention["params"]["rotary_table"]["value"] == "doubled"  # GPT-OSS's half-width angle table
    assert rows(cards["ernie4_5_moe"])["Ernie4_5_MoeAttention"]["blocks"] == ["attention"]  # interleaved pairs kept
    assert attention["params"]["sinks"]["value"] == "per head" and attention["params"]["window"]["value"] > 0
    assert "differs" in cards["gpt_oss"]["blocks"]["moe_grouped_gemm"]  # not claimed as plain SwiGLU experts


@pytest.mark.parametrize("model_type, indexer, attention", [
    ("deepseek_v32", "DeepseekV32Indexer", "DeepseekV32Attention"),
    ("glm_moe_dsa", "GlmMoeDsaIndexer", "GlmMoeDsaAttention"),
    ("glm5_next", "Glm5NextTextIndexer", "Glm5NextTextAttention")])
def test_an_indexer_the_patched_attention_computes_takes_its_status(cards, model_type, indexer, attention):
    """The DSA families' patches compute the indexer on its projections (dsa_indexer, dsa_kpool_indexer) without
    calling its forward: its row is the attention's, not a gap; GLM-5-Next's k-pool card has no dsa_indexer."""
    row = rows(cards[model_type])[indexer]
    assert row["status"] == "covered" and row["within"] == [attention], row
    assert f"computed by the patched {attention}" in row["role"]
    assert not any("indexer" in b for b, info in cards[model_type]["blocks"].items() if "gap" in info)
    if model_type == "glm5_next":
        assert "dsa_kpool_indexer" in cards[model_type]["blocks"]
        assert not {"dsa_indexer", "dsa_indexer_decode", "dsa_indexer_prefill"} & set(cards[model_type]["blocks"])


def test_an_nn_layernorm_is_covered_by_the_layernorm_kind_with_its_own_eps(cards):
    """HY-V4's indexer key norm is torch's nn.LayerNorm (eps 1e-5, not the DSA families' 1e-6): the layernorm kind
    reads it and the probe proves it; the card's layernorm entry is evidenced by that row."""
    norm = rows(cards["hy_v4"])["LayerNorm"]
    assert norm["status"] == "covered" and norm["kind"] == "layernorm" and norm["blocks"] == ["layernorm"]
    assert norm["params"]["eps"]["value"] == 1e-5 and norm["example"].endswith("indexer.k_norm")
    assert cards["hy_v4"]["blocks"]["layernorm"]["evidence"].startswith("probe: LayerNorm (weight and bias)")


def test_a_swiglu_limit_is_claimed_where_the_module_clamps_and_only_there(cards):
    """HY-V4's config sets swiglu_limit: its experts clamp, its MLP does not; the probe keeps the clamped variant for
    the one and the unclamped for the other, and the card's grouped GEMM has the limit and its swiglu none;
    DeepSeek-V4's MLP clamps at its own limit, and the card says so."""
    hy, v4 = rows(cards["hy_v4"])["HYV4MLP"], rows(cards["deepseek_v4"])["DeepseekV4MLP"]
    assert rows(cards["hy_v4"])["HYV4Experts"]["params"]["limit"]["value"] == 10.0  # its experts do clamp
    assert all(shape["limit"] == 10 for shape in cards["hy_v4"]["blocks"]["moe_grouped_gemm"]["shapes"])
    assert hy["status"] == "covered" and hy["params"]["limit"] == {"value": None, "source": "probe: no clamp"}
    assert all("limit" not in shape for shape in cards["hy_v4"]["blocks"]["swiglu"]["shapes"])
    assert v4["params"]["limit"]["value"] == 10.0
    assert all(shape["limit"] == 10 for shape in cards["deepseek_v4"]["blocks"]["swiglu"]["shapes"])
    assert "clamped at 10.0" in cards["deepseek_v4"]["blocks"]["swiglu"]["role"]


def test_a_hybrid_family_never_seen_is_covered_by_the_generic_kinds(cards):
    bailing = rows(cards["bailing_hybrid"])
    assert bailing["BailingHybridDeltaAttention"]["status"] == "covered"
    assert bailing["BailingHybridDeltaAttention"]["blocks"] == ["kda_short_conv", "kda", "kda_prologue"]
    gate = bailing["BailingHybridForgetGate"]
    assert gate["status"] == "covered" and gate["params"]["lower_bound"]["value"] == -5.0
    assert bailing["BailingHybridAttention"]["status"] == "no spec"  # MLA with a head-wise output gate
    assert "no module of BailingHybridForCausalLM computes mla" in cards["bailing_hybrid"]["blocks"]["mla"]["differs"]
    assert "linear_attention" not in cards["bailing_hybrid"]["blocks"]  # no spurious layer_types gap


@pytest.mark.parametrize("model_type", REGISTERED)
def test_the_registered_integrations_lose_nothing(cards, model_type):
    """Every module class a hand-written family swaps is proven by the probe (its forward, through the references,
    reproduces the shipped module)."""
    from bench.onboard_probe import family_swaps

    covered = {cls for cls, row in rows(cards[model_type]).items() if row["status"] == "covered"}
    assert family_swaps(model_type) <= covered


def test_the_probe_can_fail():
    """A measurement, not a formality: a plain RMSNorm held to the zero-centred variant, and a sigmoid router held
    to softmax scores, are far off."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(16).double()
    norm.weight.data += 0.1 * torch.randn(16, dtype=torch.float64)
    plain, centred = K._rmsnorm_variants(norm, None)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    from workbench.integrations.ops import computing_with, references

    with computing_with(references()):
        K.install(norm, plain, ("rmsnorm",))
        assert P.within_bound(P.measure(norm, (x,), {}, norm.original_forward, norm.forward))
        K.install(norm, centred, ("rmsnorm",))
        assert P.measure(norm, (x,), {}, norm.original_forward, norm.forward)["output"] > 1e-2
        K.uninstall(norm)
    assert norm.forward == norm.original_forward if hasattr(norm, "original_forward") else True


def test_a_registered_familys_attention_is_held_to_the_implementation_it_shipped_with(cards, monkeypatch):
    """A family whose patch makes the model's attention implementation the workbench's (Qwen3-Next's through the
    registry, Inkling2's own forward) is measured against its shipped forward under the implementation it was
    recorded with (eager), not against the block itself: Inkling2's sliding and full attention (per-token sinks,
    relative logits) are proven, and a look-alike attention (scale 1 % off) fails both families' rows."""
    import transformers.models.inkling2.configuration_inkling2  # noqa: F401 - the class CONFIG_MAPPING names

    from workbench.blocks.attention import reference
    from workbench.integrations import ops

    inkling2 = rows(cards["inkling2"])
    for cls in ("Inkling2SlidingAttention", "Inkling2FullAttention"):
        assert inkling2[cls]["status"] == "covered" and inkling2[cls]["blocks"] == ["attention", "l2_clip",
                                                                                   "rmsnorm"], inkling2[cls]
    assert "evidence" in cards["inkling2"]["blocks"]["attention"]
    assert "differs" in cards["inkling2"]["blocks"]["attention_decode"]  # per head sinks, no relative logits there
    table = ops.references()

    def look_alike(q, k, v, sinks, scale, window, softcap, rel=None):
        return reference(q, k, v, sinks, scale * 1.01, window, softcap, rel)
    monkeypatch.setattr(ops, "references", lambda: {**table, "attention": look_alike})
    for model_type, cls in (("qwen3_next", "Qwen3NextAttention"), ("inkling2", "Inkling2FullAttention")):
        row = next(r for r in P.probe(CONFIG_MAPPING[model_type]()).rows if r.cls == cls)
        assert row.status == "differs" and max(row.error.values()) > 1e-3, row


def test_the_tiny_instance_keeps_every_distinct_layer():
    full = CONFIG_MAPPING["deepseek_v4"]()
    meta = T.build(full)
    keep, signatures = T.kept_layers(full, meta)
    assert keep == 5 and len(set(signatures)) == len({T.layer_signature(layer) for layer in meta.model.layers})
    tiny, notes = T.tiny_config(full, meta)
    assert tiny.mlp_layer_types == ["hash_moe"] * 3 + ["moe"] * 2 and tiny.n_routed_experts == 16
    assert "sliding_window 128 -> 8" in " ".join(notes) and tiny.swiglu_limit == full.swiglu_limit
    glm5, notes = T.tiny_config(T.language_config(CONFIG_MAPPING["glm5_next"]()))
    assert glm5.index_topk == 2048 and any("index_topk kept at 2048" in n for n in notes)  # the class refused 8


def test_class_words_are_words():
    assert "ssm" not in K.class_words("GptOssModel") and "topk" in K.class_words("GptOssTopKRouter")
    assert "hyperconnection" in K.class_words("DeepseekV4HyperConnection")


def test_a_config_the_class_cannot_build_names_its_unset_fields_and_onboards_from_its_fields(tmp_path):
    card = onboard("dots1")  # the class's defaults leave the expert counts None
    assert "the config leaves n_routed_experts, num_experts_per_tok, n_shared_experts unset" in card["probe"]["error"]
    assert all(info["evidence"].startswith("config fields only, not checked against code")
               for info in card["blocks"].values() if "gap" not in info)
    longcat = tmp_path / "config.json"  # num_layers, not num_hidden_layers: read through the class
    longcat.write_text(json.dumps({"model_type": "longcat_flash", "num_layers": 4, "hidden_size": 512}))
    assert onboard(longcat)["facts"]["num_layers"]["source"] == "class"


def test_config_only_onboarding_says_it_was_not_checked(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "rwkv7", "hidden_size": 512, "num_hidden_layers": 4,
                                "vocab_size": 65536, "intermediate_size": 2048, "layer_types": ["rwkv"] * 4}))
    card = onboard(path)
    assert "probe" not in card and "linear_attention" in card["blocks"]
    assert card["blocks"]["rmsnorm"]["evidence"] == ("config fields only, not checked against code: transformers has "
                                                     "no class for model_type 'rwkv7'")


def test_the_command_line_onboards_a_model_type_and_refuses_in_json(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_MODELS", str(tmp_path))
    result = runner.invoke(app, ["onboard", "olmoe"])
    assert result.exit_code == 0, result.output
    assert "Modules of OlmoeForCausalLM" in result.output and (tmp_path / "olmoe.yaml").is_file()
    plan = runner.invoke(app, ["plan", "olmoe", "--json"])
    assert {m["cls"] for m in json.loads(plan.output)["modules"]} >= {"OlmoeTopKRouter", "OlmoeExperts"}
    refused = runner.invoke(app, ["onboard", "not_a_model_type", "--json"])
    assert refused.exit_code == 2 and json.loads(refused.stdout)["error"].startswith("no config at not_a_model_type")
    with pytest.raises(WorkbenchError, match="transformers knows no model_type"):
        onboard("not_a_model_type")
