"""The vLLM stage: the plugin inside vLLM's own model code (workbench/integrations/vllm_plugin.py) and
``workbench parity --engine vllm`` (workbench/integrations/vllm_parity.py). The served runs need the vLLM venv that
scripts/setup-vllm.sh sets up (`make test` runs it); without it they skip, naming the script."""

from __future__ import annotations

import pytest

from workbench.errors import WorkbenchError
from workbench.integrations import vllm_plugin
from workbench.integrations.parity import ParityResult
from workbench.integrations.vllm_parity import (
    MXFP4,
    PROMPTS,
    TINY,
    child_env,
    compare,
    engine_args,
    judge_served,
    run_vllm_parity,
    vllm_layers,
    vllm_python,
)
from workbench.vocabulary import ParityStatus


def served(tokens: list[list[int]], logprobs: list[list[float]], runs: dict, replaced: dict,
           built: dict | None = None) -> dict:
    """A serve answer as workbench.integrations.vllm_child gives it (every replaced class built once by default)."""
    return {"sequences": [{"tokens": t, "logprobs": p} for t, p in zip(tokens, logprobs, strict=True)],
            "op_runs": runs, "replaced": replaced, "fallbacks": {}, "plugin": bool(replaced),
            "built": {name: 1 for name in replaced} if built is None else built}


def result_of(metrics: dict) -> ParityResult:
    result = ParityResult(source="llama", model_type="llama", model_class="vllm llama", dtype="float32",
                          backend="vllm-cpu", layers=[], tokens=3)
    result.metrics = metrics
    judge_served(result)
    return result


def test_the_plugin_is_off_unless_the_setting_turns_it_on(monkeypatch):
    monkeypatch.delenv(vllm_plugin.ENABLE, raising=False)
    vllm_plugin.register()  # vLLM calls it in every process it starts: off, it imports nothing of vLLM
    assert vllm_plugin.REPLACED == {} and not vllm_plugin.enabled()
    monkeypatch.setenv(vllm_plugin.ENABLE, "1")
    assert vllm_plugin.enabled()


def test_the_comparison_stops_at_the_first_differing_token_and_fails_it():
    ours = {"RMSNorm": ["rmsnorm"], "SiluAndMul": ["swiglu"]}
    shipped = served([[5, 6, 7], [8, 9, 10]], [[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]], {}, {})
    same = compare(shipped, served([[5, 6, 7], [8, 9, 10]], [[-1.0, -2.0 + 3e-7, -3.0], [-1.0, -1.0, -1.0]],
                                   {"rmsnorm": 12, "swiglu": 6}, ours))
    assert same["generate_match"] == 1.0 and same["generate_first_mismatch"] is None
    assert same["logprob_dev_per_step"] == pytest.approx([0.0, 3e-7, 0.0], abs=1e-12)
    assert result_of(same).status == ParityStatus.PASS
    # the second prompt's step 1 differs: its later steps (other inputs) are not compared
    differ = compare(shipped, served([[5, 6, 7], [8, 4, 11]], [[-1.0, -2.0, -3.0], [-1.0, -1.5, -9.0]],
                                     {"rmsnorm": 12, "swiglu": 6}, ours))
    assert differ["generate_match"] == 0.5 and differ["generate_first_mismatch"] == 1
    assert differ["logprob_dev_per_step"] == [0.0, 0.5, 0.0]
    failed = result_of(differ)
    assert failed.status == ParityStatus.FAIL and "generate_match" in failed.message


def test_a_plugin_that_did_not_load_or_an_op_that_never_ran_fails_the_run():
    shipped = served([[5, 6]], [[-1.0, -2.0]], {}, {})
    unloaded = result_of(compare(shipped, served([[5, 6]], [[-1.0, -2.0]], {}, {})))
    assert unloaded.status == ParityStatus.FAIL and "replaced no vLLM class" in unloaded.message
    replaced = {"RMSNorm": ["rmsnorm"], "SiluAndMul": ["swiglu"],
                "UnquantizedFusedMoEMethod": ["moe_permute", "moe_grouped_gemm", "moe_combine"]}
    idle = result_of(compare(shipped, served([[5, 6]], [[-1.0, -2.0]], {"rmsnorm": 4}, replaced,
                                             {"RMSNorm": 5, "SiluAndMul": 2})))
    # the experts' replacement was never built (a dense model): not idle; the activation was built and never ran
    assert idle.status == ParityStatus.FAIL and idle.metrics["idle_blocks"] == ["swiglu"]
    # experts built that handed every call back (a case they do not cover, counted): not idle, said as a fallback
    handed_back = served([[5, 6]], [[-1.0, -2.0]], {"rmsnorm": 4, "swiglu": 2}, replaced,
                         {"RMSNorm": 5, "SiluAndMul": 2, "UnquantizedFusedMoEMethod": 1})
    handed_back["fallbacks"] = {"UnquantizedFusedMoEMethod": 1}
    fallback = result_of(compare(shipped, handed_back))
    assert fallback.status == ParityStatus.PASS and fallback.metrics["idle_blocks"] == []
    assert fallback.metrics["fallbacks"] == {"UnquantizedFusedMoEMethod": 1}


