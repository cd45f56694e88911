"""Parity inside a serving engine: a tiny random-weight model served by vLLM's own model code as shipped and with the
workbench's vLLM plugin on (workbench/integrations/vllm_plugin.py), the same prompts greedily decoded by both;
the tokens, each step's log-probability of its token, and the ops that ran are compared.

    model_type (one of TINY) -> a child in the vLLM venv saves the random model (transformers' class, a seed)
      -> the same child serves it with WORKBENCH_VLLM=0 (vLLM as shipped), another with WORKBENCH_VLLM=1 (the plugin)
      -> ParityResult: generate_match (the share of prompts whose tokens are all the shipped engine's),
         logprob_dev (the largest |log p shipped - log p patched| of a step's token, up to the first differing
         token), the ops' run counts; a plugin that replaced nothing, or a block of a replacement vLLM built that never
         ran, fails

vLLM pins transformers below the project's, so the children run in the vLLM stage's own venv (``.venv-vllm``,
scripts/setup-vllm.sh; ``$WORKBENCH_VLLM_PYTHON`` names another interpreter). On CPU the operators run through the
Triton interpreter (TRITON_INTERPRET=1) and vLLM through its CPU build; with ``device="cuda"`` the children are a
vLLM CUDA build's interpreter ($WORKBENCH_VLLM_PYTHON, the project installed there: its entry point) and the
operators compile (``bench/gpu_check.sh``).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.integrations.parity import ParityResult, judge
from workbench.integrations.vllm_child import MARK
from workbench.vocabulary import ParityStatus

TINY: dict[str, dict[str, Any]] = {
    # vLLM's CPU attention takes head_dim 32 and up
    "llama": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512, "max_position_embeddings": 256,
              "tie_word_embeddings": False},
    # GPT-OSS: per-head sinks, a sliding window of 4 on the first layer (the prompts are longer), full attention on the
    # second; its experts (biased, clamped alpha-SwiGLU) hand their calls back to vLLM's own kernel
    "gpt_oss": {"hidden_size": 128, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
                "vocab_size": 512, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
                "max_position_embeddings": 256, "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1,
                "eos_token_id": 2},
    # MLA at vLLM's CPU MLA sizes (latent 512 + rope 64, its only ones), a dense layer then a MoE one with a shared
    # expert; noaux_tc routing (the correction bias loads only then)
    "deepseek_v3": {"hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64, "num_hidden_layers": 2,
                    "first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 2,
                    "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
                    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 512,
                    "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32, "vocab_size": 512,
                    "max_position_embeddings": 256, "tie_word_embeddings": False},
}
"""The tiny models vLLM's CPU path serves, per transformers model_type: their config fields."""
GPU_ONLY: dict[str, tuple[dict[str, Any], str]] = {
    # Kimi Linear with KDA layers only (two), a dense layer then a MoE one with a shared expert: vLLM runs KDA through
    # Triton on a GPU only
    "kimi_linear": ({"hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32,
                     "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1,
                     "first_k_dense_replace": 1, "vocab_size": 512, "max_position_embeddings": 256,
                     "linear_attn_config": {"kda_layers": [1, 2], "full_attn_layers": [], "num_heads": 4,
                                            "head_dim": 32, "short_conv_kernel_size": 4},
                     "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
                    "vLLM's CPU build cannot start a KDA model: platforms/cpu.py:685 rebinds vLLM's Triton kernels to "
                    "C++ fallbacks and fails in triton_utils/dispatcher.py:139 (on a GPU: --backend cuda)"),
}
"""The tiny models only vLLM's CUDA build serves: their config fields, and why the CPU build cannot."""
MXFP4 = "-mxfp4"
"""A source ``<model_type>-mxfp4`` (a TINY model with routed experts): its routed experts published in MXFP4 as
compressed-tensors writes them (Kimi K3's format), served with the plugin, against the same model with those experts
dequantized served as shipped: the same weights, since vLLM's own MXFP4 kernels (Marlin, CUTLASS) are a GPU's."""

ENGINE_ARGS: dict[str, dict[str, Any]] = {
    # vLLM's CPU platform prefers its AMX MLA backend where the CPU has AMX, which packs W_UK for bfloat16 only
    # (v1/attention/backends/mla/amx_mla.py, convert_weight_packed); its plain CPU MLA computes float32
    "deepseek_v3": {"attention_config": {"backend": "CPU_MLA"}},
}
"""vllm.LLM arguments a tiny model needs on CPU beyond the defaults (eager, float32, no prefix caching)."""


def engine_args(model_type: str, device: str) -> dict[str, Any]:
    """vllm.LLM arguments for ``model_type``'s tiny model on ``device`` ("cpu" or "cuda"): ENGINE_ARGS on CPU; on
    a GPU, softmax attention through the plugin's backend, which takes the name CUSTOM there (vllm_plugin.
    attention_replaced), and MLA and KDA on vLLM's own GPU backends (the plugin replaces none of them)."""
    if device == "cpu":
        return ENGINE_ARGS.get(model_type, {})
    config = TINY.get(model_type) or GPU_ONLY[model_type][0]
    return {} if "kv_lora_rank" in config or "linear_attn_config" in config else {
        "attention_config": {"backend": "CUSTOM"}}

PROMPTS = ([1, 5, 9, 33, 70, 2, 101, 7], [3, 4, 400])
"""Two prompts of different lengths (token ids), batched by the engine."""


def vllm_python() -> Path:
    """The vLLM stage's interpreter: $WORKBENCH_VLLM_PYTHON, else the repository's .venv-vllm where
    scripts/setup-vllm.sh finished (its stamp)."""
    given = os.environ.get("WORKBENCH_VLLM_PYTHON")
    venv = Path(__file__).resolve().parents[2] / ".venv-vllm"
    path = Path(given) if given else venv / "bin" / "python"
    if not path.is_file() or not (given or (venv / ".workbench-installed").is_file()):
        raise WorkbenchError(f"no vLLM venv at {path.parent.parent}: scripts/setup-vllm.sh sets it up (or set "
                             "WORKBENCH_VLLM_PYTHON)")
    return path


def child(job: dict, env: dict[str, str], timeout_s: float) -> dict:
    """One vllm_child run's answer; WorkbenchError with its last line when it fails."""
    try:
        done = subprocess.run([str(vllm_python()), "-m", "workbench.integrations.vllm_child"], input=json.dumps(job),
                              capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise WorkbenchError(f"the vLLM child ({job['mode']}) ran past {timeout_s:.0f} s") from None
    answer = next((json.loads(line[len(MARK):]) for line in reversed(done.stdout.splitlines())
                   if line.startswith(MARK)), None)
    if answer is None or "error" in answer:
        tail = (answer or {}).get("error") or (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise WorkbenchError(f"the vLLM child ({job['mode']}) failed: {tail}"[:500])
    return answer


def compare(shipped: dict, patched: dict) -> dict[str, Any]:
    """The metrics of two serve answers: generate_match, the first differing step (None), the largest and per-step
    log-probability deviations up to it, the patched engine's op runs and what its plugin replaced. idle_blocks: the
    blocks of a replacement vLLM built that never ran, but for one that handed calls back (a case it does not cover,
    counted in its fallbacks)."""
    first, per_step = None, []
    for a, b in zip(shipped["sequences"], patched["sequences"], strict=True):
        differ = next((i for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"], strict=True)) if x != y), None)
        upto = len(a["tokens"]) if differ is None else differ + 1  # the same inputs up to the first difference
        for i in range(upto):
            if i == len(per_step):
                per_step.append(0.0)
            per_step[i] = max(per_step[i], abs(a["logprobs"][i] - b["logprobs"][i]))
        if differ is not None:
            first = differ if first is None else min(first, differ)
    same = [a["tokens"] == b["tokens"] for a, b in zip(shipped["sequences"], patched["sequences"], strict=True)]
    runs = patched["op_runs"]
    return {"generate_match": sum(same) / len(same), "generate_first_mismatch": first,
            "generate_tokens": len(shipped["sequences"][0]["tokens"]), "logprob_dev": max(per_step),
            "logprob_dev_per_step": per_step, "op_runs": runs, "replaced": patched["replaced"],
            "fallbacks": patched["fallbacks"], "built": patched["built"], "shipped_op_runs": shipped["op_runs"],
            "idle_blocks": sorted({block for name, blocks in patched["replaced"].items() for block in blocks
                                   if patched["built"].get(name) and not patched["fallbacks"].get(name)
                                   and not runs.get(block)})}


def inductor_cache() -> Path:
    """Where vLLM's CPU build keeps the C++ its sampler and ops compile (15 s a fresh process even when eager):
    $TORCHINDUCTOR_CACHE_DIR, else inductor's own default, which a child's scratch TMPDIR would otherwise move. A
    content-keyed cache: what is reused is what the same source compiles to."""
    import getpass

    return Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or Path(tempfile.gettempdir()) /
                f"torchinductor_{getpass.getuser()}")


def child_env(scratch: str, operators_dir: Path | None, device: str = "cpu") -> dict[str, str]:
    """A vLLM child's environment: the operators (``operators_dir``, else the settings'), on the Triton interpreter
    for ``device`` "cpu" (compiled on "cuda"), a scratch TMPDIR and Triton cache, the shared inductor cache, no hub
    access; on CPU, torch.compile off."""
    from workbench.config import Settings

    operators = Path(operators_dir or Settings.load().operators_dir).resolve()
    env = {**os.environ, "TMPDIR": scratch, "WORKBENCH_OPERATORS": str(operators), "HF_HUB_OFFLINE": "1",
           "TRITON_CACHE_DIR": str(Path(scratch) / "triton-cache"), "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache())}
    if device == "cpu":
        # torch.compile off: the functions vLLM's CPU build compiles (the sampler's logprob rank, an integer count;
        # DeepSeek's grouped top-k; the clamped SwiGLU's torch fallback) run as the same torch code, eager, without
        # inductor's fusions, in both engines; tracing them cost 7 to 10 s a process
        env.update(TRITON_INTERPRET="1", TORCH_COMPILE_DISABLE="1")
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def vllm_layers(operators_dir: Path | None = None, timeout_s: float = 300.0) -> dict[str, Any]:
    """What the plugin replaces outside a model, with the plugin on (vllm_child's ``layers``): vLLM's activation
    layers as Kimi K3's serving code builds them (their classes, deviations from vLLM's own math) and vLLM's router
    beside the plugin's routing (same experts, weights' deviation); the ops that ran and the calls handed back."""
    with tempfile.TemporaryDirectory(prefix="vllm-layers-") as scratch:
        return child({"mode": "layers"}, {**child_env(scratch, operators_dir), "WORKBENCH_VLLM": "1"}, timeout_s)


def run_vllm_parity(model_type: str, new_tokens: int = 8, dtype: str = "float32", seed: int = 0,
                    operators_dir: Path | None = None, timeout_s: float = 600.0, device: str = "cpu") -> ParityResult:
    """Parity of the plugin in vLLM's model code on ``model_type``'s tiny model (see the module docstring), with
    vLLM's CPU build and the operators on the Triton interpreter (``device`` "cpu") or vLLM's CUDA build and the
    operators compiled ("cuda")."""
    base, mxfp4 = model_type.removesuffix(MXFP4), model_type.endswith(MXFP4)
    known = [*TINY, *GPU_ONLY, *(name + MXFP4 for name, config in TINY.items() if "n_routed_experts" in config)]
    if model_type not in known:
        raise WorkbenchError(f"no tiny vLLM model for '{model_type}' (known: {', '.join(known)})")
    if device not in ("cpu", "cuda"):
        raise WorkbenchError(f"vLLM parity runs on cpu or cuda, not '{device}'")
    if device == "cpu" and base in GPU_ONLY:
        raise WorkbenchError(f"{model_type}: {GPU_ONLY[base][1]}")
    if dtype != "float32":
        raise WorkbenchError("vLLM parity compares float32 (on random tiny models bfloat16 logits tie)")
    config = dict(TINY[base] if base in TINY else GPU_ONLY[base][0])
    result = ParityResult(source=model_type, model_type=base, model_class=f"vllm {model_type}", dtype=dtype,
                          backend="vllm-cpu, Triton interpreter" if device == "cpu" else "vllm-cuda, compiled Triton",
                          layers=[], tokens=new_tokens, config=config,
                          notes=[f"served by vLLM's model code: {len(PROMPTS)} prompts of "
                                 f"{', '.join(str(len(p)) for p in PROMPTS)} tokens, {new_tokens} greedy tokens each"])
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vllm-parity-") as scratch:
        env = child_env(scratch, operators_dir, device)
        model_dir, mxfp4_dir = str(Path(scratch) / "model"), str(Path(scratch) / "model-mxfp4")
        try:
            serve = {"mode": "serve", "dir": model_dir, "prompts": [list(p) for p in PROMPTS],
                     "new_tokens": new_tokens, "dtype": dtype, "max_model_len": 128,
                     "engine": engine_args(base, device)}
            build = {"model_type": base, "config": config, "seed": seed, "dir": model_dir,
                     **({"mxfp4_dir": mxfp4_dir} if mxfp4 else {})}
            shipped = child({**serve, "build": build}, {**env, "WORKBENCH_VLLM": "0"}, timeout_s)
            built = shipped["model"]
            patched = child({**serve, "dir": mxfp4_dir if mxfp4 else model_dir}, {**env, "WORKBENCH_VLLM": "1"},
                            timeout_s)
        except WorkbenchError as exc:
            result.message, result.seconds = str(exc), time.monotonic() - started
            return result
    result.seconds = time.monotonic() - started
    result.metrics = {**compare(shipped, patched), "parameters": built["parameters"]}
    if mxfp4:
        result.notes.append(f"the routed experts' {built['mxfp4_weights']} projections in MXFP4 (compressed-tensors) "
                            "with the plugin, dequantized as shipped")
    judge_served(result)
    return result


def judge_served(result: ParityResult) -> None:
    """parity.judge's checks and status, and one more: the plugin replaced a vLLM class (vLLM only logs a plugin
    that failed to load and serves as shipped, which would otherwise pass every check)."""
    judge(result)
    replaced = len(result.metrics.get("replaced") or {})
    result.checks.append({"metric": "plugin_replaced", "value": replaced, "bound": 1, "op": ">=", "ok": replaced >= 1})
    if not replaced:
        result.status = ParityStatus.FAIL
        result.message = f"the plugin replaced no vLLM class (it did not load); {result.message}"
