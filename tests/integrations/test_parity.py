"""`workbench parity`: transformers' own Kimi Linear, as shipped and with the promoted operators swapped in, on a
tiny random-weight instance (the kernels on the Triton interpreter in a child process). The shipped operators stay
within the float32 bounds; a broken operator fails the run and is named as the first module that diverges."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.store import get_engine
from workbench.store.queries import parity_runs

pytestmark = [pytest.mark.interpreter, pytest.mark.slow]
runner = CliRunner()
OPERATORS = Path(__file__).parents[2] / "operators"
KIMI_LINEAR = Path(__file__).parents[2] / "workbench" / "models" / "configs" / "kimi-linear-48b-a3b.config.json"


def parity(*args: str):
    result = runner.invoke(app, ["parity", str(KIMI_LINEAR), "--tokens", "16", "--json", *args])
    return result, json.loads(result.stdout[result.stdout.index("{"):]) if "{" in result.stdout else None


def test_kimi_linear_with_every_promoted_operator_computes_the_shipped_model(settings):
    shutil.copytree(OPERATORS, settings.operators_dir)
    result, report = parity("--generate", "6")
    assert result.exit_code == 0, result.output
    m = report["metrics"]
    assert report["status"] == "pass" and report["model_class"] == "KimiLinearForCausalLM"
    assert report["layers"] == ["linear_attention"] * 3 + ["full_attention"]
    assert m["kl"] < 1e-8 and m["top1"] == 1.0 and m["router_match"] == 1.0 and m["loss_rel"] < 1e-5
    assert 0 < m["logits_rel"] < 1e-5, "the kernels ran (a difference of summation order), and agree"
    assert m["grad_rel_worst"] < 1e-3 and m["grad_params"] > 50 and m["first_divergence"] is None
    assert report["patch"]["blocks"] == ["kda", "kda_decode", "kda_gate", "kda_prologue", "kda_short_conv",
                                         "kda_short_conv_decode", "mla", "mla_decode", "moe_combine",
                                         "moe_grouped_gemm", "moe_permute", "moe_router", "rmsnorm", "rmsnorm_gated",
                                         "swiglu"]
    # every swapped-in op ran (the model builds a DynamicCache even in training: the ops write it as shipped)
    assert m["idle_blocks"] == [] and m["op_runs"]["kda"] == 3 and m["op_runs"]["mla"] == 1
    assert m["op_runs"]["kda_prologue"] == 3 and m["decode_op_runs"]["kda_prologue"] == 3 + 12
    assert m["op_runs"]["rmsnorm_gated"] == 3  # each KDA layer's gated output norm
    # and generation reads the cache the patched prefill wrote (the prefill: kda in 3 layers, mla in 1); each of the 4
    # decode steps runs the 3 KDA layers' decode ops, which update the cache's states in place as the shipped step
    # does, and the MLA layer's mla_decode over its cached latents laid out in pages
    decode = m["decode_op_runs"]
    assert (decode["kda"], decode["mla"], decode["kda_decode"], decode["kda_short_conv_decode"]) == (3, 1, 12, 12)
    assert decode["mla_decode"] == 4 and decode["rmsnorm_gated"] == 3 + 12  # the prefill's and each decode step's
    assert m["decode_steps"] == 4 and m["decode_kl"] < 1e-8 and m["decode_top1"] == 1.0
    # greedy generate() of 6 tokens on two left-padded prompts (16 and 8 tokens): the same tokens; after the prefill
    # every one of the 5 decode steps ran the 3 KDA layers' decode ops and mla_decode (the padding never read)
    assert m["generate_prompts"] == [16, 8] and m["generate_match"] == 1.0 and m["generate_first_mismatch"] is None
    assert m["generate_kl"] < 1e-8 and len(m["generate_rel_per_step"]) == 6 and 0 < max(m["generate_rel_per_step"])
    assert m["generate_op_runs"]["kda_decode"] == m["generate_op_runs"]["kda_short_conv_decode"] == 5 * 3
    assert m["generate_op_runs"]["mla_decode"] == 5
    # outside plain projections the patched forward runs in torch only the KDA layers' glue (the projections'
    # concatenation), the residual adds and the MLA layer's concatenations: under 1% of the FLOPs (modelled)
    share = m["torch_share"]
    assert 0 < share["flops_share"] < 0.01 and 0 < share["bytes_share"] < 0.02
    assert share["left"][0]["class"] == "KimiLinearDeltaAttention" and "l2norm" not in share["ported_calls"]
    assert {"KimiLinearDecoderLayer", "KimiLinearAttention"} < {row["class"] for row in share["left"]}
    assert share["ported_calls"]["kda"] == 3 and share["ported_calls"]["mla"] == 1
    (row,) = parity_runs(get_engine(settings.db_url))
    assert row.status == "pass" and row.metrics["kl"] == m["kl"] and row.id == report["id"]


def test_deepseek_v3_with_group_limited_routing_and_rotary_mla_computes_the_shipped_model(settings):
    """The class's default config (the published DeepSeek-V3: 8 routing groups, 4 kept, route scale 2.5, yarn rope
    on interleaved pairs, as rotary's interleaved form), shrunk: 3 dense layers and an MoE one, 16 experts in 8 groups
    of 2."""
    shutil.copytree(OPERATORS, settings.operators_dir)
    result = runner.invoke(app, ["parity", "deepseek_v3", "--tokens", "16", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])
    m = report["metrics"]
    assert report["model_class"] == "DeepseekV3ForCausalLM" and report["config"]["n_group"] == 8
    assert report["config"]["first_k_dense_replace"] == 3 and report["config"]["topk_group"] == 4
    assert m["kl"] < 1e-8 and m["router_match"] == 1.0 and m["loss_rel"] < 1e-5 and m["grad_rel_worst"] < 1e-3
    assert 0 < m["logits_rel"] < 1e-5 and m["first_divergence"] is None
    assert report["patch"]["blocks"] == ["mla", "mla_decode", "moe_combine", "moe_grouped_gemm", "moe_permute",
                                         "moe_router", "rmsnorm", "rotary", "swiglu"]
    assert m["op_runs"]["rotary"] == 4 * 2  # each MLA layer's q and k rope parts
    assert m["decode_op_runs"]["mla_decode"] == 4 * 4 and m["decode_kl"] < 1e-8  # 4 MLA layers x 4 rotary steps


def test_qwen3_next_gated_delta_net_through_kda_computes_the_shipped_model(settings):
    """The class's default config shrunk: 3 Gated DeltaNet layers (two value heads per q/k head) and a gated
    softmax-attention one, softmax routing over 16 experts, zero-centred RMSNorm, SiLU-gated output norm. Logits,
    loss, routing, decode and every gradient match but the decay rates': Qwen3-Next's (A up to 16, g down to -35 a
    token) make the A_log and dt_bias gradients of the first layers sums of tiny terms, and there the shipped
    float32 code (transformers' chunked delta rule, float32 inside) is itself 1e-2 to 1e-1 from float64. Held to
    the float64 truth (the shipped code with its float32 casts kept in float64), the patched model is within 1e-3:
    kda's backward sums the gate gradient from the terms whose decay spans each token."""
    shutil.copytree(OPERATORS, settings.operators_dir)
    result = runner.invoke(app, ["parity", "qwen3_next", "--tokens", "16", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])
    m = report["metrics"]
    assert report["model_class"] == "Qwen3NextForCausalLM" and m["idle_blocks"] == []
    assert all(c["ok"] for c in report["checks"]) and "grad_truth_ratio" in [c["metric"] for c in report["checks"]]
    assert m["grad_worst_param"].split(".")[-1] in ("A_log", "dt_bias") and m["grad_rel_median"] < 1e-5
    # the gradients past the bound are the decay parameters'; against float64 the patched model is the accurate one
    assert {name.rsplit(".", 1)[1] for name in m["grad_truth"]} == {"A_log", "dt_bias"}
    assert all(e["patched"] < 1e-3 < e["shipped"] for e in m["grad_truth"].values())
    assert m["grad_truth_ratio"] < 1e-2
    # the router's logits, which the sparse MoE block discards, are not computed in torch beside moe_router
    (router,) = [row for row in m["torch_share"]["left"] if row["class"] == "Qwen3NextTopKRouter"]
    assert router["ops"] == ["zeros"]  # its zero selection bias; no matmul
    assert m["kl"] < 1e-8 and m["router_match"] == 1.0 and m["loss_rel"] < 1e-5 and m["decode_kl"] < 1e-8
    assert 0 < m["logits_rel"] < 1e-5 and m["first_divergence"] is None
    assert {"attention", "kda", "kda_gate", "kda_short_conv", "moe_router", "rmsnorm", "rmsnorm_gated"} <= \
        set(report["patch"]["blocks"])
    assert m["op_runs"]["rmsnorm_gated"] == 3  # each Gated DeltaNet layer's SiLU-gated output norm
    assert m["op_runs"]["attention"] == 1 and m["decode_op_runs"]["attention"] == 5  # the prompt, then 4 steps


def test_a_broken_operator_fails_parity_and_is_named_as_the_first_divergence(settings):
    shutil.copytree(OPERATORS, settings.operators_dir)
    (path,) = (settings.operators_dir / "rmsnorm").glob("*.py")
    source = path.read_text()
    assert "/ N + eps)" in source
    path.write_text(source.replace("/ N + eps)", "/ N + eps * 1000.0)"))  # eps 1e-5 -> 1e-2: activations ~4e-4
    result, report = parity("--blocks", "rmsnorm,swiglu", "--generate", "3")
    assert result.exit_code == 1, result.output
    assert report["status"] == "fail" and {"kl", "loss_rel"} <= {c["metric"] for c in report["checks"] if not c["ok"]}
    assert report["metrics"]["first_divergence"]["module"] == "model.layers.0.input_layernorm"
    assert "first module past" in report["message"]
    # generate() takes other tokens; the step where they first differ is replayed and its first module named
    m = report["metrics"]
    diverged = m["generate_divergence"]
    assert m["generate_match"] < 1.0 and diverged["step"] == m["generate_first_mismatch"]
    assert diverged["module"] == "model.layers.0.input_layernorm" and diverged["rel"] > 1e-4
    assert f"generate() tokens differ from step {diverged['step']}" in report["message"]


def test_bfloat16_needs_a_gpu_and_says_so(settings):
    result = runner.invoke(app, ["parity", "kimi_linear", "--dtype", "bfloat16", "--backend", "interpreter"])
    assert result.exit_code == 2
    assert "the interpreter backend cannot compute bfloat16" in result.output


def test_a_lora_fine_tune_through_peft_keeps_the_shipped_curve(settings):
    """Both models wrapped by PEFT's LoRA (rank 4 on every projection), then 3 AdamW steps: the patched model (its
    LoRA layers as lora_linear, everything else as above) follows the shipped curve."""
    shutil.copytree(OPERATORS, settings.operators_dir)
    result, report = parity("--layers", "2", "--lora", "4", "--steps", "3")
    assert result.exit_code == 0, result.output
    lora = report["metrics"]["lora"]
    assert lora["rank"] == 4 and len(lora["curves"]["patched"]) == 3
    assert lora["curves"]["shipped"] != [lora["curves"]["shipped"][0]] * 3, "the adapters trained"
    assert report["metrics"]["curve_rel"] < 1e-4
    assert any(m["blocks"] == ["lora_linear"] and m["count"] >= 8 for m in report["patch"]["modules"])


def test_glm_moe_dsa_sparse_attention_with_shared_selections_computes_the_shipped_model(settings, tmp_path):
    """GLM-MoE-DSA with cross-layer top-k sharing (F S S F), each query attending to the top 8 of 16 keys: the
    indexer as dsa_indexer, the attention as dsa_sparse_attention, the shared layers over the selection handed
    down; decode steps and generate() through dsa_indexer_decode and dsa_decode. (deepseek_v32 runs the same ops
    with a half-split indexer rope.)"""
    shutil.copytree(OPERATORS, settings.operators_dir)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "glm_moe_dsa", "num_hidden_layers": 8,
                                  "indexer_types": ["full", "shared", "shared", "full"] * 2}))
    result = runner.invoke(app, ["parity", str(config), "--tokens", "16", "--generate", "4", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])
    m = report["metrics"]
    assert report["model_class"] == "GlmMoeDsaForCausalLM" and report["config"]["index_topk"] == 8
    assert report["config"]["indexer_types"] == ["full", "shared", "shared", "full"]
    assert m["kl"] < 1e-8 and m["top1"] == 1.0 and m["router_match"] == 1.0 and m["loss_rel"] < 1e-5
    assert 0 < m["logits_rel"] < 1e-5 and m["grad_rel_worst"] < 1e-3 and m["first_divergence"] is None
    assert {"dsa_indexer", "dsa_sparse_attention", "moe_router"} <= set(report["patch"]["blocks"])
    assert m["op_runs"]["dsa_indexer"] == 2 and m["op_runs"]["dsa_sparse_attention"] == 4  # 2 full, 2 shared
    assert m["op_runs"]["rotary"] == 2 * 4 + 2 * 2  # every layer's q and k rope parts, the full layers' indexers
    assert m["decode_kl"] < 1e-8 and m["decode_top1"] == 1.0  # the latents and index keys cached as shipped
    # each decode step: the full layers' indexers as dsa_indexer_decode over paged index keys, every layer's
    # attention as dsa_decode (the shared ones over the selection handed down, in cache positions)
    assert m["decode_op_runs"]["dsa_indexer_decode"] == 2 * 4 and m["decode_op_runs"]["dsa_decode"] == 4 * 4
    # generate() on two left-padded prompts: the same 4 tokens, its 3 decode steps through the decode forms
    assert m["generate_match"] == 1.0 and m["generate_kl"] < 1e-8
    assert m["generate_op_runs"]["dsa_indexer_decode"] == 3 * 2 and m["generate_op_runs"]["dsa_decode"] == 3 * 4


