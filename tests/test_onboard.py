"""`workbench onboard`: model cards from the two published configs in workbench/models/configs and from small configs of
other families (DeepSeek-V3-style MLA + MoE, DeepSeek-V3.2 with DSA, dense Llama, Mixtral, an unknown family); the
card's blocks, sizes, layer counts, sources and gaps, and `workbench plan` on the written card."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import workbench.models
from workbench.blocks import REGISTRY
from workbench.blocks._config import Found
from workbench.blocks.base import FAMILIES
from workbench.cli import app
from workbench.errors import WorkbenchError
from workbench.models import get_model
from workbench.onboard import onboard

SHARED = Path(workbench.models.__file__).parent / "configs"  # the published configs, kept in the repository
runner = CliRunner()

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
         "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072}
MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000, "hidden_act": "silu",
           "rms_norm_eps": 1e-5}
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
               "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
               "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
               "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
               "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5, "q_lora_rank": 1536,
               "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "vocab_size": 129280, "hidden_act": "silu", "rms_norm_eps": 1e-6, "num_nextn_predict_layers": 1,
               "n_group": 8, "topk_group": 4}
DEEPSEEK_V32 = {**DEEPSEEK_V3, "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
                "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}


def write(tmp_path: Path, config, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return path


def gaps(card: dict) -> set[str]:
    return {b for b, info in card["blocks"].items() if "gap" in info}


def with_spec(card: dict) -> set[str]:
    return set(card["blocks"]) - gaps(card)


def test_every_value_of_a_card_says_where_it_came_from():
    card = onboard(SHARED / "kimi-k3.config.json")
    for name, fact in card["facts"].items():
        assert (fact["source"] == "config" and fact["field"]) or (fact["source"] == "assumption" and fact["note"]), name
    assert {k for k, f in card["facts"].items() if f["source"] == "assumption"} == {"tokens_per_step", "decode_batch",
                                                                                        "decode_context", "lora_rank",
                                                                                        "prefill_sequences"}
    for name, info in card["blocks"].items():
        assert info["fields"] or name in ("lora_linear",), name
        assert ("gap" in info) == (name not in REGISTRY), name  # a gap is exactly a block without a spec


def test_kimi_k3_from_its_published_config():
    card = onboard(SHARED / "kimi-k3.config.json")
    assert card["name"] == "kimi-k3"
    facts = {k: f["value"] for k, f in card["facts"].items()}
    assert (facts["num_layers"], facts["kda_layers"], facts["full_attention_layers"]) == (93, 69, 24)
    assert (facts["routed_experts"], facts["active_experts"], facts["expert_width"], facts["expert_ffn_size"]) == \
        (896, 16, 3584, 3072)
    assert card["facts"]["hidden_size"]["field"] == "text_config.hidden_size"  # read from the nested text_config
    # the layer lists are 1-indexed: (l + 1) in kda_layers, so 0-indexed layers 3, 7, ..., 91 and 92 are MLA
    assert [i for i, kind in enumerate(facts["layer_kinds"]) if kind == "F"] == [*range(3, 92, 4), 92]
    assert with_spec(card) == {"kda", "moe_router", "moe_topk", "moe_permute", "moe_combine", "moe_grouped_gemm",
                               "rmsnorm", "rmsnorm_gated", "attnres", "seq_chunked_ce", "vocab_blockwise_ce",
                               "lora_linear", "situ", "kda_short_conv", "kda_gate", "kda_prologue", "kda_decode",
                               "kda_prefill", "kda_short_conv_decode", "kda_short_conv_prefill", "mla", "mla_decode",
                               "mla_prefill", "moe_grouped_gemm_mxfp4"}
    assert gaps(card) == {"vision_tower"}  # the gated output norm is rmsnorm_gated; the MXFP4 weights are read
    assert facts["latent_moe_norm"] is True and "latent MoE" in card["facts"]["expert_width"]["note"]
    # K3 normalises the combined routed output, before the up projection, not the experts' input
    assert "no norm" in card["facts"]["expert_width"]["note"]
    assert "combined routed output" in card["facts"]["latent_moe_norm"]["note"]
    blocks = card["blocks"]
    assert blocks["kda"]["shapes"] == [{"B": 1, "T": 8192, "H": 96, "HV": 96, "K": 128, "V": 128, "h0": 1}]
    assert blocks["kda"]["layers"] == 69 and blocks["mla"]["layers"] == 24 and blocks["moe_router"]["layers"] == 92
    assert blocks["kda_short_conv"]["shapes"][0]["W"] == 4
    assert blocks["kda_gate"]["shapes"] == [{"B": 1, "T": 8192, "H": 96, "K": 128}]
    # the forget gate is low rank; use_full_rank_gate is the output gate's (not kda_gate's) field
    assert blocks["kda_gate"]["fields"] == ["text_config.linear_attn_config.gate_lower_bound"]
    assert "low-rank" in blocks["kda_gate"]["role"]
    assert blocks["rmsnorm_gated"]["shapes"] == [{"rows": 8192 * 96, "N": 128, "act": 0}]  # sigmoid-gated, per head
    assert blocks["mla"]["shapes"] == [{"B": 1, "T": 8192, "H": 96, "R": 512, "DN": 128, "DR": 64, "DV": 128,
                                        "gated": 1}]
    assert "no rotary embedding" in blocks["mla"]["role"]  # mla_use_nope
    assert {"rows": 8192, "N": 1536} in blocks["rmsnorm"]["shapes"]  # MLA's q latent norm (its kv one is 512)
    assert {"rows": 8192, "N": 128} not in blocks["rmsnorm"]["shapes"]  # KDA's per-head norm is the gated one
    gemm = {"k": 16, "D": 3584, "F": 3072, "E": 896, "hot": 0, "drop": 0, "act": 1}  # SiTU experts
    # a training step's 8192 tokens, and a decode step's 128 (one per sequence: most experts get no row or one)
    assert blocks["moe_grouped_gemm"]["shapes"] == [{"N": 8192, **gemm}, {"N": 128, **gemm}]
    assert [s["N"] for s in blocks["moe_permute"]["shapes"]] == [s["N"] for s in blocks["moe_combine"]["shapes"]] \
        == [8192, 128]
    assert "differs" not in blocks["moe_grouped_gemm"]  # it differed while the grouped GEMM was SwiGLU only
    assert blocks["moe_router"]["shapes"] == [{"N": n, "D": 7168, "E": 896, "k": 16, "mode": 0, "scale": 1.0}
                                              for n in (8192, 128)]
    assert "differs" not in blocks["moe_router"]  # the config's route scale is an argument of the block
    assert blocks["situ"]["shapes"] == [{"rows": 8192, "N": 6144}, {"rows": 8192, "N": 33792}]  # shared, dense
    assert blocks["situ"]["layers"] == 93  # 92 MoE layers' shared experts and the one dense layer
    assert {"rows": 8192, "N": 3584} in blocks["rmsnorm"]["shapes"]  # the combined routed output's norm
    # Block AttnRes: one shape per number of sources (1 to 9), with its calls: 186 sub-layer calls and the final one
    attnres = blocks["attnres"]["shapes"]
    assert [(s["L"], s["calls"], s["norm"]) for s in attnres] == [
        (1, 1, 1), *((sources, 24, 1) for sources in range(2, 9)), (9, 17, 1), (9, 1, 0)]
    assert sum(s["calls"] for s in attnres) == 2 * 93 + 1
    assert round(sum(s["L"] * s["calls"] for s in attnres) / (2 * 93 + 1), 1) == 5.4
    assert "text_config.use_grouped_topk" in card["unread_fields"]  # shown for review, not silently dropped
    view = card["transformers"]  # the model read through K3's published code (workbench.kimi_k3), not kimi_linear
    assert card["onboarded_from"]["class"] == view["class"] == "KimiK3ForCausalLM"
    assert "vllm/models/kimi_k3" in view["code"]
    read = {"text_config.activation_situ_beta", "text_config.attn_res_block_size", "text_config.latent_moe_use_norm",
            "text_config.routed_expert_hidden_size", "text_config.linear_attn_config.gate_lower_bound",
            "text_config.linear_attn_config.use_full_rank_gate", "text_config.mla_use_output_gate",
            "text_config.linear_attn_config.full_attn_layers", "text_config.mla_use_nope"}
    assert not read & set(view["unread_fields"])
    modules = {m["class"]: m["blocks"] for m in view["modules"]}
    assert modules["KimiK3GatedRMSNorm"] == ["rmsnorm_gated"] and modules["KimiK3DecoderLayer"] == ["attnres"]
    assert modules["KimiK3MLAAttention"] == ["mla", "mla_prefill", "mla_decode"]
    assert modules["KimiK3MLP"] == ["situ"] and modules["KimiK3Gate"] == ["moe_router"]


def test_kimi_linear_from_its_published_config():
    card = onboard(SHARED / "kimi-linear-48b-a3b.config.json")
    assert card["name"] == "kimi-linear-48b-a3b"
    blocks = card["blocks"]
    assert blocks["kda"]["layers"] == 20 and blocks["mla"]["layers"] == 7
    assert blocks["kda"]["shapes"][0]["H"] == 32
    assert gaps(card) == set()  # the KDA output norm is rmsnorm_gated; SwiGLU experts, no latent MoE
    assert card["onboarded_from"]["class"] == "KimiLinearForCausalLM"
    # the json has no short_conv_kernel_size; the class fills in its default, as KimiLinearConfig does
    assert blocks["kda_short_conv"]["shapes"][0]["W"] == 4
    assert blocks["kda_short_conv"]["fields"] == ["linear_conv_kernel_dim (KimiLinearConfig default)"]
    assert card["transformers"]["unread_fields"] == ["mla_use_nope", "moe_layer_freq", "moe_router_activation_func"]
    assert blocks["kda_gate"]["shapes"] == [{"B": 1, "T": 8192, "H": 32, "K": 128, "form": 1}]  # softplus gate
    # the json's head_dim (72) is not KDA's: the class's KDA heads are linear_head_dim wide, 128 by default (the
    # weights of the class built from this config: tests/test_weights.py)
    assert blocks["kda"]["shapes"][0]["K"] == blocks["kda"]["shapes"][0]["V"] == 128
    assert "linear_head_dim (KimiLinearConfig default)" in blocks["kda"]["fields"]
    assert blocks["moe_router"]["shapes"][0]["mode"] == 0 and "G" not in blocks["moe_router"]["shapes"][0]
    assert blocks["swiglu"]["shapes"] == [{"rows": 8192, "N": 1024}, {"rows": 8192, "N": 9216}]
    assert blocks["moe_grouped_gemm"]["shapes"][0]["D"] == 2304 and "differs" not in blocks["moe_grouped_gemm"]


def test_deepseek_v3_style_mla_and_moe(tmp_path):
    card = onboard(write(tmp_path, DEEPSEEK_V3))
    blocks = card["blocks"]
    assert gaps(card) == {"mtp_head"}
    assert blocks["mla"]["shapes"][0]["DR"] == 64 and "no rotary" not in blocks["mla"]["role"]  # RoPE kept
    assert blocks["mla"]["layers"] == 61 and blocks["moe_router"]["layers"] == 58  # first 3 layers dense
    assert blocks["moe_router"]["shapes"][0] == {"N": 8192, "D": 7168, "E": 256, "k": 8, "mode": 0, "scale": 2.5,
                                                 "G": 8, "kg": 4}  # group-limited: the best 4 of 8 groups
    assert "differs" not in blocks["moe_router"] and "best 4 of 8 groups" in blocks["moe_router"]["role"]
    assert blocks["swiglu"]["shapes"] == [{"rows": 8192, "N": 2048}, {"rows": 8192, "N": 18432}]
    assert "head_dim" not in card["facts"]  # MLA's head sizes are its own, not hidden / heads


def test_a_weights_format_no_block_reads_stays_a_gap(tmp_path):
    """DeepSeek-V3's published FP8 block quantization: no block reads it, so the card names it as a gap; only
    compressed-tensors' MXFP4 packing is covered (by moe_grouped_gemm_mxfp4)."""
    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    card = onboard(write(tmp_path, {**DEEPSEEK_V3, "quantization_config": fp8}))
    assert gaps(card) == {"mtp_head", "quantized_weights"} and "moe_grouped_gemm_mxfp4" not in card["blocks"]
    assert card["blocks"]["quantized_weights"]["gap"] == "no spec: fp8 weight dequantization / quantized GEMM"


