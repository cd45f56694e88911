"""apply_workbench_kernels on transformers models: which modules a family swaps, which it leaves alone and why (no
kernel runs here: patching only), and the parity helpers that shape the tiny instance."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import KimiLinearConfig, KimiLinearForCausalLM

import workbench.kernels as wk
from workbench.errors import WorkbenchError
from workbench.integrations.parity import config_fields, load_config, pick_layers, schedules, tiny_config
from workbench.integrations.transformers import apply_workbench_kernels

OPERATORS = Path(__file__).parents[2] / "operators"
KIMI_LINEAR = Path(__file__).parents[2] / "workbench" / "models" / "configs" / "kimi-linear-48b-a3b.config.json"


@pytest.fixture
def promoted():
    """The shipped operators folder for the library (restored afterwards)."""
    wk.set_operators_dir(OPERATORS)
    yield
    wk.set_operators_dir(None)


def tiny_kimi(**changes) -> KimiLinearForCausalLM:
    full, _ = load_config(json.loads(KIMI_LINEAR.read_text()))
    fields, _ = tiny_config(full, 4)
    torch.manual_seed(0)
    return KimiLinearForCausalLM(KimiLinearConfig(**{**fields, **changes}))


def outcome(report) -> dict[str, tuple]:
    return {row["class"]: tuple(row["blocks"]) or row["reason"] for row in report.as_dict()["modules"]}


def test_kimi_linear_swaps_every_module_a_block_computes_and_names_the_rest(promoted):
    model = tiny_kimi()
    report = apply_workbench_kernels(model)
    found = outcome(report)
    assert found["KimiLinearRMSNorm"] == ("rmsnorm",) and found["KimiLinearMLP"] == ("swiglu",)
    assert found["KimiLinearTopkRouter"] == ("moe_router",) and found["KimiLinearAttention"] == ("mla", "mla_decode")
    assert found["KimiLinearExperts"] == ("moe_permute", "moe_grouped_gemm", "moe_combine")
    # its prefill by kda_short_conv and kda, its decode steps by their serving forms (all four are promoted)
    assert found["KimiLinearDeltaAttention"] == ("kda_short_conv", "kda_prologue", "kda", "kda_short_conv_decode",
                                                 "kda_decode")
    assert found["KimiLinearForgetGate"] == ("kda_gate",) and found["KimiLinearRMSNormGated"] == ("rmsnorm_gated",)
    assert model.config._experts_implementation == "workbench"
    # norms, MLPs, routers, experts, MLA, KDA, forget gates, KDA output norms
    assert sum(r.replaced for r in report.rows) == 10 + 4 + 3 + 3 + 1 + 3 + 3 + 3
    assert not any("l2norm" in note for note in report.notes)  # kda_prologue computes it
    norm = model.model.norm
    assert norm.forward != norm.original_forward and "weight" in dict(norm.named_parameters())


def test_a_gated_norm_with_a_gate_the_block_lacks_is_left_alone(promoted):
    model = tiny_kimi()
    model.model.layers[1].self_attn.o_norm.activation = "tanh"
    rows = {r.path: r for r in apply_workbench_kernels(model).rows}
    assert rows["model.layers.0.self_attn.o_norm"].blocks == ("rmsnorm_gated",)
    left = rows["model.layers.1.self_attn.o_norm"]
    assert not left.replaced and "activation 'tanh': rmsnorm_gated gates by sigmoid or silu" in left.reason
    assert not hasattr(model.model.layers[1].self_attn.o_norm, "original_forward")


def test_applying_twice_keeps_the_shipped_forward_reachable(promoted):
    model = tiny_kimi()
    apply_workbench_kernels(model)
    first = model.model.norm.original_forward
    apply_workbench_kernels(model)
    assert model.model.norm.original_forward == first
    assert first.__func__.__qualname__ == "KimiLinearRMSNorm.forward"


def test_group_limited_routing_is_swapped_in_too(promoted):
    report = apply_workbench_kernels(tiny_kimi(num_local_experts=16, n_group=4, topk_group=2))
    assert outcome(report)["KimiLinearTopkRouter"] == ("moe_router",)


def test_only_the_requested_blocks_and_only_promoted_ones(tmp_path):
    folder = tmp_path / "operators"
    shutil.copytree(OPERATORS / "rmsnorm", folder / "rmsnorm")
    wk.set_operators_dir(folder)
    try:
        found = outcome(apply_workbench_kernels(tiny_kimi()))
        assert found["KimiLinearRMSNorm"] == ("rmsnorm",)
        assert found["KimiLinearAttention"].startswith("no promoted operator for mla")
        wk.set_operators_dir(OPERATORS)
        found = outcome(apply_workbench_kernels(tiny_kimi(), blocks=["mla"]))
        assert found["KimiLinearAttention"] == ("mla",)
        assert found["KimiLinearRMSNorm"] == "not requested (rmsnorm not in --blocks)"
        # the prefill's blocks without the decode forms: decode steps keep the shipped forward; without
        # kda_prologue the l2norm and the sigmoid stay in torch
        report = apply_workbench_kernels(tiny_kimi(), blocks=["kda_short_conv", "kda"])
        assert outcome(report)["KimiLinearDeltaAttention"] == ("kda_short_conv", "kda")
        assert any("l2norm" in note for note in report.notes)
    finally:
        wk.set_operators_dir(None)


def test_unknown_families_and_blocks_are_one_line_errors(promoted):
    model = _llama()
    model.config.model_type = "not_a_family"
    with pytest.raises(WorkbenchError, match="no workbench kernels for model_type 'not_a_family'"):
        apply_workbench_kernels(model)
    with pytest.raises(WorkbenchError, match="unknown block 'nope'"):
        apply_workbench_kernels(tiny_kimi(), blocks=["nope"])


def test_a_family_without_an_integration_gets_the_kinds_the_probe_proved(promoted):
    """Llama has no hand-written integration: its norms and MLPs are swapped by the generic kinds the onboarding
    probe proved on its code, its attention among them (through the attention registry), and the swapped modules
    compute what they did (workbench parity runs them: tests/integrations/test_parity.py)."""
    model = _llama()
    report = apply_workbench_kernels(model)
    replaced = {r.cls: r.blocks for r in report.replaced}
    assert replaced == {"LlamaRMSNorm": ("rmsnorm",), "LlamaMLP": ("swiglu",),
                        "LlamaAttention": ("attention", "rotary")}
    assert any("generic kinds" in note for note in report.notes)
    # the rotary embedding is the attention variant's optional block: without it the module rotates as shipped
    kept = apply_workbench_kernels(_llama(), blocks=["rmsnorm", "swiglu", "attention"])
    assert {r.cls: r.blocks for r in kept.replaced}["LlamaAttention"] == ("attention",)
    norm = model.model.norm  # the variant the probe proved, read from this module: its own eps, a plain weight
    assert norm.workbench_variant["weight"]["value"] == "w"
    assert norm.workbench_variant["eps"] == {"value": norm.variance_epsilon,
                                             "source": "module LlamaRMSNorm.variance_epsilon"}


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2))


def test_the_tiny_instance_keeps_the_schedule_and_the_routing_pattern():
    assert pick_layers(["l", "l", "l", "f"] * 6, 3) == ["l", "l", "f"]
    assert pick_layers(["l", "l", "l", "f"] * 6, 4) == ["l", "l", "l", "f"]
    with pytest.raises(WorkbenchError, match="ask for at least that many"):
        pick_layers(["l", "f"], 1)
    full, _ = load_config(json.loads(KIMI_LINEAR.read_text()))
    fields, schedule = tiny_config(full, 3)
    assert schedule == ["linear_attention", "linear_attention", "full_attention"]
    assert fields["mlp_layer_types"] == ["dense", "sparse", "sparse"]
    assert (fields["num_local_experts"], fields["num_experts_per_tok"]) == (16, 2)
    assert fields["routed_scaling_factor"] == 2.446 and fields["linear_conv_kernel_dim"] == 4  # the class's default


def test_k3s_card_reads_its_published_config_through_k3s_model():
    """Kimi K3's card runs workbench.kimi_k3's model (K3's published serving code), which reads the whole published
    config (its text_config is kimi_linear, whose transformers class computes neither SiTU nor AttnRes nor the latent
    MoE); the derived K3.1 Pro card runs K3's."""
    fields, label, notes = config_fields("kimi-k3")
    assert fields["model_type"] == "kimi_k3" and "text_config" in fields and label.startswith("kimi-k3 (")
    full, more = load_config(fields)
    assert full.hidden_act == "situ" and full.num_experts == 896 and full.attn_res_block_size == 12
    assert not any("hidden_act" in n for n in more)  # the model computes SiTU
    assert any("KimiK3Config does not read" in n and "vision_config" in n for n in more)
    assert "attn_res_block_size" not in " ".join(more)
    fields, schedule = tiny_config(full, 4)
    assert schedule == ["kda", "kda", "kda", "mla"] and fields["layer_kinds"] == "KKKM"
    assert fields["attn_res_block_size"] == 2 and fields["first_k_dense_replace"] == 1
    fields, label, notes = config_fields("kimi-k3.1-pro")
    assert label.startswith("kimi-k3.1-pro (") and fields["model_type"] == "kimi_k3"
    assert "derived from kimi-k3" in notes[0]


def test_peft_lora_layers_are_swapped_for_lora_linear_unless_they_drop_out(promoted):
    import peft

    targets = ["q_proj", "o_proj", "kv_b_proj"]
    model = peft.get_peft_model(tiny_kimi(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    rows = {r.path.split("base_model.model.", 1)[1]: r for r in apply_workbench_kernels(model).rows}
    assert rows["model.layers.0.self_attn.q_proj"].blocks == ("lora_linear",)
    assert rows["model.layers.3.self_attn.kv_b_proj"].blocks == ("lora_linear",)
    assert "kv_b_proj is a peft.Linear (an adapter)" in rows["model.layers.3.self_attn"].reason  # runs as shipped
    assert rows["lm_head"].reason.startswith("the logits are the model's output")
    dropping = peft.get_peft_model(tiny_kimi(), peft.LoraConfig(r=4, target_modules=targets, lora_dropout=0.1))
    rows = {r.path.split("base_model.model.", 1)[1]: r for r in apply_workbench_kernels(dropping).rows}
    assert "LoRA dropout 0.1" in rows["model.layers.0.self_attn.q_proj"].reason


def test_deepseek_v3_swaps_mla_with_its_rotary_embedding_and_group_limited_routers(promoted):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from workbench.integrations.families import deepseek_v3

    full = DeepseekV3Config()
    fields = deepseek_v3.tiny(full, ["full_attention"] * 3, ["dense", "dense", "sparse"], 16, 2)
    assert (fields["n_group"], fields["topk_group"], fields["first_k_dense_replace"]) == (8, 4, 2)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**fields))
    report = apply_workbench_kernels(model)
    found = outcome(report)
    assert found["DeepseekV3Attention"] == ("mla", "mla_decode", "rotary")
    assert found["DeepseekV3TopkRouter"] == ("moe_router",)
    assert found["DeepseekV3Experts"] == ("moe_permute", "moe_grouped_gemm", "moe_combine")
    assert found["DeepseekV3MLP"] == ("swiglu",) and found["DeepseekV3RMSNorm"] == ("rmsnorm",)
    assert "rotary" in model.model.layers[0].self_attn.workbench_blocks and not any("rotary" in n for n in report.notes)
    # without rotary the rope parts go through transformers' function (rope_interleave: True), and the note says so
    kept = apply_workbench_kernels(DeepseekV3ForCausalLM(DeepseekV3Config(**fields)), blocks=["mla"])
    assert outcome(kept)["DeepseekV3Attention"] == ("mla",)
    assert any("apply_rotary_pos_emb_interleave" in note for note in kept.notes)


def test_qwen3_next_swaps_the_gated_delta_net_and_its_softmax_attention(promoted):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    from workbench.integrations.families import qwen3_next
    from workbench.integrations.parity import schedules

    full = Qwen3NextConfig()
    attention, mlp = schedules(full)
    assert attention[:4] == ["linear_attention"] * 3 + ["full_attention"] and set(mlp) == {"sparse"}
    fields = qwen3_next.tiny(full, attention[:4], mlp[:4], 16, 2)
    assert fields["linear_num_value_heads"] == 2 * fields["linear_num_key_heads"]  # Qwen3-Next's 32 / 16 kept
    report = apply_workbench_kernels(Qwen3NextForCausalLM(Qwen3NextConfig(**fields)))
    found = outcome(report)
    assert found["Qwen3NextGatedDeltaNet"] == ("kda_short_conv", "kda_gate", "kda_prologue", "kda")
    assert found["Qwen3NextRMSNorm"] == ("rmsnorm",) and found["Qwen3NextTopKRouter"] == ("moe_router",)
    assert found["Qwen3NextAttention"] == ("attention", "rotary") and found["Qwen3NextRMSNormGated"] == (
        "rmsnorm_gated",)


def test_glm_moe_dsa_swaps_the_indexer_where_a_layer_has_one_and_the_sparse_attention_everywhere(promoted):
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    from workbench.integrations.families import glm_moe_dsa

    full = GlmMoeDsaConfig(num_hidden_layers=8, index_topk_pattern="FSSFSSFS")
    fields = glm_moe_dsa.tiny(full, ["indexed_attention"] * 4, ["dense"] * 3 + ["sparse"], 16, 2)
    assert fields["indexer_types"] == ["full", "shared", "shared", "full"] and fields["index_topk"] == 8
    report = apply_workbench_kernels(GlmMoeDsaForCausalLM(GlmMoeDsaConfig(**fields)))
    rows = {r.path: r.blocks for r in report.rows if r.cls == "GlmMoeDsaAttention"}
    assert rows["model.layers.0.self_attn"] == ("dsa_indexer", "dsa_sparse_attention", "dsa_indexer_decode",
                                                "dsa_decode", "rotary", "layernorm")  # the indexer's key norm
    # a shared layer: the selection handed down, at a decode step too
    assert rows["model.layers.1.self_attn"] == ("dsa_sparse_attention", "dsa_decode", "rotary")
    assert outcome(report)["GlmMoeDsaTopkRouter"] == ("moe_router",)
    assert not any("apply_rotary_pos_emb_interleave" in note or "LayerNorm" in note for note in report.notes)
    only = apply_workbench_kernels(GlmMoeDsaForCausalLM(GlmMoeDsaConfig(**fields)), blocks=["dsa_sparse_attention"])
    assert any("apply_rotary_pos_emb_interleave for the indexer" in note for note in only.notes)
    kept = {r.path: r for r in only.rows if r.cls == "GlmMoeDsaAttention"}
    assert "dsa_indexer not in --blocks" in kept["model.layers.0.self_attn"].reason
    assert kept["model.layers.1.self_attn"].blocks == ("dsa_sparse_attention",)


def test_inkling2_swaps_the_residual_mixes_router_situ_experts_convolutions_and_attention(promoted):
    from transformers.models.inkling2 import modeling_inkling2 as ink

    from workbench.integrations.families import inkling2

    full = ink.Inkling2TextConfig(mlp_gate_softcap=3.0)
    attention, mlp = schedules(full)
    fields = inkling2.tiny(full, pick_layers(attention, 2), mlp[:2], 16, 2)
    assert fields["layer_types"] == ["hybrid_sliding", "hybrid"] and fields["n_layers_per_attn_res_block"] == 2
    model = ink.Inkling2ForCausalLM(ink.Inkling2TextConfig(**fields))
    found = outcome(apply_workbench_kernels(model))
    assert found["Inkling2BlockAttentionResidual"] == ("attnres",) and found["Inkling2RMSNorm"] == ("rmsnorm",)
    assert found["Inkling2TopKRouter"] == ("moe_router",)
    assert found["Inkling2Experts"] == ("moe_permute", "moe_grouped_gemm", "moe_combine")
    assert model.model.layers[0].mlp.experts.workbench_activation == ("situ", 3.0, 25.0)  # the config's soft caps
    for attention in ("Inkling2SlidingAttention", "Inkling2FullAttention"):  # per-token sinks, relative logits
        assert found[attention] == ("attention", "l2_clip", "rmsnorm")  # the clips and the values' norm around it
    assert model.config._attn_implementation == "workbench"  # 2D padding masks: a padded batch runs row by row
    # the residual short convolutions (after each sublayer; the sliding layer's keys and values) as kda_short_conv's
    # residual variant, the full layer's keys and values with per-token taps as its dynamic one; decode steps by its
    # serving form
    assert found["Inkling2ShortConvolution"] == ("kda_short_conv", "kda_short_conv_decode")
    assert found["Inkling2DynamicShortConvolution"] == ("kda_short_conv", "kda_short_conv_decode")
    other = ink.Inkling2ForCausalLM(ink.Inkling2TextConfig(**{**fields, "scoring_func": "tanh"}))
    assert "sigmoid scores" in outcome(apply_workbench_kernels(other))["Inkling2TopKRouter"]


def test_glm5_next_swaps_its_kda_layers_bounded_gate_clamped_mlps_experts_and_hyper_connections(promoted):
    """GLM-5-Next's class (vision-language; its text model patched, its vision tower not reported)."""
    from transformers.models.glm5_next import modeling_glm5_next as glm

    from workbench.integrations.families import glm5_next

    full, _ = load_config({"model_type": "glm5_next"})
    fields, schedule = tiny_config(full, 4)
    assert schedule == ["linear_attention"] * 3 + ["indexed_attention"] and fields["linear_lower_bound"] == -5.0
    config = glm.Glm5NextConfig(**fields)
    assert config.get_text_config().num_hidden_layers == 4 and config.vision_config.depth == 1
    model = glm.Glm5NextForConditionalGeneration(config)
    report = apply_workbench_kernels(model)
    found = outcome(report)
    assert found["Glm5NextTextLinearAttention"] == ("kda_short_conv", "kda_prologue", "kda", "kda_short_conv_decode",
                                                    "kda_decode")
    assert found["Glm5NextTextForgetGate"] == ("kda_gate",) and found["Glm5NextTextRMSNorm"] == ("rmsnorm",)
    assert found["Glm5NextTextTopkRouter"] == ("moe_router",)
    assert found["Glm5NextTextRMSNormGated"] == ("rmsnorm_gated",)  # Kimi Linear's output norm: sigmoid gate
    assert found["Glm5NextTextMLP"] == ("swiglu",)
    assert found["Glm5NextTextExperts"] == ("moe_permute", "moe_grouped_gemm", "moe_combine")
    assert found["Glm5NextTextAttention"] == ("dsa_kpool_indexer", "dsa_sparse_attention", "dsa_kpool_indexer_decode",
                                              "dsa_decode", "layernorm")
    assert found["Glm5NextTextHyperConnection"] == ("hyper_connection",)
    assert found["Glm5NextTextDecoderLayer"] == ("hyper_connection_mix",)  # the expand and mix after each sub-layer
    assert not any(row.path.startswith("model.visual") for row in report.rows)
    assert glm5_next.MODEL_CLASS == type(model).__name__
    assert model.config._experts_implementation == "workbench"
    experts = next(m for m in model.modules() if isinstance(m, glm.Glm5NextTextExperts))
    assert experts.workbench_activation == ("swiglu", 4.0, 25.0, config.get_text_config().swiglu_limit)


def assert_generates_alike(patched, shipped, ids, mask, table, new_tokens: int) -> None:
    """Greedy generate() of ``new_tokens`` from ``ids`` under ``mask`` (float64, transformers' float32 casts kept in
    float64): the patched model computing with the ops ``table`` gives the shipped model's tokens and logits."""
    from workbench.integrations.ops import computing_with
    from workbench.integrations.references import Float64Casts

    settings = {"attention_mask": mask, "max_new_tokens": new_tokens, "do_sample": False, "output_logits": True,
                "return_dict_in_generate": True}
    with torch.no_grad(), Float64Casts():
        with computing_with(table):
            got = patched.generate(ids, **settings)
        want = shipped.generate(ids, **settings)
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_glm5_next_decode_steps_take_the_serving_forms_unless_the_batch_is_padded(promoted):
    """GLM-5-Next's DSA layers (one full, one shared) greedily decoding 6 tokens after a 7-token prompt, the ops as
    their float64 references: an unpadded batch decodes through dsa_kpool_indexer_decode (the full layer) and
    dsa_decode (both); in a left-padded one the full layer runs the shipped attention (its indexer pools a row from
    its first real key) and the shared one dsa_decode over the selection handed down (cache positions, the padding
    never selected); both compute the shipped model's logits."""
    from collections import Counter

    from transformers.models.glm5_next import modeling_glm5_next as glm

    from workbench.integrations.ops import references

    full, _ = load_config({"model_type": "glm5_next"})
    fields, _ = tiny_config(full, 2)
    fields.update(layer_types=["indexed_attention"] * 2, mlp_layer_types=["dense"] * 2,
                  indexer_types=["full", "shared"])
    torch.manual_seed(0)
    shipped = glm.Glm5NextForConditionalGeneration(glm.Glm5NextConfig(**fields)).to(torch.float64).eval()
    patched = glm.Glm5NextForConditionalGeneration(glm.Glm5NextConfig(**fields)).to(torch.float64).eval()
    patched.load_state_dict(shipped.state_dict())
    apply_workbench_kernels(patched, blocks=["dsa_kpool_indexer", "dsa_sparse_attention", "dsa_kpool_indexer_decode",
                                             "dsa_decode"])
    calls: Counter = Counter()

    def counted(name, op):
        def run(*args, **kwargs):
            calls[name] += 1
            return op(*args, **kwargs)
        return run

    table = {name: counted(name, op) for name, op in references().items()}
    ids = torch.randint(0, fields["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(1))
    padded = torch.tensor([[0, 0] + [1] * 5, [1] * 7])
    for mask, full_steps, shared_steps in ((torch.ones(2, 7, dtype=torch.long), 5, 5), (padded, 0, 5)):
        calls.clear()
        assert_generates_alike(patched, shipped, ids, mask, table, 6)
        # 6 tokens: the prompt's prefill gives the first, 5 decode steps the others
        assert calls["dsa_kpool_indexer_decode"] == full_steps and calls["dsa_decode"] == full_steps + shared_steps


def test_inkling2_attention_through_the_block_computes_the_shipped_model_padded_or_not(promoted):
    """Inkling2's sliding and full attention (per-token sinks, relative logits over the window and over rel_extent) as
    workbench::attention, its L2 clips (the full layer's log scaling folded in) as workbench::l2_clip and its
    values' norm as workbench::rmsnorm, the ops as their float64 references: a training step's loss and every
    gradient, and a greedy generate over the cache of an unpadded and a left-padded batch (row by row) equal the
    shipped model's. The check can fail: relative logits one distance off move the logits by far more than the
    bound."""
    from workbench.blocks.attention import reference
    from workbench.integrations.ops import computing_with, references
    from workbench.integrations.references import Float64Casts

    shipped, patched, ids, (_, full_attention) = inkling2_trained_alike(["attention", "l2_clip", "rmsnorm"])
    assert full_attention == ("attention", "l2_clip", "rmsnorm")
    table = references()
    padded = torch.ones(2, 20, dtype=torch.long)
    padded[0, :3] = 0
    for mask in (torch.ones(2, 20, dtype=torch.long), padded):
        assert_generates_alike(patched, shipped, ids, mask, table, 4)

    def one_off(q, k, v, sinks, scale, window, softcap, rel=None):
        return reference(q, k, v, sinks, scale, window, softcap, None if rel is None else rel.roll(1, -1))
    with torch.no_grad(), Float64Casts(), computing_with({**table, "attention": one_off}):
        assert (patched(ids).logits - shipped(ids).logits).abs().max() > 1e-3


def test_inkling2_dynamic_convolutions_through_the_block_compute_the_shipped_model_padded_or_not(promoted):
    """The full layer's dynamic short convolutions (its keys and values, per-token taps from weight_proj) as
    kda_short_conv's dynamic variant, and their decode steps as kda_short_conv_decode's with each sequence's own
    taps, the ops as their float64 references: a training step's loss and every gradient, and a greedy generate over
    the cache of an unpadded batch and a left-padded one (its prompt through the shipped forward, whose padding
    masks the convolution's input) equal the shipped model's, the 3 decode steps of both through the serving form.
    The check can fail: the taps in the module's order (by backward distance) move the logits by far more than the
    bound."""
    from collections import Counter

    from workbench.blocks.kda_short_conv import reference
    from workbench.integrations.ops import computing_with, references
    from workbench.integrations.references import Float64Casts

    shipped, patched, ids, (dynamic, _) = inkling2_trained_alike(["kda_short_conv", "kda_short_conv_decode"])
    assert dynamic == ("kda_short_conv", "kda_short_conv_decode")
    dynamic_calls: Counter = Counter()

    def counted(name, op):
        def run(*args):
            dynamic_calls[name] += len(args) > 6 and args[6] is not None  # the taps, kda_short_conv_decode's last
            return op(*args)
        return run
    table = {**references(), "kda_short_conv_decode": counted("decode", references()["kda_short_conv_decode"])}
    padded = torch.ones(2, 20, dtype=torch.long)
    padded[0, :3] = 0
    for mask in (torch.ones(2, 20, dtype=torch.long), padded):
        dynamic_calls.clear()
        assert_generates_alike(patched, shipped, ids, mask, table, 4)
        assert dynamic_calls["decode"] == 2 * 3  # keys and values, each decode step

    def taps_reversed(x, weight, silu=True, residual_scale=None, taps=None):
        return reference(x, weight, silu, residual_scale, None if taps is None else taps.flip(-1))
    with torch.no_grad(), Float64Casts(), computing_with({**references(), "kda_short_conv": taps_reversed}):
        assert (patched(ids).logits - shipped(ids).logits).abs().max() > 1e-3


def inkling2_trained_alike(blocks: list[str]):
    """A tiny Inkling2 (inkling2_tiny) twice in float64, the second patched with ``blocks``: a training step on a
    20-token batch, the ops as their float64 references, gives the shipped logits and every parameter's gradient.
    Returns (shipped, patched, the batch's ids, the blocks computing the full layer's dynamic key convolution and
    its attention)."""
    from transformers.models.inkling2 import modeling_inkling2 as ink

    from workbench.integrations.ops import computing_with, references
    from workbench.integrations.references import Float64Casts

    def config():
        made = ink.Inkling2TextConfig(**fields)
        made._experts_implementation = "eager"  # grouped_mm has no float64
        return made
    fields = inkling2_tiny(ink.Inkling2TextConfig())
    torch.manual_seed(0)
    shipped = ink.Inkling2ForCausalLM(config()).to(torch.float64).eval()
    patched = ink.Inkling2ForCausalLM(config()).to(torch.float64).eval()
    patched.load_state_dict(shipped.state_dict())
    with torch.no_grad():  # the dynamic convolutions' static taps start at zero: give them some
        for model in (shipped, patched):
            for module in model.modules():
                if isinstance(module, ink.Inkling2DynamicShortConvolution):
                    module.static_weight.copy_(torch.randn(module.static_weight.shape,
                                                           generator=torch.Generator().manual_seed(2)) / 2)
    rows = {row.path: row.blocks for row in apply_workbench_kernels(patched, blocks=blocks).rows}
    ids = torch.randint(0, fields["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(1))
    with Float64Casts():
        with computing_with(references()):
            got = patched(ids, labels=ids)
            got.loss.backward()
        want = shipped(ids, labels=ids)
        want.loss.backward()
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-10, atol=1e-10)
    for (name, a), b in zip(patched.named_parameters(), shipped.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-8, atol=1e-10, msg=name)
    return shipped, patched, ids, (rows["model.layers.1.self_attn.k_sconv"], rows.get("model.layers.1.self_attn"))


def inkling2_tiny(full) -> dict:
    """A two-layer tiny Inkling2 (a sliding layer, a full one; window 8, rel_extent 16) with a 20-token batch: the
    relative logits stop short of the full layer's earliest keys and the window slides."""
    from workbench.integrations.families import inkling2

    attention, mlp = schedules(full)
    fields = inkling2.tiny(full, pick_layers(attention, 2), mlp[:2], 16, 2)
    assert fields["layer_types"] == ["hybrid_sliding", "hybrid"] and fields["rel_extent"] == 16
    return fields


def test_glm5_next_text_model_loaded_alone_is_named_and_run_through_the_vision_language_class():
    """``glm5_next_text`` is registered to GLM-5-Next's family (its patch: tests/kernels/test_kernels.py); a parity
    of GLM-5-Next reads its text model, and runs it through the vision-language class (the text model has no LM
    head of its own)."""
    from workbench.integrations.families import glm5_next
    from workbench.integrations.transformers import FAMILIES, family

    assert family("glm5_next_text") is glm5_next and "glm5_next" in FAMILIES
    assert config_fields("glm5_next")[0] == {"model_type": "glm5_next_text"}
    assert glm5_next.MODEL_TYPE == "glm5_next" and glm5_next.MODEL_CLASS == "Glm5NextForConditionalGeneration"


def test_a_multimodal_source_gives_its_text_model_where_that_is_registered(tmp_path):
    fields, _, notes = config_fields("inkling2")
    assert fields == {"model_type": "inkling2_text"} and "inkling2_text" in notes[0]
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "inkling2", "text_config": {"model_type": "inkling2_text",
                                                                            "num_hidden_layers": 12}}))
    fields, _, _ = config_fields(str(config))
    assert fields == {"model_type": "inkling2_text", "num_hidden_layers": 12}
    from workbench.integrations.class_view import class_view

    view = class_view(json.loads(config.read_text()))  # onboarding reads it as parity does
    assert view.model_class == "Inkling2ForCausalLM" and view.prefix == "text_config."


def test_a_dsa_selection_converts_to_transformers_top_k_form_and_back():
    """The -1 padded selection of dsa_indexer and transformers' int32 top-k (rows t < k - 1 run on into future
    positions, which the causal mask hides) carry the same causal keys, both ways."""
    from workbench.blocks._dsa import causal_topk
    from workbench.integrations.families._dsa import from_shipped, to_shipped

    torch.manual_seed(0)
    scores = torch.randn(2, 12, 12).masked_fill(~torch.ones(12, 12, dtype=torch.bool).tril(), float("-inf"))
    ours = causal_topk(scores, 5)
    theirs = scores.masked_fill(scores.isinf(), torch.finfo(torch.float32).min).topk(5, dim=-1).indices.int()
    shipped = to_shipped(ours)
    assert shipped.dtype == torch.int32 and (shipped.sort(-1).values[:, 4:] == theirs.sort(-1).values[:, 4:]).all()
    rows = torch.arange(12)[None, :, None]
    assert (shipped >= 0).all() and all(len(set(r.tolist())) == 5 for r in shipped.reshape(-1, 5))
    causal = lambda ix: [sorted(i for i in r if 0 <= i <= t) for t, r in enumerate(ix[0].tolist())]  # noqa: E731
    assert causal(shipped) == causal(theirs) == causal(ours)
    back = from_shipped(theirs)
    assert back.dtype == torch.int64 and ((back == -1) == (theirs.long() > rows)).all()
    assert causal(back) == causal(ours)


def test_a_decode_selection_converts_to_cache_positions_and_back():
    """A decode step's selection over its visible keys (0 .. L, this step's token L, -1 padded) and transformers'
    top-k over the whole cache (positions the mask hides fill what the visible keys cannot), both ways."""
    from workbench.integrations.families._dsa import from_cache_positions, to_cache_positions

    visible = torch.tensor([[True] * 5, [False, False, True, True, True]])  # the second prompt left-padded by 2
    ours = torch.tensor([[5, 0, 3, 1, 2, 4, -1], [3, 0, 2, 1, -1, -1, -1]], dtype=torch.int32)  # L = 5 and 3, top 7
    cache = to_cache_positions(ours, visible, topk=7)
    assert cache.dtype == torch.int32 and cache.shape == (2, 6)  # min(top 7, 6 cache positions)
    assert cache.tolist() == [[5, 0, 3, 1, 2, 4], [5, 2, 4, 3, 0, 1]]  # the hidden positions fill the second row
    assert from_cache_positions(cache, visible).tolist() == [[5, 0, 3, 1, 2, 4], [3, 0, 2, 1, -1, -1]]
    top2 = to_cache_positions(ours[:, :2], visible, topk=2)
    assert top2.tolist() == [[5, 0], [5, 2]] and from_cache_positions(top2, visible).tolist() == [[5, 0], [3, 0]]


def test_a_block_swapped_in_that_never_ran_fails_the_parity():
    """A module whose patched forward fell back to the shipped one (a cache, a mask, an adapter) computes as shipped:
    its numbers agree, and only the op run count shows the block never ran. judge fails the run and names it."""
    from workbench.integrations.parity import ParityResult, judge

    metrics = {"kl": 1e-15, "cosine": 1.0, "top1": 1.0, "top5": 1.0, "loss_rel": 0.0, "grad_rel_worst": 1e-7,
               "idle_blocks": ["kda", "mla"]}
    result = ParityResult(source="x", model_type="kimi_linear", model_class="K", dtype="float32", backend="cpu",
                          layers=[], tokens=16, metrics=metrics)
    judge(result)
    assert result.status == "fail" and [c["metric"] for c in result.checks if not c["ok"]] == ["idle_blocks"]
    assert result.message == "swapped in but never ran (their modules ran the shipped forward): kda, mla"
    result.metrics["idle_blocks"] = []
    judge(result)
    assert result.status == "pass" and result.message == "every check within the float32 bounds"


def test_a_gradient_past_its_bound_is_held_to_float64_at_the_shipped_float32s_own_error():
    """Where the shipped float32 gradient is itself far from float64 (an ill-conditioned sum), a patched one that is
    as far from float64, no further, passes; the worst gradient's check against the shipped float32 is replaced."""
    import torch

    from workbench.integrations.parity import ParityResult, judge
    from workbench.integrations.parity_child import truth_metrics

    class Two(torch.nn.Module):
        def __init__(self, a, b):
            super().__init__()
            self.a, self.b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
            self.a.grad, self.b.grad = torch.tensor(a), torch.tensor(b)

    truth = {"a": torch.tensor([1.0, 0.0], dtype=torch.float64), "b": torch.tensor([1.0, 0.0], dtype=torch.float64)}
    shipped = Two([1.0, 0.01], [1.0, 0.0])  # a: the shipped float32 is 1e-2 off float64 there
    within = truth_metrics(shipped, Two([1.0, -0.008], [1.0, 1e-4]), truth, bound=1e-3)
    assert set(within["grad_truth"]) == {"a"}  # b is within 1e-3 of the shipped one: not held to float64
    assert within["grad_truth"]["a"]["shipped"] == pytest.approx(1e-2)
    assert within["grad_truth_ratio"] == pytest.approx(0.8)
    beyond = truth_metrics(shipped, Two([1.0, 0.03], [1.0, 0.0]), truth, bound=1e-3)
    assert beyond["grad_truth_ratio"] == pytest.approx(3.0) and beyond["grad_truth_worst"] == "a"
    for found, status in ((within, "pass"), (beyond, "fail")):
        metrics = {"kl": 1e-15, "cosine": 1.0, "top1": 1.0, "top5": 1.0, "loss_rel": 0.0, "grad_rel_worst": 1e-2,
                   **found}
        result = ParityResult(source="x", model_type="qwen3_next", model_class="Q", dtype="float32", backend="cpu",
                              layers=[], tokens=16, metrics=metrics)
        judge(result)
        assert result.status == status and "grad_rel_worst" not in [c["metric"] for c in result.checks]


def test_an_empty_cache_is_a_prefill_and_a_filled_one_is_not():
    from transformers import DynamicCache

    from workbench.integrations.families._common import empty_cache

    config = tiny_kimi().config
    cache = DynamicCache(config=config)
    attention = config.layer_types.index("full_attention")
    linear = config.layer_types.index("linear_attention")
    assert empty_cache(None, 0) and empty_cache(cache, attention) and empty_cache(cache, linear)
    cache.update(torch.zeros(1, 1, 3, 8), torch.zeros(1, 1, 3, 4), attention)
    cache.update_conv_state(torch.zeros(1, 6, 3), linear, conv_kernel_size=4)
    assert not empty_cache(cache, attention) and not empty_cache(cache, linear)


def test_rotary_as_op_holds_in_its_own_thread_whatever_the_order_of_entry_and_exit():
    """workbench::rotary runs for a module's apply_rotary_pos_emb calls inside rotary_as_op, in that thread only:
    another thread meanwhile runs the shipped rotation, and when the blocks of two threads exit in the other order
    than they entered, the file's function still computes the shipped rotation after (a swap of the module
    attribute for the block's length put its own function back in the first exit and left the patched one in the
    second)."""
    import threading

    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama

    from workbench.integrations.families._common import rotary_as_op
    from workbench.integrations.ops import computing_with, references

    module = modeling_llama.LlamaAttention(LlamaConfig(hidden_size=32, num_attention_heads=2, head_dim=16), 0)
    module.workbench_blocks = ("rotary",)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 5, 16, generator=g), torch.randn(1, 2, 5, 16, generator=g)
    angles = torch.randn(1, 5, 8, generator=g).repeat(1, 1, 2)
    cos, sin = angles.cos(), angles.sin()
    shipped_q, _ = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    calls = []
    table = {**references(), "rotary": lambda *args: calls.append(threading.get_ident()) or
             references()["rotary"](*args)}
    inside, leave_first = threading.Event(), threading.Event()
    seen = {}

    def first():
        with computing_with(table), rotary_as_op(module):
            inside.set()
            leave_first.wait(10)
            seen["first"] = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)[0]

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(10)
    with computing_with(table):
        outside, _ = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)  # this thread is outside the block
        assert calls == [] and torch.equal(outside, shipped_q)
        with rotary_as_op(module):
            leave_first.set()
            thread.join(10)  # the first block exits while this one is open
            ours, _ = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    assert calls == [thread.ident, thread.ident, threading.get_ident(), threading.get_ident()]  # q and k each
    torch.testing.assert_close(ours, shipped_q) and torch.testing.assert_close(seen["first"], shipped_q)
    after, _ = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(after, shipped_q) and len(calls) == 4
