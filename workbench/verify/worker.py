"""Sandbox worker: runs one untrusted candidate on the trials of a job and sends back its outputs, gradients and
what it was seen doing.

Started as ``python -s -P -B worker.py JOB_DIR RESULT_FD`` in a child process (its environment already holds
TRITON_INTERPRET when the interpreter is the backend). It imports torch, triton and the candidate, nothing of the
workbench: the reference and the expected values never enter this process, and an import of ``workbench`` by the
candidate is refused and reported. Before the candidate is loaded it installs what the parent's integrity checks
read:

- an audit hook (cannot be removed) recording frame and object introspection, tracing, ctypes, processes,
  sockets, dynamic code and reads of the workbench's sources when the calling code is the candidate's;
- a Triton launch counter (forward and backward separately) that also records each distinct launch
  specialization (kernel, each argument's Triton type or constexpr value, launch options) for the ahead-of-time
  compile for the GPU targets;
- a torch dispatch mode, during ``run`` and its backward, recording every aten op and poisoning every freshly
  allocated buffer with a NaN bit pattern (POISON_BITS) so unwritten outputs are recognisable;
- a snapshot of torch (with torch.autograd.graph), triton (with triton.runtime's JIT and interpreter launch path),
  time and builtins attributes, compared after every trial (monkeypatching).

After the trials it runs the job's captures: the candidate called at the model card's sizes on meta tensors
(shapes and dtypes, no data), forward and backward, with every Triton launch recorded and skipped, and every value
the host code reads back (``.item()``, ``.tolist()``, ``.cpu()``) answered with zeros of the right type.

Reads JOB_DIR/job.pt; writes the result as one torch.save blob to RESULT_FD (a pipe): ``{"load_error",
"trials": [{id, outputs, grads, error, launches_fwd, launches_bwd, ops, aliasing, mutated, not_in_place, subclass,
seconds}],
"captures": [{id, suite, target, error}], "launches": [{kernel, module, file, suite, target, signature, constexprs,
options}], "events", "patched"}`` (a launch's target: the GPU target its capture recorded it for, None in the trials).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import importlib.abc
import importlib.util
import inspect
import io
import json
import os
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
import types
from pathlib import Path

PROBE = "probe:"  # the suite label of a capture probe's launches: probe:<meta|real>:<shape>
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
# Filesystem writes (event -> index of the destination argument), refused outside the scratch folder whoever makes
# the call, if the candidate's code is on the stack (the only guard where bubblewrap is missing).
WRITE_EVENTS = {"open": 0, "os.remove": 0, "os.rename": 1, "os.mkdir": 0, "os.rmdir": 0, "os.chmod": 0,
                "os.chown": 0, "os.symlink": 1, "os.link": 1, "os.truncate": 0, "os.utime": 0, "shutil.copyfile": 1,
                "shutil.copytree": 1, "shutil.move": 1, "shutil.rmtree": 0, "sqlite3.connect": 0}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
GROWING = ("sys", "worker")  # namespaces that gain attributes by themselves
SELF_WRITTEN = ("__warningregistry__",)  # names Python adds to a module that warns (warnings.warn's registry)
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


def written_path(event: str, args: tuple) -> str | None:
    """The path a write event would change (None when the event does not write)."""
    if event == "open":
        mode, flags = (args[1] if len(args) > 1 else None), (args[2] if len(args) > 2 else 0)
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
            (isinstance(flags, int) and flags & WRITE_FLAGS)
        if not writing:
            return None
    target = args[WRITE_EVENTS[event]] if len(args) > WRITE_EVENTS[event] else None
    if isinstance(target, int):
        return None  # an open file descriptor: its opening was judged
    return os.fsdecode(target) if isinstance(target, str | bytes | os.PathLike) else None


def inside(path: str, folders: list[str]) -> bool:
    """Whether the absolute ``path`` is /dev/null or lies in one of ``folders`` (absolute)."""
    return path == os.devnull or any(path == f or path.startswith(f + os.sep) for f in folders)


def caller_in(frame, files: set[str]):
    """The first frame up the stack from ``frame`` whose code is one of ``files``, None when there is none."""
    while frame is not None and frame.f_code.co_filename not in files:
        frame = frame.f_back
    return frame


def install_write_guard(files: list[str], folders: list[str], who: str) -> None:
    """Refuse (PermissionError) every filesystem write outside ``folders`` made while code from one of ``files`` is
    on the stack: the guard of a process that runs candidate files without a verification around them (the
    replay's training process), whatever the isolation (under bubblewrap those writes would fail anyway)."""
    files_set = {os.path.abspath(f) for f in files}
    allowed = [os.path.abspath(f) for f in folders]
    busy = [False]

    def audit(event: str, args: tuple) -> None:
        if event not in WRITE_EVENTS or busy[0]:
            return
        busy[0] = True
        try:
            path = written_path(event, args)
            where = os.path.abspath(path) if path is not None else None
            frame = None if where is None or inside(where, allowed) else caller_in(sys._getframe(1), files_set)
        finally:
            busy[0] = False
        if frame is not None:
            raise PermissionError(f"refused by {who}: {event} {where} (from {frame.f_code.co_filename}:"
                                  f"{frame.f_lineno}, outside its scratch folder)")

    sys.addaudithook(audit)


def make_audit_hook(candidate: str, job_dir: str, events: list[dict], guard_writes: bool = True):
    """An audit hook that records, and refuses by raising PermissionError, the forbidden events raised by the
    candidate's code; with ``guard_writes`` also every filesystem write outside JOB_DIR/scratch made while the
    candidate's code is on the stack. Its state lives in this closure only: nothing reachable from the candidate's
    globals can switch it off, and Python offers no way to remove an audit hook."""
    scratch = os.path.join(os.path.abspath(job_dir), "scratch")
    private = (WORKBENCH_DIR, os.path.abspath(job_dir), "/proc/self", f"/proc/{os.getpid()}")
    # sys.path entries that are no path on disk: placeholders a path hook claims (setuptools' editable install adds
    # "__editable__.<dist>.finder.__path_hook__"). Code that scans sys.path for installed packages tries such an entry
    # as a zip archive (importlib.metadata's distribution search, which torch's lazy imports reach through networkx's
    # entry points), opening that name: relative, it resolves into the working directory, the job folder, but it is
    # neither the workbench's sources nor a job file. Taken before the candidate runs, and honoured only while
    # nothing exists by that name (the candidate cannot make one: its writes outside scratch are refused).
    placeholders = frozenset(p for p in sys.path if isinstance(p, str) and p and not os.path.lexists(p))
    busy = [False]

    def refuse_write(event: str, path: str) -> None:
        where = os.path.abspath(path)
        frame = None if inside(where, [scratch]) else caller_in(sys._getframe(2), {candidate})
        if frame is None:
            return
        if len(events) < 20:
            events.append({"kind": "forbidden_call", "event": event, "line": frame.f_lineno,
                           "detail": f"write outside the sandbox's scratch folder: {where}"[:200]})
        raise PermissionError(f"refused by the verification sandbox: {event} {where}")

    def audit(event: str, args: tuple) -> None:
        if guard_writes and event in WRITE_EVENTS and not busy[0]:
            path = written_path(event, args)
            if path is not None:
                busy[0] = True
                try:
                    refuse_write(event, path)
                finally:
                    busy[0] = False
        kind = FORBIDDEN_EVENTS.get(event)
        if kind is None or busy[0]:
            return
        if event == "import" and str(args[0]).split(".")[0] != "workbench":
            return
        if event == "open" and not (isinstance(args[0], str) and os.path.abspath(args[0]).startswith(private)
                                    and not os.path.abspath(args[0]).startswith(scratch)):
            return
        if event == "open" and isinstance(args[0], str) and os.path.basename(args[0]) == "mountinfo" and \
                os.path.dirname(os.path.abspath(args[0])) in ("/proc/self", f"/proc/{os.getpid()}"):
            return  # the mount table (filelock reads it at import to tell network filesystems): no process state
        if event == "open" and args[0] in placeholders and not os.path.lexists(args[0]):
            return  # a scan of sys.path probing a path hook's placeholder: it opens nothing
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


class Launches:
    """Counts Triton launches (``count[0]``) and records each distinct specialization once. ``suite`` labels the
    launches of the trial being run; with ``skip`` set a launch is recorded and not executed (captures)."""

    LAUNCH_KEYWORDS = ("grid", "warmup")

    def __init__(self, candidate: str):
        self.count = [0]
        self.records: list[dict] = []
        self.seen: set[str] = set()
        self.suite = ""
        self.target = None  # the GPU target whose launches a capture records (None: the trials' own launches)
        self.skip = False
        self.candidate = candidate
        self.autotune: dict | None = None  # the config of an autotuned launch being captured
        self.tuner_calls = 0  # autotuned calls captured so far (a launch's ``autotune["call"]``)

    def watch(self, cls) -> None:
        """Wrap cls.run (every launch of a @triton.jit kernel goes through it, compiled or interpreted)."""
        original = cls.run
        launches = self

        def run(kernel, *args, **kwargs):
            if launches.autotune is None or launches.autotune["config"] == 0:  # a tuner's call: one launch
                launches.count[0] += 1
            launches.record(kernel.fn, args, kwargs)
            if launches.skip:
                return None
            return original(kernel, *args, **kwargs)

        cls.run = run

    def watch_autotuner(self, cls) -> None:
        """Wrap Autotuner.run: in a capture (nothing runs, so nothing can be timed) every config the tuner would try
        at these arguments is launched, each launch recorded with the call's number and its config's index
        (``autotune``: which one a GPU would pick is its timing's; the cost model takes, per call, the config it models
        fastest). Outside captures, as is."""
        original = cls.run
        launches = self

        def run(tuner, *args, **kwargs):
            if not launches.skip:
                return original(tuner, *args, **kwargs)
            tuner.nargs = dict(zip(tuner.arg_names, args, strict=False))  # as Autotuner.run binds them
            configs = tuner.prune_configs(kwargs) if len(tuner.configs) > 1 else tuner.configs
            launches.tuner_calls += 1
            try:
                for index, config in enumerate(configs):
                    launches.autotune = {"call": launches.tuner_calls, "config": index, "configs": len(configs)}
                    tuner.fn.run(*args, **kwargs, **config.all_kwargs())
            finally:
                launches.autotune, tuner.nargs = None, None

        cls.run = run

    def record(self, fn, args: tuple, kwargs: dict) -> None:
        from triton.runtime.jit import mangle_type

        params = inspect.signature(fn).parameters
        try:
            bound = inspect.Signature(list(params.values())).bind(
                *args, **{k: v for k, v in kwargs.items() if k in params})
        except TypeError:
            return  # the launch itself will fail with Triton's own message
        bound.apply_defaults()
        signature, constexprs = {}, {}
        for name, value in bound.arguments.items():
            if "constexpr" in str(params[name].annotation) or value is None:
                signature[name] = "constexpr"
                constexprs[name] = _plain(value)
            else:
                signature[name] = mangle_type(value)
        options = {k: v for k, v in kwargs.items() if k not in params and k not in self.LAUNCH_KEYWORDS
                   and isinstance(v, int | float | bool | str)}
        entry = {"kernel": fn.__name__, "module": fn.__module__, "file": inspect.getsourcefile(fn) or "",
                 "suite": self.suite, "target": self.target, "signature": signature, "constexprs": constexprs,
                 "options": options}
        if self.autotune is not None:
            entry["autotune"] = dict(self.autotune)
        # a launch is recorded once whatever suite made it, but a capture probe's launches apart: they are compared
        key = json.dumps({k: v for k, v in entry.items() if k != "suite" or v.startswith(PROBE)}, sort_keys=True,
                         default=str)
        if key not in self.seen:
            self.seen.add(key)
            self.records.append(entry)


def _plain(value):
    """A constexpr value as JSON: numbers, strings and None as they are; a Triton dtype as {"tl.dtype": "fp32"}."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    inner = getattr(value, "value", value)  # tl.constexpr wraps its value
    if inner is not value:
        return _plain(inner)
    if type(value).__name__ in ("dtype", "pointer_type"):
        return {"tl.dtype": str(value)}
    return {"repr": repr(value)[:200]}


def _snapshot(modules) -> dict:
    """{(namespace, attribute): id(value)} of the namespaces a candidate could patch to fool the checks."""
    return {(name, key): id(value) for name, ns in modules.items() for key, value in list(vars(ns).items())}


def _patched(before: dict, modules) -> list[str]:
    """Attributes changed since the snapshot, and new ones that are not lazily imported submodules."""
    now = _snapshot(modules)
    changed = {f"{m}.{k}" for (m, k), ident in before.items() if now.get((m, k), ident) != ident}
    added = {f"{m}.{k}" for (m, k) in now.keys() - before.keys()
             if m not in GROWING and k not in SELF_WRITTEN
             and not isinstance(vars(modules[m]).get(k), types.ModuleType)}
    return sorted(changed | added)


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then()`` right after module ``name`` is first imported, once (its loader's exec_module wrapped)."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            self.then()

        spec.loader.exec_module = exec_module
        return spec


def _disable_dynamo_in(mode: type) -> None:
    import torch

    mode.__torch_dispatch__ = torch._disable_dynamo(mode.__dict__["__torch_dispatch__"], recursive=True)


@functools.cache
def dispatch_mode() -> type:
    """The base of the worker's torch dispatch modes. TorchDynamo never compiles into their ``__torch_dispatch__``,
    as into any dispatch mode's (torch wraps them in torch._disable_dynamo), but torch's wrapper imports Dynamo at the
    first op, which costs a child about as much CPU as importing torch. Here the wrapper comes when Dynamo is imported
    (AfterImport), since nothing compiles before: a candidate that never compiles never loads Dynamo."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False  # torch's own wrapper: its Dynamo import at the first op is what this class avoids

        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            if "torch._dynamo" in sys.modules:
                _disable_dynamo_in(cls)

    if "torch._dynamo" not in sys.modules:
        sys.meta_path.insert(0, AfterImport("torch._dynamo", lambda: [_disable_dynamo_in(m) for m in
                                                                       Mode.__subclasses__()]))
    return Mode


def make_trace_mode():
    import torch
    from torch.overrides import TorchFunctionMode

    empties = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
               torch.ops.aten.empty_strided.default, torch.ops.aten.new_empty.default,
               torch.ops.aten.new_empty_strided.default}
    int_views = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
                 torch.float64: torch.int64}

    class Trace(dispatch_mode()):
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