def test_an_unknown_model_or_dtype_is_one_clear_error():
    with pytest.raises(WorkbenchError, match="no tiny vLLM model for 'gpt2'"):
        run_vllm_parity("gpt2")
    with pytest.raises(WorkbenchError, match=r"no tiny vLLM model for 'llama-mxfp4' \(known: .*deepseek_v3-mxfp4\)"):
        run_vllm_parity("llama" + MXFP4)  # no routed experts to publish in MXFP4
    with pytest.raises(WorkbenchError, match="float32"):
        run_vllm_parity("llama", dtype="bfloat16")
    with pytest.raises(WorkbenchError, match="runs on cpu or cuda, not 'rocm'"):
        run_vllm_parity("llama", device="rocm")
    # KDA through vLLM is a GPU's: refused on CPU in one line that names where vLLM's CPU build stops
    with pytest.raises(WorkbenchError, match=r"kimi_linear: vLLM's CPU build .*platforms/cpu.py:685.*--backend cuda"):
        run_vllm_parity("kimi_linear")


def test_on_a_gpu_the_operators_compile_and_softmax_attention_takes_vllms_custom_backend(tmp_path, monkeypatch):
    """What a GPU run changes (bench/gpu_check.sh runs it where vLLM's CUDA build is installed): no Triton
    interpreter in the children, softmax attention through the plugin's backend under the name CUSTOM, MLA and KDA
    on vLLM's own GPU backends; on CPU, DeepSeek-V3's MLA on the CPU_MLA backend the plugin replaces."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # as the suite's own environment may have it
    assert child_env(str(tmp_path), tmp_path, "cpu")["TRITON_INTERPRET"] == "1"
    assert child_env(str(tmp_path), tmp_path, "cpu")["TORCH_COMPILE_DISABLE"] == "1"
    assert "TRITON_INTERPRET" not in child_env(str(tmp_path), tmp_path, "cuda")
    assert engine_args("llama", "cuda") == engine_args("gpt_oss", "cuda") == {"attention_config": {"backend": "CUSTOM"}}
    assert engine_args("deepseek_v3", "cuda") == engine_args("kimi_linear", "cuda") == {}
    assert engine_args("deepseek_v3", "cpu") == {"attention_config": {"backend": "CPU_MLA"}}
    assert engine_args("llama", "cpu") == {}


def test_the_cli_names_an_unknown_engine_in_one_line(settings):
    from typer.testing import CliRunner

    from workbench.cli import app

    result = CliRunner().invoke(app, ["parity", "llama", "--engine", "sglang"])
    assert result.exit_code == 2 and "unknown engine 'sglang' (transformers or vllm)" in result.output


def vllm_or_skip() -> None:
    try:
        vllm_python()
    except WorkbenchError as exc:
        pytest.skip(f"the vLLM stage: {exc}")


PER_FORWARD = {
    # gpt_oss: two norms a layer and the final one (its experts hand their calls back, below)
    "gpt_oss": {"rmsnorm": 2 * 2 + 1},
    # deepseek_v3: four norms a layer (input, post-attention, MLA's q_a and kv_a latents) and the final one; the
    # dense layer's activation and the MoE layer's shared expert's; the MoE layer's routing and routed experts
    "deepseek_v3": {"rmsnorm": 2 * 4 + 1, "swiglu": 2, "moe_topk": 1, "moe_permute": 1, "moe_grouped_gemm": 1,
                    "moe_combine": 1},
    # the same with the routed experts in MXFP4 (against them dequantized as shipped)
    "deepseek_v3-mxfp4": {"rmsnorm": 2 * 4 + 1, "swiglu": 2, "moe_topk": 1, "moe_permute": 1,
                          "moe_grouped_gemm_mxfp4": 1, "moe_combine": 1},
}
ATTENTION = {
    # gpt_oss: each softmax-attention layer (CPU_ATTN: sinks, the first with a window of 4) once in the prefill of both
    # prompts, then once a decode step
    "gpt_oss": ({"attention_prefill": 2}, {"attention_decode": 2}),
    # deepseek_v3: each MLA layer (CPU_MLA) the same, its prefill in the absorbed form
    "deepseek_v3": ({"mla_prefill": 2}, {"mla_decode": 2}),
    "deepseek_v3-mxfp4": ({"mla_prefill": 2}, {"mla_decode": 2}),
}
"""The attention backends' ops: (runs in the prefill, runs a decode step)."""
BUILT = {"gpt_oss": {"RMSNorm": 5, "CPU_ATTN": 2, "UnquantizedFusedMoEMethod": 2},
         "deepseek_v3": {"RMSNorm": 9, "SiluAndMul": 2, "UnquantizedFusedMoEMethod": 1, "CPU_MLA": 2},
         "deepseek_v3-mxfp4": {"RMSNorm": 9, "SiluAndMul": 2, "CompressedTensorsW4A4Mxfp4MoEMethod": 1, "CPU_MLA": 2}}