def test_deepseek_v32_adds_the_sparse_attention_blocks(tmp_path):
    card = onboard(write(tmp_path, DEEPSEEK_V32))
    blocks = card["blocks"]
    assert blocks["dsa_indexer"]["shapes"] == [{"B": 1, "T": 8192, "HI": 64, "DI": 128, "topk": 2048, "tie_free": 0}]
    attention = blocks["dsa_sparse_attention"]["shapes"][0]
    assert (attention["D"], attention["DV"]) == (576, 512)  # MQA: keys [c_kv | k_rope], values c_kv
    assert card["facts"]["dsa_topk"] == {"value": 2048, "source": "config", "field": "index_topk"}


def test_a_dense_llama_has_no_gap(tmp_path):
    card = onboard(write(tmp_path, LLAMA))
    assert gaps(card) == set()
    attention = card["blocks"]["attention"]
    assert attention["shapes"] == [{"B": 1, "TQ": 8192, "TK": 8192, "H": 32, "HKV": 8, "D": 128, "sinks": 0,
                                    "softcap": 0, "window": 0}]
    assert card["blocks"]["swiglu"]["shapes"] == [{"rows": 8192, "N": 14336}]
    assert not {"moe_router", "kda", "attnres"} & set(card["blocks"])
    assert card["facts"]["head_dim"] == {"value": 128, "source": "class", "field": "head_dim (LlamaConfig default)"}
    # the probe ran Llama's code: its attention and MLP modules reproduced through the blocks
    assert attention["evidence"].startswith("probe: LlamaAttention"), attention["evidence"]
    assert card["blocks"]["swiglu"]["evidence"].startswith("probe: LlamaMLP (silu(gate) * up) reproduced")