SHIMS: list = []  # the interpreter shims module, once loaded (interpreter backend only)


def load_interpreter_shims() -> list[str]:
    """Close the interpreter's known gaps (float scalar arguments, libdevice; interpreter_shims.py beside this file,
    loaded by path: this worker imports nothing of the workbench package). Returns what was patched."""
    spec = importlib.util.spec_from_file_location("interpreter_shims", Path(__file__).with_name("interpreter_shims.py"))
    shims = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shims)
    SHIMS.append(shims)
    return shims.install()


def classify(exc: BaseException, candidate: str) -> dict:
    """{kind, message}: kind is compile_error (Triton rejected the kernel), oom, runtime_error, or
    interpreter_unsupported (a known limitation of the interpreter, not of the kernel: the GPU targets decide).

    The interpreter wraps whatever a kernel body raises in InterpreterError; a semantic error there (a non-power-of-two
    arange, a wrong type, an undefined name) is what the compiler would have rejected on a GPU.
    """
    unsupported = SHIMS[0].unsupported_reason(exc) if SHIMS else None
    if unsupported:
        return {"kind": "interpreter_unsupported", "message": unsupported[:500]}
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


def _same_memory(a, b) -> bool:
    """Whether ``a`` is ``b``'s memory as ``b`` lays it out (an in-place update returned as its input)."""
    if not b.numel():
        return a.shape == b.shape
    return (a.untyped_storage().data_ptr(), a.storage_offset(), a.shape, a.stride()) == \
        (b.untyped_storage().data_ptr(), b.storage_offset(), b.shape, b.stride())


