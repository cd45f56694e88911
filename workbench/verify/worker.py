"""Sandbox worker: runs one candidate on the trials of a job and writes back its outputs and gradients.

Started as ``python -I worker.py JOB_DIR`` in a child process (its environment already holds TRITON_INTERPRET when
the interpreter is the backend). It imports torch and the candidate, nothing of the workbench: the reference and the
expected values never enter this process. Reads JOB_DIR/job.pt, writes JOB_DIR/results.pt:
``{"load_error": None | {kind, message}, "trials": [{id, outputs, grads, error}]}``.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path

KERNEL_ERRORS = (ValueError, TypeError, AttributeError, NameError, AssertionError, SyntaxError)


def classify(exc: BaseException, candidate: str) -> dict:
    """{kind, message}: kind is compile_error (Triton rejected the kernel), oom, or runtime_error.

    The interpreter wraps whatever a kernel body raises in InterpreterError; a semantic error there (a non-power-of-two
    arange, a wrong type, an undefined name) is what the compiler would have rejected on a GPU.
    """
    wrapped = type(exc).__name__ == "InterpreterError" and exc.__cause__ is not None
    root = exc.__cause__ if wrapped else exc
    text = str(root).strip().splitlines()
    first = text[-1] if text else ""
    if isinstance(root, MemoryError) or "out of memory" in first.lower() or "can't allocate" in first.lower():
        kind = "oom"
    elif isinstance(root, SyntaxError) or type(root).__name__ in ("CompilationError", "CompileTimeAssertionFailure") \
            or (wrapped and isinstance(root, KERNEL_ERRORS)):
        kind = "compile_error"
    else:
        kind = "runtime_error"
    frames = traceback.extract_tb(exc.__traceback__) + traceback.extract_tb(root.__traceback__)  # outer first
    where = next((f"{Path(f.filename).name}:{f.lineno}: " for f in reversed(frames) if f.filename == candidate), "")
    return {"kind": kind, "message": f"{where}{type(root).__name__}: {first}"[:500]}


def load_candidate(path: str):
    spec = importlib.util.spec_from_file_location("candidate", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["candidate"] = module
    spec.loader.exec_module(module)
    if not callable(getattr(module, "run", None)):
        raise AttributeError("candidate defines no function `run`")
    return module


def run_trial(run, trial: dict, arg_names: list[str], grad_inputs: list[str]):
    import torch

    args, leaves = [], {}
    for name in arg_names:
        value = trial["inputs"][name]
        if isinstance(value, torch.Tensor):
            value = value.clone()
            if name in grad_inputs:
                value.requires_grad_(True)
                leaves[name] = value
        args.append(value)
    out = run(*args)
    outputs = list(out) if isinstance(out, (tuple, list)) else [out]
    grads: dict[str, object] = {name: None for name in leaves}
    differentiable = [(o, g) for o, g in zip(outputs, trial["grad_outputs"], strict=False)
                      if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
    if leaves and differentiable:
        got = torch.autograd.grad([o for o, _ in differentiable], list(leaves.values()),
                                  [g for _, g in differentiable], allow_unused=True)
        grads = {name: (g.detach() if g is not None else None) for name, g in zip(leaves, got, strict=True)}
    detached = [o.detach() if isinstance(o, torch.Tensor) else o for o in outputs]
    return detached, grads


def main(job_dir: str) -> int:
    import torch

    job = torch.load(Path(job_dir) / "job.pt", weights_only=True)
    candidate = job["candidate"]
    results: dict = {"load_error": None, "trials": []}
    try:
        module = load_candidate(candidate)
    except BaseException as exc:  # noqa: BLE001 - any failure to load is the candidate's verdict
        results["load_error"] = classify(exc, candidate)
        if results["load_error"]["kind"] == "runtime_error":
            results["load_error"]["kind"] = "compile_error"
    else:
        for trial in job["trials"]:
            entry = {"id": trial["id"], "outputs": None, "grads": None, "error": None}
            try:
                entry["outputs"], entry["grads"] = run_trial(module.run, trial, job["arg_names"], job["grad_inputs"])
            except Exception as exc:  # noqa: BLE001 - recorded as the trial's verdict
                entry["error"] = classify(exc, candidate)
            results["trials"].append(entry)
    torch.save(results, Path(job_dir) / "results.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
