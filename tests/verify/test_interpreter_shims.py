"""workbench/verify/interpreter_shims.py: the float-argument and libdevice shims let kernels that compile on a GPU
run on the Triton interpreter, and unsupported_reason names the interpreter's own limitations.

The kernels run in a child process (CHILD), once without install() and once with it: interpreted kernels never enter
the test process. The shims module is loaded by path, as the sandbox worker loads it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.interpreter

SHIMS = Path(__file__).resolve().parents[2] / "workbench" / "verify" / "interpreter_shims.py"

CHILD = textwrap.dedent('''
    import importlib.util, json, os, sys
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import torch
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
    from triton.language.extra.libdevice import tanh as bound_early  # bound before install(), as Liger does

    spec = importlib.util.spec_from_file_location("interpreter_shims", sys.argv[1])
    shims = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shims)
    installed = shims.install() if sys.argv[2] == "shim" else []


    @triton.jit
    def scale_kernel(x_ptr, y_ptr, eps, N: tl.constexpr):
        o = tl.arange(0, N)
        tl.store(y_ptr + o, tl.load(x_ptr + o) * eps.to(tl.float32))


    @triton.jit
    def libdevice_kernel(x_ptr, y_ptr, N: tl.constexpr):
        o = tl.arange(0, N)
        x = tl.load(x_ptr + o)
        tl.store(y_ptr + o, libdevice.rsqrt(x) + libdevice.tanh(x) + bound_early(x) + libdevice.pow(x, 3.0))


    @triton.jit
    def unmapped_kernel(x_ptr, y_ptr, N: tl.constexpr):
        o = tl.arange(0, N)
        tl.store(y_ptr + o, libdevice.j0(tl.load(x_ptr + o)))


    @triton.jit
    def square_kernel(x_ptr, y_ptr, N: tl.constexpr):
        o = tl.arange(0, N)
        x = tl.load(x_ptr + o)
        tl.store(y_ptr + o, x * x)


    x = torch.linspace(0.5, 3.0, 16)
    cases = {
        "float_arg": (scale_kernel, x, (0.37,), x * 0.37),
        "libdevice": (libdevice_kernel, x, (), torch.rsqrt(x) + 2 * torch.tanh(x) + x ** 3),
        "unmapped": (unmapped_kernel, x, (), None),
        "bf16": (square_kernel, x.bfloat16(), (), None),
    }
    results = {"installed": installed}
    for name, (kernel, inp, extra, expected) in cases.items():
        y = torch.zeros_like(inp)
        try:
            kernel[(1,)](inp, y, *extra, 16)
        except Exception as exc:
            results[name] = {"ran": False, "error": repr(exc)[:300], "reason": shims.unsupported_reason(exc)}
        else:
            err = None if expected is None else float((y.double() - expected.double()).abs().max())
            results[name] = {"ran": True, "err": err}
    print("RESULTS " + json.dumps(results))
''')


def run_child(tmp_path_factory, mode: str) -> dict:
    script = tmp_path_factory.mktemp("shims") / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(script), str(SHIMS), mode], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULTS "))
    return json.loads(line.removeprefix("RESULTS "))


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> dict:
    return run_child(tmp_path_factory, "plain")


@pytest.fixture(scope="module")
def shimmed(tmp_path_factory) -> dict:
    return run_child(tmp_path_factory, "shim")


@pytest.fixture(scope="module")
def shims():
    spec = importlib.util.spec_from_file_location("interpreter_shims_under_test", SHIMS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_shims_the_interpreter_fails_on_float_args_and_libdevice(plain):
    assert plain["installed"] == []
    assert not plain["float_arg"]["ran"] and "object has no attribute" in plain["float_arg"]["error"]
    assert not plain["libdevice"]["ran"]  # a libdevice stub returns None in the interpreter


def test_with_shims_float_args_and_libdevice_match_torch(shimmed):
    assert shimmed["installed"], "install() patched nothing under TRITON_INTERPRET=1"
    assert shimmed["float_arg"] == {"ran": True, "err": 0.0}  # fp32 * fp32, exactly as torch rounds it
    assert shimmed["libdevice"]["ran"], shimmed["libdevice"]
    assert shimmed["libdevice"]["err"] < 1e-5


def test_unmapped_libdevice_and_bf16_arithmetic_are_named_as_interpreter_limits(shimmed):
    assert not shimmed["unmapped"]["ran"] and "__nv_j0f" in shimmed["unmapped"]["reason"]
    assert not shimmed["bf16"]["ran"] and "bfloat16" in shimmed["bf16"]["reason"]


def test_install_is_a_no_op_off_the_interpreter(shims, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert shims.install() == []


def _wrapped(cause: BaseException) -> BaseException:
    """What the interpreter raises for an exception inside a kernel: InterpreterError(repr(cause)) from cause."""
    from triton.runtime.errors import InterpreterError

    try:
        raise InterpreterError(repr(cause)) from cause
    except InterpreterError as exc:
        return exc


@pytest.mark.parametrize("cause, expect", [
    (NotImplementedError("extern_elementwise not supported in interpreter mode"), "extern"),
    (NotImplementedError("no interpreter implementation of extern function '__nv_j0f': extern_elementwise not "
                         "supported in interpreter mode"), "__nv_j0f"),
    (NotImplementedError("inline_asm not supported in interpreter mode"), "inline assembly"),
    (NotImplementedError("bfloat16 arithmetic not supported in interpreter mode (...)"), "bfloat16"),
    (AttributeError("'InterpreterBuilder' object has no attribute 'create_map_elementwise'"),
     "create_map_elementwise"),
    (ValueError("Did you forget to add @triton.jit ? (`_semantic` argument must be provided outside of JIT "
                "functions.)"), "builtins"),
    (NotImplementedError("tensor descriptor reduce is not implemented by the interpreter"), "interpreter"),
], ids=["extern", "extern-symbol", "inline-asm", "bf16", "builder-op", "foreign-builtin", "generic"])
def test_unsupported_reason_names_interpreter_limits(shims, cause, expect):
    reason = shims.unsupported_reason(_wrapped(cause))
    assert reason is not None and expect in reason and "\n" not in reason
    if not isinstance(cause, ValueError):  # the bare exception says the same, wrapped or not
        assert shims.unsupported_reason(cause) == reason


def test_unsupported_reason_follows_the_cause_chain(shims):
    try:
        try:
            raise AssertionError("triton.language must be visible from within jit'd function")
        except AssertionError as inner:
            raise RuntimeError("launch failed") from inner
    except RuntimeError as exc:
        assert "triton.language" in shims.unsupported_reason(exc)


@pytest.mark.parametrize("exc", [
    ValueError("arange's range must be a power of 2"),
    TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'"),
    RuntimeError("out of memory"),
    ValueError("Did you forget to add @triton.jit ? (`_semantic` argument must be provided outside of JIT "
               "functions.)"),  # a builtin called from host code: the candidate's mistake
], ids=["bad-arange", "type", "oom", "builtin-on-host"])
def test_unsupported_reason_is_none_for_kernel_bugs(shims, exc):
    assert shims.unsupported_reason(exc) is None
    if "_semantic" not in str(exc):
        assert shims.unsupported_reason(_wrapped(exc)) is None


def test_unsupported_reason_survives_a_cyclic_chain(shims):
    exc = ValueError("x")
    exc.__context__ = exc
    assert shims.unsupported_reason(exc) is None
