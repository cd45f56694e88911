"""Sandbox worker: runs one untrusted candidate on the trials of a job and sends back its outputs, gradients and
what it was seen doing.

Started as ``python -I worker.py JOB_DIR RESULT_FD`` in a child process (its environment already holds
TRITON_INTERPRET when the interpreter is the backend). It imports torch, triton and the candidate, nothing of the
workbench: the reference and the expected values never enter this process, and an import of ``workbench`` by the
candidate is refused and reported. Before the candidate is loaded it installs what the parent's integrity checks
read:

- an audit hook (cannot be removed) recording frame and object introspection, tracing, ctypes, processes,
  sockets, dynamic code and reads of the workbench's sources when the calling code is the candidate's;
- a Triton launch counter (forward and backward separately);
- a torch dispatch mode, during ``run`` and its backward, recording every aten op and poisoning every freshly
  allocated buffer with a NaN bit pattern (POISON_BITS) so unwritten outputs are recognisable;
- a snapshot of torch, triton, time and builtins attributes, compared after every trial (monkeypatching).

Reads JOB_DIR/job.pt; writes the result as one torch.save blob to RESULT_FD (a pipe): ``{"load_error",
"trials": [{id, outputs, grads, error, launches_fwd, launches_bwd, ops, aliasing, mutated, subclass, seconds}],
"events", "patched"}``.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.util
import io
import os
import sys
import sysconfig
import threading
import time
import traceback
import types
from pathlib import Path

KERNEL_ERRORS = (ValueError, TypeError, AttributeError, NameError, AssertionError, SyntaxError)
# Bit patterns written into every fresh buffer (NaN payloads for floats, a sentinel for integers).
POISON_BITS = {"float32": 0x7FA5A5A5, "float16": 0x7D5A, "bfloat16": 0x7FA5, "float64": 0x7FF4A5A5A5A5A5A5}
POISON_INT = -0x5A5A5A5A
# Audit events that no candidate needs: the first non-stdlib frame raising them must not be the candidate's.
FORBIDDEN_EVENTS = {
    "sys._getframe": "introspection", "sys._current_frames": "introspection", "sys.settrace": "introspection",
    "sys.setprofile": "introspection", "gc.get_objects": "introspection", "gc.get_referrers": "introspection",
    "gc.get_referents": "introspection", "object.__getattr__": "introspection",
    "ctypes.dlopen": "forbidden_call", "ctypes.dlsym": "forbidden_call", "ctypes.addressof": "forbidden_call",
    "ctypes.string_at": "forbidden_call", "ctypes.cdata": "forbidden_call", "ctypes.call_function": "forbidden_call",
    "subprocess.Popen": "forbidden_call", "os.system": "forbidden_call", "os.exec": "forbidden_call",
    "os.posix_spawn": "forbidden_call", "os.fork": "forbidden_call", "os.kill": "forbidden_call",
    "socket.connect": "forbidden_call", "socket.bind": "forbidden_call",
    "compile": "forbidden_call", "exec": "forbidden_call", "code.__new__": "forbidden_call",
    "import": "forbidden_import", "open": "forbidden_import",
}
GROWING = ("sys", "worker")  # namespaces that gain attributes by themselves
BENIGN_CALLERS = ("warnings.py", os.path.join("logging", "__init__.py"))
STDLIB = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})
OWN_FILE = os.path.abspath(__file__)
WORKBENCH_DIR = str(Path(__file__).resolve().parent.parent)  # the package whose sources hold the references


def _first_foreign_frame(frame, through_imports: bool = False):
    """The first frame up the stack that is neither the standard library, a frozen module, nor this worker; None
    when an import comes first (the event belongs to a standard-library module being initialised), unless
    ``through_imports`` (then the importer is what counts)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith("<frozen importlib") and not through_imports:
            return None
        if not (name.startswith(STDLIB) or name.startswith("<frozen") or name == OWN_FILE):
            return frame
        frame = frame.f_back
    return None


def make_audit_hook(candidate: str, job_dir: str, events: list[dict]):
    """An audit hook that records, and refuses by raising PermissionError, the forbidden events raised by the
    candidate's code. Its state lives in this closure only: nothing reachable from the candidate's globals can
    switch it off, and Python offers no way to remove an audit hook."""
    private = (WORKBENCH_DIR, os.path.abspath(job_dir), "/proc/self", f"/proc/{os.getpid()}")
    busy = [False]

    def audit(event: str, args: tuple) -> None:
        kind = FORBIDDEN_EVENTS.get(event)
        if kind is None or busy[0]:
            return
        if event == "import" and str(args[0]).split(".")[0] != "workbench":
            return
        if event == "open" and not (isinstance(args[0], str) and os.path.abspath(args[0]).startswith(private)):
            return
        if event == "object.__getattr__" and args[1] not in ("tb_frame", "gi_frame", "cr_frame", "ag_frame"):
            return
        busy[0] = True
        try:
            caller = sys._getframe(1)
            if event in ("compile", "exec", "code.__new__"):
                frame = caller  # dynamic code counts only when the candidate itself calls compile/exec
            elif caller.f_code.co_filename.endswith(BENIGN_CALLERS):
                return  # warnings and logging look up their caller's frame and hand nothing back
            else:
                frame = _first_foreign_frame(caller, through_imports=event in ("open", "import"))
            if frame is None or frame.f_code.co_filename != candidate:
                return
            detail = args[0] if event in ("import", "open", "subprocess.Popen", "os.system") else \
                (args[1] if event == "object.__getattr__" else "")
            if len(events) < 20:
                events.append({"kind": kind, "event": event, "detail": str(detail)[:200], "line": frame.f_lineno})
        finally:
            busy[0] = False
        raise PermissionError(f"refused by the verification sandbox: {event}")

    return audit