def test_inkling2_residual_mixes_and_situ_experts_compute_the_shipped_model(settings):
    """Inkling2's text model shrunk to a sliding and a full layer: the block attention residuals (one query, and the
    full layer's three for q, k and v) as attnres with normalised values, the sigmoid router, the experts' softcapped
    SwiGLU as moe_grouped_gemm's SiTU, the residual short convolutions as kda_short_conv's residual variant and the
    full layer's dynamic ones (per-token taps) as its dynamic variant, the attention as the attention block's Inkling2
    variant with its L2 clips as l2_clip and its values' norm as rmsnorm."""
    shutil.copytree(OPERATORS, settings.operators_dir)
    result = runner.invoke(app, ["parity", "inkling2", "--layers", "2", "--tokens", "16", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])
    m = report["metrics"]
    assert report["model_class"] == "Inkling2ForCausalLM" and report["layers"] == ["hybrid_sliding", "hybrid"]
    assert m["kl"] < 1e-8 and m["top1"] == 1.0 and m["router_match"] == 1.0 and m["loss_rel"] < 1e-5
    assert 0 < m["logits_rel"] < 1e-5 and m["grad_rel_worst"] < 1e-3 and m["first_divergence"] is None
    # the residual mixes: the sliding layer's MLP input (layer 0 has no attention input), the full layer's three
    # attention inputs and its MLP input, and the final one
    assert m["op_runs"]["attnres"] == 6 and m["op_runs"]["moe_grouped_gemm"] == 2 and m["idle_blocks"] == []
    # the residual short convolutions: after both sublayers of both layers, the sliding layer's keys and values, and
    # the full layer's dynamic ones on its keys and values
    assert m["op_runs"]["kda_short_conv"] == 2 + 2 + 2 + 2 and m["op_runs"]["attention"] == 2
    assert m["op_runs"]["l2_clip"] == 3 * 2  # each attention's queries, keys and relative states


