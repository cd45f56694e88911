"""`workbench parity kimi-k3`: K3's text model (workbench.kimi_k3, K3's published serving code in torch: the blocks'
references) against the same model with every promoted operator swapped in by apply_workbench_kernels, on a tiny
instance of the published config (the kernels on the Triton interpreter in a child process): forward, every
gradient, decode steps over the serving caches and greedy generate() on left-padded prompts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.cli import app

pytestmark = [pytest.mark.interpreter, pytest.mark.slow]
runner = CliRunner()
OPERATORS = Path(__file__).parents[2] / "operators"
K3_BLOCKS = ["attnres", "kda", "kda_decode", "kda_gate", "kda_prefill", "kda_prologue", "kda_short_conv",
             "kda_short_conv_decode", "kda_short_conv_prefill", "mla", "mla_decode", "mla_prefill", "moe_combine",
             "moe_grouped_gemm", "moe_permute", "moe_router", "rmsnorm", "rmsnorm_gated", "situ"]


def test_kimi_k3_with_every_promoted_operator_computes_k3_as_published(settings):
    shutil.copytree(OPERATORS, settings.operators_dir)
    result = runner.invoke(app, ["parity", "kimi-k3", "--tokens", "16", "--generate", "4", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])
    m = report["metrics"]
    assert report["status"] == "pass" and report["model_class"] == "KimiK3ForCausalLM"
    assert report["model_type"] == "kimi_k3" and report["layers"] == ["kda", "kda", "kda", "mla"]
    assert report["config"]["attn_res_block_size"] == 2 and report["config"]["hidden_act"] == "situ"
    assert report["patch"]["blocks"] == K3_BLOCKS
    left = {row["class"] for row in report["patch"]["modules"] if not row["blocks"]}
    assert left == {"Embedding", "Linear"}  # the embedding and the logits head: nothing K3 computes stays in torch
    assert m["kl"] < 1e-8 and m["top1"] == 1.0 and m["router_match"] == 1.0 and m["loss_rel"] < 1e-5
    assert 0 < m["logits_rel"] < 1e-5 and m["grad_rel_worst"] < 1e-3 and m["grad_params"] > 100
    assert m["idle_blocks"] == [] and m["first_divergence"] is None
    runs = m["op_runs"]  # the training forward: every layer's AttnRes pair and the final one, K3's dense first MLP
    assert runs["attnres"] == 2 * 4 + 1 and runs["kda"] == runs["rmsnorm_gated"] == 3 and runs["mla"] == 1
    assert runs["situ"] == 1 + 3 and runs["moe_router"] == 3  # the dense layer 0; three MoE layers' shared experts
    decode = m["decode_op_runs"]  # a prefill through the serving forms, then 4 decode steps over the caches
    assert (decode["kda_prefill"], decode["mla_prefill"], decode["kda_decode"], decode["mla_decode"]) == (3, 1, 12, 4)
    assert m["decode_kl"] < 1e-8 and m["decode_top1"] == 1.0
    assert m["generate_match"] == 1.0 and m["generate_kl"] < 1e-8
    assert m["generate_op_runs"]["kda_decode"] == 3 * 3 and m["generate_op_runs"]["mla_decode"] == 3
