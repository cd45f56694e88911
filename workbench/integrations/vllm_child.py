"""The processes a vLLM parity run computes in, in the vLLM stage's own venv (vLLM pins transformers below the
project's): ``python -m workbench.integrations.vllm_child`` with a job (JSON) on stdin, answering one line
``@@vllm <json>`` on stdout ({"error"} on failure).

- ``{"mode": "serve", "dir", "prompts", "new_tokens", "dtype"}``, optionally with ``"build": {"model_type",
  "config", "seed", "dir"}``, which first saves a random-weight model of the transformers class to ``dir`` in float32
  (vLLM loads it as a checkpoint; with ``"mxfp4_dir"`` its routed experts are also published in MXFP4 as
  compressed-tensors writes them, ``experts_in_mxfp4``, dequantized in ``dir``): vLLM's offline engine
  (``vllm.LLM``, eager, in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0, so the op counts are this process's)
  greedily decodes ``new_tokens`` after each prompt (token ids); the answer has each prompt's tokens and each step's
  log-probability of its token, the workbench ops that ran (workbench.kernels._ops.RUNS), the classes the plugin
  replaced, the instances of each vLLM built and the calls it handed back to vLLM. Whether the plugin is on is the
  environment's WORKBENCH_VLLM.
- ``{"mode": "layers"}``: what the plugin replaces outside a model, the plugins loaded by vLLM's own loader: vLLM's
  activation layers as Kimi K3's serving code builds them, and vLLM's router beside the plugin's routing
  (``layers``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

MARK = "@@vllm "
EXPERT_WEIGHT = re.compile(r"model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight")
"""A routed expert's projection in a checkpoint as transformers saves it."""
KV_CACHE_BYTES = 64 << 20
"""The KV cache a tiny model is served with (the CPU backend otherwise reserves a share of the machine's memory, and
refuses to start where less is free)."""


def build(job: dict) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(job["model_type"], **job["config"])
    torch.manual_seed(job["seed"])
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.save_pretrained(job["dir"])
    answer = {"parameters": sum(p.numel() for p in model.parameters())}
    if "mxfp4_dir" in job:
        answer["mxfp4_weights"] = experts_in_mxfp4(Path(job["dir"]), Path(job["mxfp4_dir"]))
    return answer


def experts_in_mxfp4(shipped: Path, mxfp4: Path) -> int:
    """The checkpoint in ``shipped`` with its routed experts' projections quantized by compressed-tensors' MXFP4
    scheme (weight-only, e8m0 scales over groups of 32, its compressor): written to ``mxfp4`` packed (weight_packed,
    weight_scale, the config's quantization_config naming them), and back into ``shipped`` as the values they hold
    (compressed-tensors' decompression), so that both serve the same weights. Returns the weights quantized."""
    import torch
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import MXFP4A16
    from compressed_tensors.quantization.utils.mxfp_utils import generate_mx_scales
    from safetensors.torch import load_file, save_file

    scheme = QuantizationScheme(targets=[r"re:.*mlp\.experts\.\d+\.(gate|up|down)_proj$"], **MXFP4A16)
    state = load_file(shipped / "model.safetensors")
    packed, count = dict(state), 0
    for name in [n for n in state if EXPERT_WEIGHT.fullmatch(n)]:
        weight = state[name]
        scale = torch.exp2(generate_mx_scales(weight.unflatten(-1, (-1, 32)).abs().amax(-1)).float() - 127)
        compressed = MXFP4PackedCompressor.compress({"weight": weight, "weight_scale": scale}, scheme)
        state[name] = MXFP4PackedCompressor.decompress(dict(compressed), scheme)["weight"].to(weight.dtype)
        del packed[name]
        stem = name.removesuffix(".weight")
        packed[f"{stem}.weight_packed"], packed[f"{stem}.weight_scale"] = (compressed["weight_packed"],
                                                                           compressed["weight_scale"])
        count += 1
    save_file(state, shipped / "model.safetensors", metadata={"format": "pt"})
    mxfp4.mkdir(parents=True)
    save_file(packed, mxfp4 / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((shipped / "config.json").read_text())
    config["quantization_config"] = QuantizationConfig(
        config_groups={"group_0": scheme}, format="mxfp4-pack-quantized", quantization_status="compressed",
        ignore=[]).model_dump(mode="json", exclude_none=True)
    (mxfp4 / "config.json").write_text(json.dumps(config, indent=1))
    shutil.copy(shipped / "generation_config.json", mxfp4 / "generation_config.json")
    return count


def serve(job: dict) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    built = build(job["build"]) if "build" in job else None  # before vLLM: the model is saved as transformers does
    from vllm import LLM, SamplingParams

    from workbench.integrations import vllm_plugin
    from workbench.kernels._ops import RUNS

    llm = LLM(model=job["dir"], dtype=job["dtype"], enforce_eager=True, max_model_len=job["max_model_len"],
              skip_tokenizer_init=True, seed=0, enable_prefix_caching=False,
              kv_cache_memory_bytes=KV_CACHE_BYTES, **job.get("engine", {}))
    params = SamplingParams(temperature=0.0, max_tokens=job["new_tokens"], logprobs=0, detokenize=False,
                            ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in job["prompts"]], params, use_tqdm=False)
    answers = []
    for out in outputs:
        done = out.outputs[0]
        answers.append({"tokens": list(done.token_ids),
                        "logprobs": [step[token].logprob for step, token in zip(done.logprobs, done.token_ids,
                                                                                 strict=True)]})
    return {"sequences": answers, "op_runs": dict(sorted(RUNS.items())), "replaced": vllm_plugin.REPLACED,
            "built": dict(vllm_plugin.BUILT), "fallbacks": dict(vllm_plugin.FALLBACKS), "plugin": vllm_plugin.enabled(),
            **({"model": built} if built else {})}