def test_glm5_next_kda_layers_with_the_bounded_gate_compute_the_shipped_model(settings):
    """GLM-5-Next's published class (vision-language, text fed) shrunk to a KDA layer and a DSA one: the KDA layer
    as kda_short_conv + kda with the bounded forget gate (lower bound -5, Kimi K3's form) as kda_gate and its
    sigmoid-gated output norm as rmsnorm_gated, the norms and the group-limited router, the MLPs' and the experts'
    clamped SwiGLU as swiglu's and moe_grouped_gemm's clamped variant, the hyper-connections' weights and collapse
    as hyper_connection before both sub-layers and their expand and mix as hyper_connection_mix after; the DSA
    layer's k-pool indexer as dsa_kpool_indexer and its attention as dsa_sparse_attention, its decode steps as
    dsa_kpool_indexer_decode and dsa_decode over paged caches."""
    shutil.copytree(OPERATORS, settings.operators_dir)
    result = runner.invoke(app, ["parity", "glm5_next", "--layers", "2", "--tokens", "16", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])
    m = report["metrics"]
    assert report["model_class"] == "Glm5NextForConditionalGeneration" and report["config"]["linear_lower_bound"] == -5
    assert report["layers"] == ["linear_attention", "indexed_attention"]
    assert m["kl"] < 1e-8 and m["top1"] == 1.0 and m["router_match"] == 1.0 and m["loss_rel"] < 1e-5
    assert 0 < m["logits_rel"] < 1e-5 and m["grad_rel_worst"] < 1e-3 and m["first_divergence"] is None
    assert m["op_runs"]["kda_gate"] == 1 and m["op_runs"]["kda"] == 1 and m["idle_blocks"] == []
    assert m["op_runs"]["rmsnorm_gated"] == 1 and m["op_runs"]["swiglu"] == 2  # the dense layer's, a shared expert's
    assert m["op_runs"]["moe_grouped_gemm"] == 1 and m["op_runs"]["hyper_connection"] == 2 * 2
    assert m["op_runs"]["hyper_connection_mix"] == 2 * 2
    assert m["op_runs"]["dsa_kpool_indexer"] == 1 and m["op_runs"]["dsa_sparse_attention"] == 1
    assert m["decode_kl"] < 1e-8 and m["decode_top1"] == 1.0
    decode = m["decode_op_runs"]  # the prompt, then 4 steps: the KDA layer's and the DSA layer's serving forms
    assert decode["kda_short_conv_decode"] == decode["kda_decode"] == 4
    assert decode["dsa_kpool_indexer_decode"] == decode["dsa_decode"] == 4 and decode["dsa_kpool_indexer"] == 1


