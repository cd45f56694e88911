"""A static scan of a candidate's own source, before it runs, for code that reaches into the verifier's
instrumentation: torch's mode stacks (the dispatch trace is a TorchDispatchMode that such code can step outside),
torch's C extension, and the function internals (closures, code objects, globals) through which the worker's
watchers could be reached. Only the candidate's file is scanned: the packages it imports (Triton, Liger, fla) are
trusted as installed, and ALLOWED lists the private names kernel code legitimately uses.

Names written as strings count too (``getattr(m, "__closure__")``, ``importlib.import_module("torch._C")``); a name
assembled at run time escapes this scan, and the worker's profiler trace (C++ RecordFunction events, which no Python
mode switch turns off) catches the torch ops it then runs.
"""

from __future__ import annotations

import ast

from workbench import syntax

FORBIDDEN_MODULES = ("torch.utils._python_dispatch", "torch._C", "torch._subclasses", "torch.overrides",
                     "torch.fx.experimental.proxy_tensor", "torch._dispatch", "torch._ops")
# (frame attributes are the audit hook's, at run time: verdict introspection)
FORBIDDEN_ATTRIBUTES = frozenset({
    "__closure__", "__code__", "__globals__", "__builtins__", "_disable_current_modes", "_push_mode", "_pop_mode",
    "_get_current_dispatch_mode",
    "_get_current_dispatch_mode_stack", "_set_dispatch_mode", "_unset_dispatch_mode", "_pop_torch_function_stack",
    "_push_on_torch_function_stack", "_len_torch_function_stack", "DisableTorchFunction",
    "DisableTorchFunctionSubclass", "_DisableTorchDispatch", "_disabled_torch_function_impl",
    "_disabled_torch_dispatch_impl", "_ExcludeDispatchKeyGuard", "_AutoDispatchBelowAutograd",
})
ALLOWED = frozenset({"torch._C._get_accelerator", "torch._C._cuda_getCurrentRawStream"})


def _dotted(node: ast.AST) -> str | None:
    """``torch.utils._python_dispatch`` for the attribute chain, None when it does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _forbidden_module(name: str) -> str | None:
    if name in ALLOWED:
        return None
    return next((m for m in FORBIDDEN_MODULES if name == m or name.startswith(m + ".")), None)


def instrumentation_access(source: str) -> str | None:
    """"line N: <what>" for the first place the source reaches into the instrumentation, None when it does not (or
    does not parse: the verifier's compile_error speaks for that)."""
    try:
        tree = syntax.parse(source)
    except (SyntaxError, ValueError):
        return None
    inside_allowed = set()  # the inner links of an allowed chain (torch._C of torch._C._get_accelerator)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _dotted(node) in ALLOWED:
            inner = node.value
            while isinstance(inner, ast.Attribute):
                inside_allowed.add(id(inner))
                inner = inner.value
    for node in ast.walk(tree):
        found = None
        if isinstance(node, ast.Import):
            found = next((f"imports {a.name}" for a in node.names if _forbidden_module(a.name)), None)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if _forbidden_module(node.module):
                found = f"imports from {node.module}"
            else:
                found = next((f"imports {node.module}.{a.name}" for a in node.names
                              if _forbidden_module(f"{node.module}.{a.name}") or a.name in FORBIDDEN_ATTRIBUTES),
                             None)
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if node.attr in FORBIDDEN_ATTRIBUTES:
                found = f"reads .{node.attr}"
            elif dotted and id(node) not in inside_allowed and _forbidden_module(dotted):
                found = f"uses {dotted}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.strip()
            if text in FORBIDDEN_ATTRIBUTES:
                found = f"names {text!r}"
            elif _forbidden_module(text):
                found = f"names the module {text!r}"
        if found:
            return f"line {node.lineno}: {found}"
    return None


RUNTIME_PROBES = frozenset({"is_meta", "is_fake", "is_available", "device_count", "is_initialized",
                            "get_device_capability", "get_device_properties", "FakeTensor", "FakeTensorMode"})
"""Names through which host code tells a capture (the model suite's launches recorded on meta tensors, on a machine
without a GPU) from a run on the GPU: ``x.is_meta``, ``torch.cuda.is_available()`` and its kin, fake tensors. No
operator needs them: the device a launch runs on comes from the tensors' device and the module's LAUNCH_TARGET
(templates/_launch.j2), which the verifier sets for each target. ``torch._subclasses`` is refused above."""
PROBE_ALLOWED: frozenset[str] = frozenset()
"""Dotted names of RUNTIME_PROBES that host code may use anyway: none today (written down here when one is needed)."""


def capture_probe(source: str) -> str | None:
    """"line N: <what>" for the first place the source can tell a capture from a run (RUNTIME_PROBES, or a
    comparison with the string "meta"), None when it cannot (or does not parse)."""
    try:
        tree = syntax.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        found = None
        if isinstance(node, ast.Attribute) and node.attr in RUNTIME_PROBES and _dotted(node) not in PROBE_ALLOWED:
            found = f"reads .{node.attr}"
        elif isinstance(node, ast.Name) and node.id in RUNTIME_PROBES:
            found = f"names {node.id}"
        elif isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value == "meta"
                                                   for c in (node.left, *node.comparators)):
            found = 'compares with "meta"'
        elif isinstance(node, ast.Constant) and node.value in RUNTIME_PROBES:
            found = f"names {node.value!r}"
        if found:
            return f"line {node.lineno}: {found}"
    return None