"""The instances of each replacement vLLM's model code builds."""
FALLBACKS = {"gpt_oss": {"UnquantizedFusedMoEMethod": 2}}
"""The calls handed back to vLLM: GPT-OSS's experts are biased clamped alpha-SwiGLU (one fallback a MoE layer, at
load)."""


@pytest.mark.slow
@pytest.mark.interpreter
@pytest.mark.parametrize("model_type", sorted(PER_FORWARD))
def test_a_model_served_by_vllm_with_the_plugin_computes_what_vllm_computes_as_shipped(model_type):
    vllm_or_skip()
    new_tokens = 8
    result = run_vllm_parity(model_type, new_tokens=new_tokens)
    m = result.metrics
    assert result.status == ParityStatus.PASS, result.message
    assert m["generate_match"] == 1.0 and m["generate_first_mismatch"] is None
    assert m["logprob_dev"] <= 1e-4 and len(m["logprob_dev_per_step"]) == new_tokens
    assert m["replaced"] == {"RMSNorm": ["rmsnorm"], "SiluAndMul": ["swiglu"], "SituAndMul": ["situ"],
                             "UnquantizedFusedMoEMethod": ["moe_topk", "moe_permute", "moe_grouped_gemm",
                                                           "moe_combine"],
                             "CompressedTensorsW4A4Mxfp4MoEMethod": ["moe_topk", "moe_permute",
                                                                     "moe_grouped_gemm_mxfp4", "moe_combine"],
                             "CPU_ATTN": ["attention_prefill", "attention_decode"],
                             "CPU_MLA": ["mla_prefill", "mla_decode"]}
    assert m["built"] == BUILT[model_type] and m["fallbacks"] == FALLBACKS.get(model_type, {})
    # every forward ran ours: one prefill of both prompts, then a decode step per new token but the last, the
    # attention over vLLM's paged caches as one packed prefill, then decode steps
    prefill, decode = ATTENTION[model_type]
    runs = {block: new_tokens * n for block, n in PER_FORWARD[model_type].items()}
    runs |= prefill | {block: (new_tokens - 1) * n for block, n in decode.items()}
    assert m["op_runs"] == runs
    assert m["shipped_op_runs"] == {}  # with the setting off, vLLM ran as shipped
    # llama (served by the CLI) is GPT-OSS's full-attention layer without sinks, with SiluAndMul (deepseek_v3's):
    # kept out of the suite for its time
    assert len(PROMPTS) == 2 and set(PER_FORWARD) == set(ATTENTION) == {*TINY, "deepseek_v3" + MXFP4} - {"llama"}


@pytest.mark.interpreter
def test_kimi_k3s_situ_and_vllms_router_run_the_operators_as_vllm_computes():
    """SituAndMul as K3's serving code builds it (beta 4, linear_beta 25) is the plugin's class, loaded by vLLM's
    plugin loader, and computes vLLM's own forward on inputs past both clips; without linear_beta it hands the call
    back to vLLM. (K3's MLPs run only on a GPU in vLLM: no CPU model builds the class.) The plugin's routing
    (moe_topk) chooses vLLM's router's experts with its weights, K3's 16 of 896 and DeepSeek-V4's sqrt(softplus)
    scores included."""
    vllm_or_skip()
    found = vllm_layers()
    layers = found["layers"]
    assert {name: layer["class"] for name, layer in layers.items()} == {
        "situ": "WorkbenchSituAndMul", "situ_unclipped": "WorkbenchSituAndMul", "silu": "WorkbenchSiluAndMul"}
    assert layers["situ"]["deviation"] < 1e-6 and layers["silu"]["deviation"] < 1e-6 and found["past_clips"] > 0.3
    assert layers["situ_unclipped"]["deviation"] == 0.0  # vLLM's own forward
    routing = found["routing"]
    assert set(routing) == {"kimi_k3", "deepseek_v3", "qwen3_moe", "deepseek_v2_lite", "deepseek_v4"}
    assert all(r["same_experts"] and r["deviation"] < 1e-6 for r in routing.values()), routing
    assert found["op_runs"] == {"situ": 1, "swiglu": 1, "moe_topk": 5} and found["fallbacks"] == {"SituAndMul": 1}
