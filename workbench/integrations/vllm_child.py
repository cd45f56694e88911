"""The processes a vLLM parity run computes in, in the vLLM stage's own venv (vLLM pins transformers below the
project's): ``python -m workbench.integrations.vllm_child`` with a job (JSON) on stdin, answering one line
``@@vllm <json>`` on stdout ({"error"} on failure).

- ``{"mode": "build", "model_type", "config", "seed", "dir"}``: a random-weight model of the transformers class
  saved to ``dir`` in float32 (vLLM loads it as a checkpoint).
- ``{"mode": "serve", "dir", "prompts", "new_tokens", "dtype"}``: vLLM's offline engine (``vllm.LLM``, eager, in
  this process: VLLM_ENABLE_V1_MULTIPROCESSING=0, so the op counts are this process's) greedily decodes
  ``new_tokens`` after each prompt (token ids); the answer has each prompt's tokens and each step's log-probability
  of its token, the workbench ops that ran (workbench.kernels._ops.RUNS), the classes the plugin replaced, the
  instances of each vLLM built and the calls it handed back to vLLM. Whether the plugin is on is the environment's
  WORKBENCH_VLLM.
"""

from __future__ import annotations

import json
import os
import sys

MARK = "@@vllm "
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
    return {"parameters": sum(p.numel() for p in model.parameters())}


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


def main() -> None:
    from workbench.integrations.parity_child import reply

    job = json.loads(sys.stdin.read())
    reply(MARK, lambda: {"build": build, "serve": serve}[job["mode"]](job))


if __name__ == "__main__":
    main()
