"""Compile worker: compiles a candidate's captured kernel launches for GPU targets, ahead of time, with no GPU.

Started as ``python -s -P -B compile_worker.py JOB_DIR RESULT_FD`` in a child process whose environment has no
TRITON_INTERPRET (an interpreted kernel is not a JITFunction and cannot be compiled). It imports the candidate (and
any package it took kernels from), then for each item of JOB_DIR/job.json, a launch and a target, calls
``triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget(...), options)`` and reads what the
compiler produced: dynamic shared memory from the metadata, registers and stack (spilled) bytes per thread from
``cuobjdump --dump-resource-usage`` on the cubin (NVIDIA) or the ``.vgpr_count`` / ``.private_segment_fixed_size``
lines of the AMDGCN, whether the TTIR has a ``tt.dot`` and whether the PTX / AMDGCN has tensor-core instructions.

Every item is one JSON line on RESULT_FD: ``{"start": id}`` before it compiles, then ``{"id", "ok", "error",
"registers", "spilled_bytes", "shared_bytes", "num_warps", "num_stages", "uses_dot", "tensor_cores", "seconds"}``;
the last line is ``{"end": true, "events", "patched"}``. Every line carries the job's token, which the candidate
never sees (job.json is deleted once read, the arguments cleared), so a line the candidate writes itself is not
taken for the worker's. Each compile runs under SIGALRM (the default action ends the process), so a compiler that
hangs dies and the parent knows which item it was from the last ``start``.

The candidate is imported under the sandbox worker's guards (worker.py, loaded by path: this process imports nothing
of the workbench): its audit hook refuses and records introspection, ctypes, processes, sockets, imports of the
workbench and writes outside the job's scratch folder made by the candidate's code; the namespaces the report is
made with (triton, json, os, subprocess, builtins, sys) are snapshotted, and a change to them ends the compiles
with ``patched`` set, so a candidate cannot forge the registers or spills it is judged by.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

AMD_FIELDS = re.compile(r"^\s*-?\s*\.(vgpr_count|sgpr_count|vgpr_spill_count|sgpr_spill_count|"
                        r"private_segment_fixed_size):\s+(\d+)", re.M)
CUDA_USAGE = re.compile(r"REG:(\d+)\s+STACK:(\d+)")


def jit_function(obj):
    """The JITFunction under a module attribute: itself, or the one a @triton.heuristics or @triton.autotune wraps
    (their ``fn``, as fla's kernels ship; the launch recorded is the JITFunction's, with the values they add); None
    for anything else."""
    from triton.runtime.jit import JITFunction

    for _ in range(8):  # decorators nest a few deep
        if obj is None or isinstance(obj, JITFunction):
            return obj
        obj = getattr(obj, "fn", None)
    return None


def load_kernel(launch: dict, candidate_module):
    """The JITFunction the launch ran: from the candidate itself, or from the package it was imported from."""
    module = candidate_module if launch["module"] == "candidate" else importlib.import_module(launch["module"])
    kernel = jit_function(getattr(module, launch["kernel"], None))
    if kernel is None:  # a kernel under another name: find it by its own
        kernel = next((k for k in map(jit_function, vars(module).values())
                       if k is not None and k.fn.__name__ == launch["kernel"]), None)
    if kernel is None:
        raise LookupError(f"kernel {launch['kernel']} not found in module {launch['module']}")
    return kernel


def constexpr_value(value):
    """The inverse of the sandbox worker's ``_plain``: {"tl.dtype": "fp32"} back to a Triton dtype."""
    import triton.language as tl

    if isinstance(value, dict) and "tl.dtype" in value:
        return tl.str_to_ty(value["tl.dtype"], None) if hasattr(tl, "str_to_ty") else getattr(tl, value["tl.dtype"])
    if isinstance(value, dict):
        raise TypeError(f"constexpr value {value.get('repr')} cannot be rebuilt outside the launch")
    return value


def resource_usage(compiled, target: dict, cuobjdump: str) -> dict:
    """registers, spilled_bytes (stack or scratch bytes per thread), tensor_cores (one of the target's
    ``tensor_core_ops`` in the PTX / AMDGCN), uses_dot of a compiled kernel."""
    asm = compiled.asm
    usage = {"uses_dot": " tt.dot " in asm.get("ttir", "") or "tt.dot_scaled" in asm.get("ttir", "")}
    if target["backend"] == "cuda":
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(asm["cubin"])
            cubin.flush()
            dump = subprocess.run([cuobjdump, "--dump-resource-usage", cubin.name], capture_output=True, text=True,
                                  timeout=60).stdout
        match = CUDA_USAGE.search(dump)
        usage["registers"], usage["spilled_bytes"] = (int(match[1]), int(match[2])) if match else (None, None)
        code = asm.get("ptx", "")
    else:
        fields = {name: int(value) for name, value in AMD_FIELDS.findall(asm.get("amdgcn", ""))}
        usage["registers"] = fields.get("vgpr_count") or None  # on gfx90a and later it counts the AGPRs too
        usage["spilled_bytes"] = fields.get("private_segment_fixed_size", 0)
        code = asm.get("amdgcn", "")
    usage["tensor_cores"] = any(op in code for op in target["tensor_core_ops"])
    return usage