@pytest.mark.parametrize("model_type, swapped", [
    ("glm4_moe", ["attention", "moe_combine", "moe_grouped_gemm", "moe_permute", "moe_router", "rmsnorm", "rotary",
                  "swiglu"]),
    ("bailing_hybrid", ["kda", "kda_gate", "kda_prologue", "kda_short_conv", "moe_combine", "moe_grouped_gemm",
                        "moe_permute", "moe_router", "rmsnorm", "rmsnorm_gated", "swiglu"]),
])
def test_a_family_with_no_integration_runs_the_kinds_the_probe_proved(settings, model_type, swapped):
    """GLM-4.5 (a sigmoid router with a correction bias and no scoring_func field, a dense first layer) and
    Bailing-Hybrid (KDA layers with a full-rank forget gate and output gate, MLA layers with a head-wise gate): no
    hand-written integration, the generic kinds the onboarding probe proved swapped in (GLM-4.5's softmax attention
    through the attention registry and its partial rotary embedding as rotary, at the decode steps too), Bailing's
    MLA left alone, every swapped op run, within the float32 bounds."""
    shutil.copytree(OPERATORS, settings.operators_dir)
    result = runner.invoke(app, ["parity", model_type, "--tokens", "16", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])
    m = report["metrics"]
    assert report["status"] == "pass" and report["patch"]["blocks"] == swapped
    assert m["kl"] < 1e-8 and m["router_match"] == 1.0 and m["loss_rel"] < 1e-5 and m["grad_rel_worst"] < 1e-3
    assert 0 < m["logits_rel"] < 1e-5 and m["idle_blocks"] == [] and m["first_divergence"] is None
    left = {row["class"]: row["reason"] for row in report["patch"]["modules"] if not row["blocks"]}
    if "attention" in swapped:
        assert m["decode_op_runs"]["attention"] > m["op_runs"]["attention"] > 0 and m["decode_kl"] < 1e-8
        assert m["decode_op_runs"]["rotary"] > m["op_runs"]["rotary"] > 0  # q and k of every attention layer
    else:
        assert any(reason.startswith("no spec: MLA attention") for reason in left.values())
    assert any("generic kinds" in note for note in report["patch"]["notes"])