def test_mixtral_routes_with_softmax(tmp_path):
    card = onboard(write(tmp_path, MIXTRAL))
    blocks = card["blocks"]
    # softmax, renormalized, scale 1: what the probe measured MixtralTopKRouter computes (source: probe)
    assert blocks["moe_router"]["shapes"] == [{"N": n, "D": 4096, "E": 8, "k": 2, "mode": 1, "scale": 1.0}
                                              for n in (8192, 128)]
    assert card["facts"]["route_scale"]["source"] == "probe"
    assert blocks["moe_grouped_gemm"]["shapes"][0]["F"] == 14336  # Mixtral's experts are intermediate_size wide
    assert blocks["moe_router"]["layers"] == 32 and "swiglu" not in blocks  # no dense layers, no shared experts
    assert blocks["moe_grouped_gemm"]["shapes"][0]["act"] == 0 and "differs" not in blocks["moe_grouped_gemm"]
    gelu = onboard(write(tmp_path, {**MIXTRAL, "hidden_act": "gelu"}))["blocks"]["moe_grouped_gemm"]
    assert gelu["differs"].startswith("MixtralExperts: experts with hidden_act 'gelu': moe_grouped_gemm computes "
                                      "SwiGLU and SiTU only")


def test_an_unknown_family_gives_a_card_with_gaps(tmp_path):
    card = onboard(write(tmp_path, {"model_type": "rwkv7", "hidden_size": 512, "num_hidden_layers": 4,
                                    "attention_hidden_size": 512, "hidden_act": "relu_squared", "vocab_size": 65536,
                                    "intermediate_size": 2048, "layer_types": ["rwkv"] * 4}))
    assert {"unrecognised_attention", "linear_attention"} <= gaps(card)
    assert "attention_hidden_size" in card["unread_fields"]