@contextlib.contextmanager
def _profiled(safe):
    """torch's autograd profiler around the trial (torch.profiler's imports Inductor and Dynamo when it starts); its
    start and stop lines on stderr (kineto's) go to /dev/null, the candidate's output in between does not."""
    profiler = safe.profile(use_cpu=True)

    def quietly(step) -> None:
        kept = safe.dup(2)
        safe.dup2(safe.null_fd, 2)
        try:
            step()
        finally:
            safe.dup2(kept, 2)
            safe.close(kept)

    quietly(profiler.__enter__)
    try:
        yield profiler
    finally:
        quietly(lambda: profiler.__exit__(None, None, None))


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
    # torch's C++ op events (RecordFunction): a Python mode switch inside ``run`` cannot turn them off
    with _profiled(safe) as profiler:
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
    entry["profiled_ops"] = sorted({e.name.replace("::", ".", 1) for e in profiler.function_events
                                    if e.name.startswith("aten::")})
    tensors_out = [o for o in outputs if isinstance(o, torch.Tensor)]
    entry["subclass"] = [type(t).__name__ for t in tensors_out + [g for g in grads.values() if g is not None]
                         if type(t) is not torch.Tensor]
    # a cache the block updates in place (job["in_place"]: input name -> output position) comes back as its input
    in_place = {pos: args[arg_names.index(name)] for name, pos in job["in_place"].items()}
    entry["not_in_place"] = [name for name, pos in job["in_place"].items()
                             if not (pos < len(outputs) and isinstance(outputs[pos], torch.Tensor)
                                     and _same_memory(outputs[pos], in_place[pos]))]
    out_storages = [t.untyped_storage().data_ptr() for i, t in enumerate(outputs)
                    if isinstance(t, torch.Tensor) and t.numel() and i not in in_place]
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

    entry["mutated"] = [name for name, value in pristine.items() if name not in job["in_place"]
                        and not same(value, safe.detach(args[arg_names.index(name)]))]
    entry["mutated"] += [f"grad_output[{i}]" for i, (g, h) in enumerate(zip(trial["grad_outputs"], grad_outputs,
                                                                           strict=True))
                         if g is not None and not same(g, h)]
    plain = (lambda t: safe.detach(torch.Tensor.as_subclass(t, torch.Tensor)) if isinstance(t, torch.Tensor) else t)
    entry["outputs"] = [plain(o) for o in outputs]
    entry["grads"] = {k: plain(v) for k, v in grads.items()}
    previous.update(out_storages)
    return entry