class RefuseWorkbench(importlib.abc.MetaPathFinder):
    """The candidate may not import the workbench (its references live there)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] == "workbench":
            raise ImportError("the workbench is not importable from a candidate")
        return None


def _count_launches(cls, counter: list[int]) -> None:
    """Wrap cls.run (every Triton launch goes through it) to add one to counter[0]."""
    original = cls.run

    def run(self, *args, **kwargs):
        counter[0] += 1
        return original(self, *args, **kwargs)

    cls.run = run


def _snapshot(modules) -> dict:
    """{(namespace, attribute): id(value)} of the namespaces a candidate could patch to fool the checks."""
    return {(name, key): id(value) for name, ns in modules.items() for key, value in list(vars(ns).items())}


def _patched(before: dict, modules) -> list[str]:
    """Attributes changed since the snapshot, and new ones that are not lazily imported submodules."""
    now = _snapshot(modules)
    changed = {f"{m}.{k}" for (m, k), ident in before.items() if now.get((m, k), ident) != ident}
    added = {f"{m}.{k}" for (m, k) in now.keys() - before.keys()
             if m not in GROWING and not isinstance(vars(modules[m]).get(k), types.ModuleType)}
    return sorted(changed | added)


def make_trace_mode():
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    empties = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
               torch.ops.aten.empty_strided.default, torch.ops.aten.new_empty.default,
               torch.ops.aten.new_empty_strided.default}
    int_views = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
                 torch.float64: torch.int64}

    class Trace(TorchDispatchMode):
        """Counts aten ops by name and poisons fresh buffers."""

        def __init__(self):
            super().__init__()
            self.ops: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket)
            self.ops[name] = self.ops.get(name, 0) + 1
            out = func(*args, **(kwargs or {}))
            if func in empties and isinstance(out, torch.Tensor) and out.numel():
                if out.dtype in int_views:
                    out.view(int_views[out.dtype]).fill_(POISON_BITS[str(out.dtype).removeprefix("torch.")])
                elif out.dtype in (torch.int32, torch.int64):
                    out.fill_(POISON_INT)
            return out

    class HostArrays(TorchFunctionMode):
        """Counts tensors handed to numpy (host math the dispatch trace cannot see)."""

        def __init__(self):
            super().__init__()
            self.ops: dict[str, int] = {}

        def __torch_function__(self, func, types_, args=(), kwargs=None):
            if func in (torch.Tensor.numpy, torch.Tensor.__array__):
                self.ops["numpy"] = self.ops.get("numpy", 0) + 1
            return func(*args, **(kwargs or {}))

    return Trace, HostArrays


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


def _storages(tensors) -> set[int]:
    import torch

    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor) and t.numel()}


def run_trial(run, trial: dict, job: dict, modes, counter: list[int], previous: set[int], safe) -> dict:
    """One call of ``run`` and its backward on fresh copies of the inputs, with everything the checks need.
    ``safe`` holds the torch functions this worker uses, taken before the candidate was loaded."""
    import torch

    arg_names, grad_inputs = job["arg_names"], job["grad_inputs"]
    args, leaves, pristine = [], {}, {}
    for name in arg_names:
        value = trial["inputs"][name]
        if isinstance(value, torch.Tensor):
            pristine[name] = value
            value = safe.clone(value)
            if name in grad_inputs:
                value.requires_grad_(True)
                leaves[name] = value
        args.append(value)
    grad_outputs = [safe.clone(g) if g is not None else None for g in trial["grad_outputs"]]
    input_storages = _storages(args)
    entry: dict = {"id": trial["id"], "error": None}
    trace, host = modes[0](), modes[1]()
    started = safe.clock()
    with host, trace:
        counter[0] = 0
        out = run(*args)
        entry["launches_fwd"] = counter[0]
    outputs = list(out) if isinstance(out, (tuple, list)) else [out]
    grads: dict = {name: None for name in leaves}
    differentiable = [(o, g) for o, g in zip(outputs, grad_outputs, strict=False)
                      if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
    with host, trace:
        counter[0] = 0
        if leaves and differentiable:
            got = safe.grad([o for o, _ in differentiable], list(leaves.values()),
                            [g for _, g in differentiable], allow_unused=True)
            grads = dict(zip(leaves, got, strict=True))
        entry["launches_bwd"] = counter[0]
    if job["device"] == "cuda":
        safe.synchronize()
    entry["seconds"] = safe.clock() - started
    entry["ops"] = {**trace.ops, **host.ops}
    tensors_out = [o for o in outputs if isinstance(o, torch.Tensor)]
    entry["subclass"] = [type(t).__name__ for t in tensors_out + [g for g in grads.values() if g is not None]
                         if type(t) is not torch.Tensor]
    out_storages = [t.untyped_storage().data_ptr() for t in tensors_out if t.numel()]
    entry["aliasing"] = sorted(
        {"an input" for p in out_storages if p in input_storages}
        | {"an earlier call's output" for p in out_storages if p in previous}
        | ({"another output"} if len(out_storages) != len(set(out_storages)) else set()))

    def same(a, b) -> bool:
        if not a.numel():
            return a.shape == b.shape
        if a.dtype.is_floating_point:  # bitwise, so NaN payloads and -0.0 count; flat, so 0-dim tensors view too
            flat_a, flat_b = safe.view(safe.contiguous(a), -1), safe.view(safe.contiguous(b), -1)
            return safe.equal(safe.view(flat_a, torch.uint8), safe.view(flat_b, torch.uint8))
        return safe.equal(a, b)

    entry["mutated"] = [name for name, value in pristine.items()
                        if not same(value, safe.detach(args[arg_names.index(name)]))]
    entry["mutated"] += [f"grad_output[{i}]" for i, (g, h) in enumerate(zip(trial["grad_outputs"], grad_outputs,
                                                                           strict=True))
                         if g is not None and not same(g, h)]
    plain = (lambda t: safe.detach(torch.Tensor.as_subclass(t, torch.Tensor)) if isinstance(t, torch.Tensor) else t)
    entry["outputs"] = [plain(o) for o in outputs]
    entry["grads"] = {k: plain(v) for k, v in grads.items()}
    previous.update(out_storages)
    return entry


def main(job_dir: str, result_fd: int) -> int:
    import torch
    import triton
    import triton.language as tl
    from triton.runtime import jit

    job_file = Path(job_dir) / "job.pt"
    job = torch.load(job_file, weights_only=True)
    job_file.unlink()  # the candidate never sees the job (nor the token that authenticates the result)
    token = job.pop("token")
    del sys.argv[1:]
    candidate = job["candidate"]
    counter = [0]
    _count_launches(jit.JITFunction, counter)
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton.runtime import interpreter

        _count_launches(interpreter.InterpretedFunction, counter)
    safe = types.SimpleNamespace(clone=torch.Tensor.clone, detach=torch.Tensor.detach, view=torch.Tensor.view,
                                 contiguous=torch.Tensor.contiguous, equal=torch.equal, grad=torch.autograd.grad,
                                 save=torch.save, clock=time.perf_counter, synchronize=torch.cuda.synchronize)
    watched = {"torch": torch, "torch.Tensor": torch.Tensor, "torch.autograd": torch.autograd,
               "torch.autograd.Function": torch.autograd.Function, "torch.nn.functional": torch.nn.functional,
               "triton": triton, "triton.language": tl, "triton.runtime.jit.JITFunction": jit.JITFunction,
               "time": time, "builtins": builtins, "sys": sys, "worker": sys.modules[__name__]}
    modes = make_trace_mode()
    with modes[1](), modes[0]():  # warm up: the first traced ops import modules lazily (torch._dynamo rewraps names)
        torch.empty(2, 2, device=job["device"]).reshape(4).clone().sum()
    before = _snapshot(watched)
    threads = threading.active_count()
    events: list[dict] = []
    sys.meta_path.insert(0, RefuseWorkbench())
    sys.addaudithook(make_audit_hook(candidate, job_dir, events))

    results: dict = {"load_error": None, "trials": [], "events": events, "patched": []}
    try:
        module = load_candidate(candidate)
    except BaseException as exc:  # noqa: BLE001 - any failure to load is the candidate's verdict
        results["load_error"] = classify(exc, candidate)
        if results["load_error"]["kind"] == "runtime_error":
            results["load_error"]["kind"] = "compile_error"
    else:
        previous: set[int] = set()
        kept = []  # earlier outputs stay alive so their storage cannot be reused and look fresh
        for trial in job["trials"]:
            try:
                entry = run_trial(module.run, trial, job, modes, counter, previous, safe)
                kept.append(entry["outputs"])
            except Exception as exc:  # noqa: BLE001 - recorded as the trial's verdict
                entry = {"id": trial["id"], "error": classify(exc, candidate)}
            results["trials"].append(entry)
            patched = _patched(before, watched)
            if threading.active_count() > threads:
                patched.append(f"threading: {threading.active_count() - threads} background thread(s) left running")
            if patched:
                results["patched"] = patched
                break
    results["token"] = token
    blob = io.BytesIO()
    safe.save(results, blob)
    with os.fdopen(result_fd, "wb") as channel:
        channel.write(blob.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