def test_experts_without_an_active_count_are_a_gap_not_null_shapes(tmp_path):
    """A config naming its routed experts but not how many a token runs (DeepSeek-V2's class defaults): no
    routed-expert block is sized with k None; the card names the missing fields as a gap, and still counts the
    experts' weights and the shared experts."""
    config = {**{k: v for k, v in DEEPSEEK_V3.items() if k != "num_experts_per_tok"},
              "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2"}  # its class default: None
    card = onboard(write(tmp_path, config))
    assert not {"moe_router", "moe_topk", "moe_permute", "moe_grouped_gemm", "moe_combine"} & set(card["blocks"])
    assert gaps(card) == {"mtp_head", "routed_experts"}
    assert card["blocks"]["routed_experts"]["gap"] == (
        "no spec: routed experts with no active-expert count (the config sets none of num_experts_per_token, "
        "num_experts_per_tok, moe_topk)")
    assert card["blocks"]["routed_experts"]["layers"] == 58 and "active_experts" not in card["facts"]
    assert "routed_experts" in card["weights"]["parts"]
    assert {"rows": 8192, "N": 2048} in card["blocks"]["swiglu"]["shapes"]  # the shared expert


def test_a_router_no_mode_computes_is_marked_as_a_different_variant(tmp_path):
    router = onboard(write(tmp_path, {**DEEPSEEK_V3, "scoring_func": "sqrtsoftplus", "norm_topk_prob": False})
                     )["blocks"]["moe_router"]
    assert router["shapes"] == [] and router["layers"] == 58
    assert router["differs"] == "the catalog's router scores with sigmoid, softmax or sqrtsoftplus; the config's " \
                                "uses sqrtsoftplus scores (renormalize=False)"
    # DeepSeek-V4's own: sqrt(softplus) scores, renormalized (mode 4)
    router = onboard(write(tmp_path, {**DEEPSEEK_V3, "scoring_func": "sqrtsoftplus"}))["blocks"]["moe_router"]
    assert "differs" not in router and {shape["mode"] for shape in router["shapes"]} == {4}