def make_abstract_mode():
    """A dispatch mode for captures: host code that reads a meta tensor's values back gets zeros of the right type
    (a kernel's counts or offsets, which no kernel computed)."""
    import torch

    class Abstract(dispatch_mode()):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            source = args[0] if args else None
            if isinstance(source, torch.Tensor) and source.is_meta:
                if func is torch.ops.aten._local_scalar_dense.default:
                    return False if source.dtype == torch.bool else 0 if not source.is_floating_point() else 0.0
                if func is torch.ops.aten._to_copy.default and str(kwargs.get("device", "meta")) != "meta":
                    return torch.zeros(source.shape, dtype=kwargs.get("dtype") or source.dtype,
                                       device=kwargs["device"])
            return func(*args, **kwargs)

    return Abstract


def make_zeroing_mode():
    """A dispatch mode for a probe on real tensors: every fresh buffer is zeros, so what the host code reads back from
    a buffer no (skipped) kernel wrote is zeros, as a meta capture answers."""
    import torch

    fresh = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default,
             torch.ops.aten.empty_like.default, torch.ops.aten.new_empty.default,
             torch.ops.aten.new_empty_strided.default}

    class Zeroing(dispatch_mode()):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            return out.zero_() if func in fresh else out

    return Zeroing


def capture(module, job_capture: dict, job: dict, launches: Launches, safe) -> dict:
    """Call ``module.run`` and its backward on the capture's meta inputs, recording (not executing) every launch
    under the capture's suite and target; a module with per-target launch settings reads the target from its
    LAUNCH_TARGET. A probe on real tensors (``probe: "real"``) takes zeros of the inputs' shapes and dtypes on the
    CPU instead, every fresh buffer zeros: honest host code launches there what it launches on meta tensors (the
    parent compares the two: capture_divergence). {id, error, launches}: error when the host code failed at these
    sizes; launches, the kernel launches of one call ({"fwd": n, "fwd+bwd": m}; an autotuned kernel's call one)."""
    import torch

    run, target = module.run, job_capture.get("target")
    real = job_capture.get("probe") == "real"
    launches.suite, launches.target, launches.skip = job_capture["suite"], target, True
    if hasattr(module, "LAUNCH_TARGET"):
        module.LAUNCH_TARGET = target
    args, leaves = [], []
    for name in job["arg_names"]:
        value = job_capture["inputs"][name]
        if real and isinstance(value, torch.Tensor):
            value = torch.zeros(value.shape, dtype=value.dtype)
        if isinstance(value, torch.Tensor) and name in job["grad_inputs"] and value.is_floating_point():
            value = safe.detach(value).requires_grad_(True)
            leaves.append(value)
        args.append(value)
    before = launches.count[0]
    per_call = {}
    try:
        with (make_zeroing_mode() if real else make_abstract_mode())():
            out = run(*args)
            per_call["fwd"] = launches.count[0] - before
            outputs = list(out) if isinstance(out, tuple | list) else [out]
            grown = [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
            if leaves and grown and not job.get("forward_only"):
                safe.grad(grown, leaves, [torch.empty_like(o) for o in grown], allow_unused=True)
                per_call["fwd+bwd"] = launches.count[0] - before
        error = None
    except Exception as exc:  # noqa: BLE001 - recorded: the launches of these sizes are incomplete
        error = classify(exc, job["candidate"])
    finally:
        launches.skip, launches.target = False, None
        if hasattr(module, "LAUNCH_TARGET"):
            module.LAUNCH_TARGET = None
    return {"id": job_capture["id"], "suite": job_capture["suite"], "target": target, "error": error,
            "launches": per_call}


def main(job_dir: str, result_fd: int) -> int:
    import torch
    import triton
    import triton.language as tl
    from triton.runtime import autotuner, jit

    job_file = Path(job_dir) / "job.pt"
    job = torch.load(job_file, weights_only=True)
    job_file.unlink()  # the candidate never sees the job (nor the token that authenticates the result)
    token = job.pop("token")
    del sys.argv[1:]
    candidate = job["candidate"]
    # the temporary folder is the scratch folder before the warm-up below: there torch fixes its inductor cache folder
    # (TORCHINDUCTOR_CACHE_DIR, under the temporary folder), which every later torch.compile makes again (os.makedirs),
    # so a candidate's package that compiles at import writes inside scratch, not outside it
    (Path(job_dir) / "scratch").mkdir(exist_ok=True)
    os.environ["TMPDIR"] = tempfile.tempdir = str(Path(job_dir) / "scratch")  # the candidate's own temporary files
    launches = Launches(candidate)
    counter = launches.count
    launches.watch(jit.JITFunction)
    launches.watch_autotuner(autotuner.Autotuner)
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton.runtime import interpreter

        launches.watch(interpreter.InterpretedFunction)
        load_interpreter_shims()
    import torch.autograd.profiler

    safe = types.SimpleNamespace(clone=torch.Tensor.clone, detach=torch.Tensor.detach, view=torch.Tensor.view,
                                 contiguous=torch.Tensor.contiguous, equal=torch.equal, grad=torch.autograd.grad,
                                 save=torch.save, clock=time.perf_counter, synchronize=torch.cuda.synchronize,
                                 profile=torch.autograd.profiler.profile,
                                 dup=os.dup, dup2=os.dup2, close=os.close, null_fd=os.open(os.devnull, os.O_WRONLY))
    import torch.autograd.graph

    watched = {"torch": torch, "torch.Tensor": torch.Tensor, "torch.autograd": torch.autograd,
               "torch.autograd.Function": torch.autograd.Function, "torch.autograd.graph": torch.autograd.graph,
               "torch.autograd.graph.Node": torch.autograd.graph.Node, "torch.nn.functional": torch.nn.functional,
               "triton": triton, "triton.language": tl, "triton.runtime": triton.runtime, "triton.runtime.jit": jit,
               "triton.runtime.jit.JITFunction": jit.JITFunction, "triton.runtime.jit.KernelInterface":
               jit.KernelInterface, "time": time, "builtins": builtins, "sys": sys, "worker": sys.modules[__name__]}
    if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter's launch path
        from triton.runtime import interpreter

        watched.update({"triton.runtime.interpreter": interpreter,
                        "triton.runtime.interpreter.InterpretedFunction": interpreter.InterpretedFunction,
                        "triton.runtime.interpreter.GridExecutor": interpreter.GridExecutor})
    modes = make_trace_mode()
    with modes[1](), modes[0]():  # warm up: the first traced ops import modules lazily
        torch.empty(2, 2, device=job["device"]).reshape(4).clone().sum()
    # what importing torch._dynamo does to the watched namespaces, done here so that a candidate which compiles (and
    # so imports Dynamo after the snapshot) changes nothing the snapshot holds (torch/_dynamo/__init__.py)
    if torch.manual_seed is torch.random.manual_seed:
        import torch.jit._builtins

        torch.manual_seed = torch._disable_dynamo(torch.manual_seed)
        torch.jit._builtins._register_builtin(torch.manual_seed, "aten::manual_seed")
    before = _snapshot(watched)
    threads = threading.active_count()
    events: list[dict] = []
    sys.meta_path.insert(0, RefuseWorkbench())
    # writes are refused under bubblewrap too: there they would fail anyway, and the attempt is worth a verdict
    sys.addaudithook(make_audit_hook(candidate, job_dir, events, guard_writes=True))

    results: dict = {"load_error": None, "trials": [], "captures": [], "launches": launches.records,
                     "events": events, "patched": []}
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
            launches.suite = trial.get("suite", "")
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
        if not results["patched"]:
            results["captures"] = [capture(module, c, job, launches, safe) for c in job.get("captures", [])]
            results["patched"] = _patched(before, watched)
    results["token"] = token
    blob = io.BytesIO()
    safe.save(results, blob)
    with os.fdopen(result_fd, "wb") as channel:
        channel.write(blob.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
