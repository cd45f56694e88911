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
from workbench.integrations.parity import config_fields, load_config, pick_layers, tiny_config
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
    assert found["KimiLinearTopkRouter"] == ("moe_router",) and found["KimiLinearAttention"] == ("mla",)
    assert found["KimiLinearExperts"] == ("moe_permute", "moe_grouped_gemm", "moe_combine")
    assert found["KimiLinearDeltaAttention"] == ("kda_short_conv", "kda")
    assert found["KimiLinearForgetGate"] == ("kda_gate",)
    assert "no block" in found["KimiLinearRMSNormGated"]
    assert model.config._experts_implementation == "workbench"
    # norms, MLPs, routers, experts, MLA, KDA, forget gates
    assert sum(r.replaced for r in report.rows) == 10 + 4 + 3 + 3 + 1 + 3 + 3
    assert any("l2norm" in note for note in report.notes)
    norm = model.model.norm
    assert norm.forward != norm.original_forward and "weight" in dict(norm.named_parameters())


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
    finally:
        wk.set_operators_dir(None)


def test_unknown_families_and_blocks_are_one_line_errors(promoted):
    with pytest.raises(WorkbenchError, match="no workbench kernels for model_type 'llama'"):
        apply_workbench_kernels(_llama())
    with pytest.raises(WorkbenchError, match="unknown block 'nope'"):
        apply_workbench_kernels(tiny_kimi(), blocks=["nope"])


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


def test_k3s_card_reads_its_text_config_and_says_what_the_class_cannot_compute():
    fields, label, notes = config_fields("kimi-k3")
    assert fields["model_type"] == "kimi_linear" and label.startswith("kimi-k3 (")
    full, more = load_config(fields)
    assert full.hidden_act == "silu" and full.num_local_experts == 896
    assert any("hidden_act 'situ'" in n and "does not cover" in n for n in more)
    assert any("KimiLinearConfig does not read" in n and "attn_res_block_size" in n for n in more)
    fields, label, notes = config_fields("kimi-k3.1-pro")
    assert label.startswith("kimi-k3.1-pro (")
    assert "derived from kimi-k3" in notes[0] and "no published class" in notes[0]


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
    assert found["DeepseekV3Attention"] == ("mla",) and found["DeepseekV3TopkRouter"] == ("moe_router",)
    assert found["DeepseekV3Experts"] == ("moe_permute", "moe_grouped_gemm", "moe_combine")
    assert found["DeepseekV3MLP"] == ("swiglu",) and found["DeepseekV3RMSNorm"] == ("rmsnorm",)
    assert any("apply_rotary_pos_emb_interleave" in note for note in report.notes)  # rope_interleave: True


def test_qwen3_next_swaps_the_gated_delta_net_and_leaves_softmax_attention_alone(promoted):
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
    assert found["Qwen3NextGatedDeltaNet"] == ("kda_short_conv", "kda_gate", "kda")
    assert found["Qwen3NextRMSNorm"] == ("rmsnorm",) and found["Qwen3NextTopKRouter"] == ("moe_router",)
    assert "no block" in found["Qwen3NextAttention"] and "no block" in found["Qwen3NextRMSNormGated"]
