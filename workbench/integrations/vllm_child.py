"""The processes a vLLM parity run computes in, in the vLLM stage's own venv (vLLM pins transformers below the
project's): ``python -m workbench.integrations.vllm_child`` with a job (JSON) on stdin, answering one line
``@@vllm <json>`` on stdout ({"error"} on failure).

- ``{"mode": "build", "model_type", "config", "seed", "dir"}``: a random-weight model of the transformers class
  saved to ``dir`` in float32 (vLLM loads it as a checkpoint). With ``"mxfp4_dir"``: its routed experts published
  in MXFP4 as compressed-tensors writes them (``experts_in_mxfp4``), dequantized in ``dir``.
- ``{"mode": "serve", "dir", "prompts", "new_tokens", "dtype"}``: vLLM's offline engine (``vllm.LLM``, eager, in
  this process: VLLM_ENABLE_V1_MULTIPROCESSING=0, so the op counts are this process's) greedily decodes
  ``new_tokens`` after each prompt (token ids); the answer has each prompt's tokens and each step's log-probability
  of its token, the workbench ops that ran (workbench.kernels._ops.RUNS), the classes the plugin replaced, the
  instances of each vLLM built and the calls it handed back to vLLM. Whether the plugin is on is the environment's
  WORKBENCH_VLLM.
- ``{"mode": "activations"}``: vLLM's activation layers as Kimi K3's serving code builds them (``activations``), the
  plugins loaded by vLLM's own loader.
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
            "built": dict(vllm_plugin.BUILT), "fallbacks": dict(vllm_plugin.FALLBACKS), "plugin": vllm_plugin.enabled()}


def activations(job: dict) -> dict:
    """vLLM's SituAndMul at Kimi K3's betas (4, and 25 for the up half; once without it, as a model whose config
    leaves it unset builds it) and SiluAndMul, built under an eager engine's config (custom ops on), each called on
    x [9, 256] float32 whose gate and up halves reach past both clips: per layer its class and its largest deviation
    from vLLM's own forward_native relative to that output's largest value; the ops that ran and the calls handed
    back. Kimi K3's MLPs run only on a GPU in vLLM (its attention's CUDA ops), so this is where SiTU is held."""
    import torch
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.activation import SiluAndMul, SituAndMul
    from vllm.plugins import load_general_plugins

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
    return {"layers": found, "op_runs": dict(sorted(RUNS.items())), "fallbacks": dict(vllm_plugin.FALLBACKS),
            "past_clips": float((x[:, 128:].abs() > 25.0).float().mean())}


def main() -> None:
    from workbench.integrations.parity_child import reply

    job = json.loads(sys.stdin.read())
    reply(MARK, lambda: {"build": build, "serve": serve, "activations": activations}[job["mode"]](job))


if __name__ == "__main__":
    main()