def compile_item(item: dict, candidate_module, cuobjdump: str) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    launch, target = item["launch"], item["target"]
    kernel = load_kernel(launch, candidate_module)
    constexprs = {name: constexpr_value(v) for name, v in launch["constexprs"].items()}
    source = ASTSource(fn=kernel, signature=dict(launch["signature"]), constexprs=constexprs)
    options = {k: v for k, v in launch["options"].items() if k in ("num_warps", "num_stages", "num_ctas", "maxnreg")}
    compiled = triton.compile(source, target=GPUTarget(target["backend"], target["arch"], target["warp_size"]),
                              options=options)
    return {"ok": True, "error": "", "shared_bytes": int(compiled.metadata.shared),
            "num_warps": int(compiled.metadata.num_warps), "num_stages": int(compiled.metadata.num_stages),
            **resource_usage(compiled, target, cuobjdump)}


def first_line(exc: BaseException) -> str:
    """The compiler's own first message line (Triton's CompilationError puts the source excerpt first)."""
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith((" ", "^"))]
    message = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "")
    sentence = message.find(". ")
    return f"{type(exc).__name__}: {message[:sentence + 1] if sentence > 40 else message}"[:400]


def load_guard():
    """The sandbox worker's module (its audit hook, import refusal and snapshot), by path."""
    spec = importlib.util.spec_from_file_location("sandbox_guard", Path(__file__).with_name("worker.py"))
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    return guard


def main(job_dir: str, result_fd: int) -> int:
    import builtins

    import torch  # noqa: F401 - imported before the guard, as in the verification worker: the candidate's own
    import triton  # imports of torch and triton then read nothing (a first import opens /proc/self/maps)
    import triton.compiler
    import triton.language  # noqa: F401

    job_file = Path(job_dir) / "job.json"
    job = json.loads(job_file.read_text())
    job_file.unlink()  # the candidate never reads the job, nor the token that authenticates each line
    token = job.pop("token")
    del sys.argv[1:]
    cuobjdump = str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    guard = load_guard()
    watched = {"triton": triton, "triton.compiler": triton.compiler, "json": json, "os": os, "subprocess": subprocess,
               "builtins": builtins, "sys": sys, "worker": sys.modules[__name__]}
    before = guard._snapshot(watched)
    events: list[dict] = []
    sys.meta_path.insert(0, guard.RefuseWorkbench())
    (Path(job_dir) / "scratch").mkdir(exist_ok=True)
    os.environ["TMPDIR"] = tempfile.tempdir = str(Path(job_dir) / "scratch")  # the candidate's own temporary files
    sys.addaudithook(guard.make_audit_hook(job["candidate"], job_dir, events, guard_writes=True))
    dumps = json.dumps  # bound before the candidate runs
    with os.fdopen(result_fd, "w", buffering=1) as channel:
        def send(record: dict) -> None:
            channel.write(dumps({**record, "token": token}) + "\n")
            channel.flush()

        signal.alarm(int(job["item_timeout_s"]))  # an import that hangs ends like a compile that does
        try:
            spec = importlib.util.spec_from_file_location("candidate", job["candidate"])
            module = importlib.util.module_from_spec(spec)
            sys.modules["candidate"] = module
            spec.loader.exec_module(module)
        except BaseException as exc:  # noqa: BLE001 - every item fails with the import's message
            for item in job["items"]:
                send({"id": item["id"], "ok": False, "error": f"import without the interpreter: {first_line(exc)}"})
            send({"end": True, "events": events, "patched": guard._patched(before, watched)})
            return 0
        patched = guard._patched(before, watched)
        for item in job["items"] if not patched else []:
            send({"start": item["id"]})
            started = time.monotonic()
            signal.alarm(int(job["item_timeout_s"]))
            try:
                record = compile_item(item, module, cuobjdump)
            except Exception as exc:  # noqa: BLE001 - the compiler's verdict on this launch
                record = {"ok": False, "error": first_line(exc), "trace": traceback.format_exc(limit=3)[-1500:]}
            signal.alarm(0)
            send({"id": item["id"], "seconds": round(time.monotonic() - started, 3), **record})
            patched = guard._patched(before, watched)
            if patched:
                break
        send({"end": True, "events": events, "patched": patched})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