def test_a_new_block_module_onboards_through_its_own_rule(tmp_path, monkeypatch):
    """The recipe for a block: its module's SPEC carries its onboarding rule. A second softmax-attention block
    registered beside the catalog's gets its entry from its own rule, and no gap."""
    seen = []

    def softmax_rule(model):
        seen.append((model.full_layers, model.heads, model.head_dim))
        return [Found("softmax attention", model.full_layers, [{"T": model.tokens, "H": model.heads}],
                      [model.heads_field])]

    spec = dataclasses.replace(REGISTRY["swiglu"], name="softmax_attention", family="attention", onboard=softmax_rule)
    monkeypatch.setitem(REGISTRY, "softmax_attention", spec)
    card = onboard(write(tmp_path, LLAMA))
    assert seen == [(32, 32, 128)] and not gaps(card)
    entry = card["blocks"]["softmax_attention"]
    assert {k: entry[k] for k in ("role", "shapes", "layers", "fields")} == {
        "role": "softmax attention", "shapes": [{"T": 8192, "H": 32}], "layers": 32, "fields": ["num_attention_heads"]}
    # a rule alone is not proof: no kind reads LlamaAttention as this block, so the probe says no module computes it
    assert entry["differs"].startswith("no module of LlamaForCausalLM computes softmax_attention (probe)")
    assert list(card["blocks"])[:5] == ["attention", "attention_decode", "attention_prefill", "rotary",
                                        "softmax_attention"]


def test_every_block_of_the_catalog_has_an_onboarding_rule_and_a_family():
    for name, spec in REGISTRY.items():
        assert spec.family in FAMILIES and callable(spec.onboard), name

@pytest.mark.parametrize("content, message", [
    ("{not json", "is not readable JSON"),
    ("[1, 2]", "not a model config: a JSON list"),
    ('{"name": "a tokenizer", "vocab": {}}', "no hidden_size and num_hidden_layers"),
    ('{"hidden_size": "wide", "num_hidden_layers": 4}', "hidden_size is 'wide': expected a non-negative integer"),
])
def test_bad_configs_are_one_line_and_exit_2(tmp_path, monkeypatch, content, message):
    path = write(tmp_path, content)
    with pytest.raises(WorkbenchError, match=message):
        onboard(path)
    monkeypatch.setenv("WORKBENCH_MODELS", str(tmp_path / "cards"))
    result = runner.invoke(app, ["onboard", str(path)])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "cards").exists()
    missing = runner.invoke(app, ["onboard", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "no config at" in missing.output


def test_the_written_card_is_planned_like_any_other(settings, tmp_path, monkeypatch):
    cards = tmp_path / "cards"
    monkeypatch.setenv("WORKBENCH_MODELS", str(cards))
    folder = tmp_path / "Kimi-K3"
    folder.mkdir()
    (folder / "config.json").write_text((SHARED / "kimi-k3.config.json").read_text())
    result = runner.invoke(app, ["onboard", str(folder), "--json"])  # a folder holding config.json
    assert result.exit_code == 0, result.output
    written = json.loads(result.output)
    assert written["card"] == str(cards / "kimi-k3.yaml") and set(written["gaps"]) == gaps(written)
    assert get_model("kimi-k3").blocks["kda"]["layers"] == 69

    plan = runner.invoke(app, ["plan", "kimi-k3", "--json"])
    assert plan.exit_code == 0, plan.output
    rows = {r["block"]: r for r in json.loads(plan.output)["blocks"]}
    assert rows["moe_grouped_gemm_mxfp4"]["status"] == "not started" and rows["moe_grouped_gemm_mxfp4"]["layers"] == 92
    assert rows["mla"]["status"] == "not started" and rows["mla"]["layers"] == 24
    assert rows["kda"]["status"] == "not started" and rows["kda"]["layers"] == 69
    assert "differs" not in rows["moe_router"]["detail"]
    assert get_model("kimi-k3.1-pro")  # the workbench's own cards are still found


def test_name_and_out_options(tmp_path):
    result = runner.invoke(app, ["onboard", str(SHARED / "kimi-linear-48b-a3b.config.json"), "--name", "kl",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    # kda_gate, kda_short_conv (the class's default kernel), kda_prologue, the three decode forms and serving's
    # routing with a spec, the class's gated output norm without
    assert (tmp_path / "kl.yaml").is_file() and "22 blocks with a spec, 0 without" in result.output