ROUTERS = {
    # name: (experts, top_k, scoring_func, renormalize, use_grouped_topk, num_expert_group, topk_group,
    #        routed_scaling_factor, correction bias)
    "kimi_k3": (896, 16, "sigmoid", True, True, 1, 1, 2.827, True),
    "deepseek_v3": (256, 8, "sigmoid", True, True, 8, 4, 2.5, True),
    "qwen3_moe": (128, 8, "softmax", True, False, None, None, 1.0, False),
    "deepseek_v2_lite": (64, 6, "softmax", False, False, None, None, 1.0, False),
    "deepseek_v4": (256, 6, "sqrtsoftplus", True, False, None, None, 1.5, True),  # its learned (not hashed) layers
}
"""The routings held to vLLM's router: the configs' own settings as vLLM's model code hands them to FusedMoE."""


def layers(job: dict) -> dict:
    """What the plugin replaces outside a model. vLLM's SituAndMul at Kimi K3's betas (4, and 25 for the up half;
    once without it, as a model whose config leaves it unset builds it) and SiluAndMul, built under an eager
    engine's config (custom ops on), each called on x [9, 256] float32 whose gate and up halves reach past both
    clips: per layer its class and its largest deviation from vLLM's own forward_native relative to that output's
    largest value. vLLM's router (``select_experts``, the CPU router's math) beside the plugin's routing
    (``topk_like_vllm``) on 33 tokens of tie-free float32 logits for each of ROUTERS: whether every token chose the
    same experts, and the weights' largest deviation. The ops that ran and the calls handed back. Kimi K3's MLPs run
    only on a GPU in vLLM (its attention's CUDA ops), so this is where SiTU is held."""
    from types import SimpleNamespace

    import torch
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.activation import SiluAndMul, SituAndMul
    from vllm.model_executor.layers.fused_moe.router.cpu_router import select_experts
    from vllm.plugins import load_general_plugins

    from workbench.blocks.moe_router import mode_of
    from workbench.blocks.moe_topk import make_inputs
    from workbench.integrations import vllm_plugin
    from workbench.kernels._ops import RUNS

    load_general_plugins()
    spread = torch.tensor([8.0, 40.0]).repeat_interleave(128)  # the gate half's, the up half's
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(0)) * spread
    found = {}
    with set_current_vllm_config(VllmConfig(compilation_config=CompilationConfig(custom_ops=["all"]))):
        for name, layer in (("situ", SituAndMul(beta=4.0, linear_beta=25.0)), ("situ_unclipped", SituAndMul(beta=4.0)),
                            ("silu", SiluAndMul())):
            native = layer.forward_native(x)
            found[name] = {"class": type(layer).__name__,
                           "deviation": float((layer(x) - native).abs().max() / native.abs().max())}
    routing = {}
    for name, (e, k, func, renorm, grouped, groups, kept, scale, biased) in ROUTERS.items():
        drawn = make_inputs({"N": 33, "E": e, "k": k, "mode": mode_of(func, renorm), "G": groups or 1,
                             "kg": kept or 1}, torch.float32, 5)
        layer = SimpleNamespace(top_k=k, scoring_func=func, renormalize=renorm, use_grouped_topk=grouped,
                                num_expert_group=groups, topk_group=kept, routed_scaling_factor=scale,
                                e_score_correction_bias=drawn["bias"] if biased else None)
        theirs_w, theirs_ids = select_experts(drawn["logits"], drawn["logits"], k, grouped, renorm, kept, groups,
                                              scoring_func=func, routed_scaling_factor=scale,
                                              e_score_correction_bias=layer.e_score_correction_bias)
        ours_w, ours_ids = vllm_plugin.topk_like_vllm(layer, drawn["logits"])
        order, theirs_order = ours_ids.argsort(-1), theirs_ids.long().argsort(-1)
        routing[name] = {
            "same_experts": bool(torch.equal(ours_ids.gather(-1, order), theirs_ids.long().gather(-1, theirs_order))),
            "deviation": float((ours_w.gather(-1, order) - theirs_w.gather(-1, theirs_order)).abs().max()
                               / theirs_w.abs().max())}
    return {"layers": found, "routing": routing, "op_runs": dict(sorted(RUNS.items())),
            "fallbacks": dict(vllm_plugin.FALLBACKS), "past_clips": float((x[:, 128:].abs() > 25.0).float().mean())}


def main() -> None:
    from workbench.integrations.parity_child import reply

    job = json.loads(sys.stdin.read())
    reply(MARK, lambda: {"serve": serve, "layers": layers}[job["mode"]](job))


if __name__ == "__main__":
    main()
