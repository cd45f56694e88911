"""Shims that let third-party Triton kernels, used as shipped, run on the Triton interpreter (TRITON_INTERPRET=1).

Self-contained (torch, triton and numpy only): the sandbox worker loads this file by path. Written against
Triton 3.9's ``triton/runtime/interpreter.py``; ``install()`` closes two gaps there that compiled kernels never hit:

1. Float arguments. ``_implicit_cvt`` (interpreter.py:1359) wraps bool, int and pointer arguments as scalars but hands a
   float over as a Python float, so ``eps.to(tl.float32)`` (Liger-Kernel's norms, SwiGLU) raises AttributeError.
   A compiled kernel gets an fp32 scalar (``mangle_type(1e-6) == "fp32"``); the shim wraps floats the same way.
2. libdevice. ``triton.language.extra.libdevice`` holds stubs that the compiler swaps for the backend's module
   (``module_map`` in ``compiler/code_generator.py``); the interpreter never swaps them, so a stub returns None.
   The CUDA module's functions need a ``_semantic`` the interpreter injects only into ``triton.language``,
   ``.core`` and ``.math`` (``_patch_lang``, interpreter.py:1343), and ``create_extern_elementwise``
   (interpreter.py:871) raises "extern_elementwise not supported in interpreter mode". The shim rebinds libdevice
   references in a kernel's globals at launch, calls the CUDA module's function (its type table checks argument
   types just as on a GPU) and evaluates the resulting ``__nv_*`` symbol with numpy.

It also turns one silent gap into an error: the interpreter stores bfloat16 as uint16 and its elementwise ops
compute on those bit patterns as integers (``binary_op``, interpreter.py:588), so bf16 arithmetic raises instead.

``unsupported_reason(exc)`` names a failure that comes from an interpreter limitation rather than from the kernel.
"""

from __future__ import annotations

import math
import os
import re
import types

import numpy as np

INTERPRETER_MODE = "not supported in interpreter mode"
BF16_MESSAGE = "bfloat16 arithmetic " + INTERPRETER_MODE + " (bf16 is stored as uint16 and computed as integers)"
STUB = "triton.language.extra.libdevice"
BACKENDS = ("triton.language.extra.cuda.libdevice", "triton.language.extra.hip.libdevice")
_MARK = "_interpreter_shim"


def _vectorized(fn, pole=lambda *v: math.nan):
    """A scalar math function applied elementwise (in float64); ``pole(*v)`` where it raises (poles, domain)."""
    def safe(*v):
        try:
            return fn(*v)
        except (ValueError, OverflowError):
            return pole(*v)
    return lambda *arrays: np.vectorize(safe, otypes=[np.float64])(*arrays)


def _gamma_pole(v):
    return math.copysign(math.inf, v) if v == 0 or v > 0 else math.nan  # +-0: +-inf; overflow: inf; -n: NaN


def _round_half_away(x):
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _fdim(x, y):
    return np.where(np.isnan(x) | np.isnan(y), np.nan, np.where(x > y, x - y, 0))


def _numpy_table() -> dict:
    """libdevice symbol stem (``__nv_`` and the fp32 ``f`` / fp64 ``d`` suffix removed) -> numpy function."""
    unary = {
        "abs": np.abs, "fabs": np.abs, "llabs": np.abs, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc,
        "rint": np.rint, "nearbyint": np.rint, "round": _round_half_away, "sqrt": np.sqrt, "fsqrt_rn": np.sqrt,
        "dsqrt_rn": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "frsqrt_rn": lambda x: 1 / np.sqrt(x),
        "frcp_rn": np.reciprocal, "drcp_rn": np.reciprocal, "cbrt": np.cbrt, "rcbrt": lambda x: 1 / np.cbrt(x),
        "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: np.power(x.dtype.type(10), x), "expm1": np.expm1,
        "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p, "sin": np.sin, "cos": np.cos,
        "tan": np.tan, "sinpi": lambda x: np.sin(np.pi * x), "cospi": lambda x: np.cos(np.pi * x), "sinh": np.sinh,
        "cosh": np.cosh, "tanh": np.tanh, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
        "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "erfc": _vectorized(math.erfc),
        "lgamma": _vectorized(math.lgamma, lambda v: math.inf), "tgamma": _vectorized(math.gamma, _gamma_pole),
        "normcdf": _vectorized(lambda v: 0.5 * math.erfc(-v / math.sqrt(2))),
        "saturate": lambda x: np.clip(x, 0, 1), "isnan": np.isnan, "isinf": np.isinf, "finite": np.isfinite,
        "isfinite": np.isfinite, "signbit": np.signbit,
        "fast_exp": np.exp, "fast_exp10": lambda x: np.power(x.dtype.type(10), x), "fast_log": np.log,
        "fast_log2": np.log2, "fast_log10": np.log10, "fast_sin": np.sin, "fast_cos": np.cos, "fast_tan": np.tan,
    }
    binary = {
        "pow": np.power, "fast_pow": np.power, "powi": lambda x, n: np.power(x, n.astype(x.dtype)),
        "atan2": np.arctan2, "hypot": np.hypot, "rhypot": lambda x, y: 1 / np.hypot(x, y), "fmod": np.fmod,
        "remainder": _vectorized(math.remainder), "copysign": np.copysign, "nextafter": np.nextafter,
        "fdim": _fdim, "ldexp": lambda x, n: np.ldexp(x, n), "scalbn": lambda x, n: np.ldexp(x, n),
        "fadd_rn": np.add, "dadd_rn": np.add, "fsub_rn": np.subtract, "dsub_rn": np.subtract,
        "fmul_rn": np.multiply, "dmul_rn": np.multiply, "fdiv_rn": np.divide, "ddiv_rn": np.divide,
        "fast_fdivide": np.divide,
    }
    return {**unary, **binary}


def _lookup(symbol: str, table: dict):
    if not symbol.startswith("__nv_"):
        return None
    stem = symbol.removeprefix("__nv_")
    for key in (stem, stem[:-1] if stem[-1:] in "fd" else None):
        if key in table:
            return table[key]
    return None


def install() -> list[str]:
    """Apply the shims when TRITON_INTERPRET=1 (a no-op otherwise); return the names of what is patched.

    Idempotent. Run it before a kernel is launched; libdevice functions bound by ``from ... import`` before it ran
    are rebound at launch, so it may come before or after the kernels' modules are imported."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return []
    import triton.language as tl
    import triton.language.extra.cuda.libdevice as cuda_libdevice
    import triton.language.extra.libdevice as stub
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    patched = ["interpreter._implicit_cvt", "interpreter._patch_lang", "InterpreterBuilder.create_extern_elementwise",
               f"{STUB} (stubs -> CUDA libdevice)", "InterpreterBuilder.binary_op/unary_op/create_fma (bf16 guard)"]
    if getattr(interp._implicit_cvt, _MARK, False):
        return patched

    # 1. float arguments -> fp32 scalars, as _implicit_cvt does for ints (tuples recurse through the patched name)
    implicit_cvt = interp._implicit_cvt

    def _implicit_cvt(arg):
        if isinstance(arg, float):
            with np.errstate(over="ignore"):
                data = np.array([arg], dtype=np.float32)
            return tl.tensor(interp.TensorHandle(data, tl.float32), tl.float32)
        return implicit_cvt(arg)

    # 2. libdevice: stubs and backend functions -> the CUDA function, called with the interpreter's semantic
    def shim(name):
        target = getattr(cuda_libdevice, name)

        def call(*args, _semantic=None, **kwargs):
            return target(*args, **kwargs, _semantic=interp.interpreter_semantic)
        call.__name__ = call.__qualname__ = name
        call.__module__ = STUB  # what the compiler's module_map keys on, should this ever be compiled
        call.__doc__ = target.__doc__
        setattr(call, _MARK, True)
        return call

    names = [n for n, v in vars(stub).items() if isinstance(v, types.FunctionType) and v.__module__ == STUB
             and isinstance(getattr(cuda_libdevice, n, None), types.FunctionType)]
    shims = {n: shim(n) for n in names}
    for n, fn in shims.items():
        setattr(stub, n, fn)

    def rebind(namespace: dict) -> None:
        """Rebind the libdevice references of a kernel's globals (function or module) to the shims."""
        for key, value in list(namespace.items()):
            if isinstance(value, types.FunctionType) and not getattr(value, _MARK, False) \
                    and getattr(value, "__module__", "") in (STUB, *BACKENDS) and value.__name__ in shims:
                namespace[key] = shims[value.__name__]
            elif isinstance(value, types.ModuleType) and value.__name__ in BACKENDS:
                namespace[key] = stub

    patch_lang = interp._patch_lang

    def _patch_lang(fn):
        rebind(fn.__globals__)
        return patch_lang(fn)

    table = _numpy_table()

    def create_extern_elementwise(self, libName, libPath, symbol, argList, retType, isPure):
        if symbol in ("__nv_fma", "__nv_fmaf", "__nv_fma_rn", "__nv_fmaf_rn"):
            return self.create_fma(*argList)
        if symbol in ("__nv_erff", "__nv_erf"):
            return self.create_erf(*argList)
        fn = _lookup(symbol, table)
        if fn is None:
            raise NotImplementedError(f"no interpreter implementation of extern function '{symbol}': "
                                      f"extern_elementwise {INTERPRETER_MODE}")
        with np.errstate(all="ignore"):
            data = np.asarray(fn(*(a.data for a in argList))).astype(interp._get_np_dtype(retType))
        return interp.TensorHandle(data, retType.scalar)

    # 3. bfloat16 guard: elementwise math on bf16 handles would compute on uint16 bit patterns
    def guarded(method):
        def check(self, *handles_and_op):
            if any(isinstance(h, interp.TensorHandle) and h.dtype == tl.bfloat16 for h in handles_and_op):
                raise NotImplementedError(BF16_MESSAGE)
            return method(self, *handles_and_op)
        return check

    interp._implicit_cvt = _implicit_cvt
    interp._patch_lang = _patch_lang
    builder.create_extern_elementwise = create_extern_elementwise
    for name in ("binary_op", "unary_op", "create_fma"):
        setattr(builder, name, guarded(getattr(builder, name)))
    setattr(interp._implicit_cvt, _MARK, True)
    return patched


# (pattern, reason): the reason may use the pattern's groups
_REASONS = [
    (r"no interpreter implementation of extern function '([^']+)'",
     "the Triton interpreter has no implementation of libdevice/extern function {0}"),
    (r"extern_elementwise not supported in interpreter mode",
     "the Triton interpreter cannot run extern (libdevice) functions"),
    (r"inline_asm not supported in interpreter mode",
     "the Triton interpreter cannot run inline assembly (tl.inline_asm_elementwise)"),
    (r"bfloat16 arithmetic not supported in interpreter mode",
     "the Triton interpreter computes bfloat16 arithmetic on raw bit patterns (GPU only)"),
    (r"'InterpreterBuilder' object has no attribute '(\w+)'",
     "the Triton interpreter does not implement {0}"),
    (r"`_semantic` argument must be provided outside of JIT functions",
     "the Triton interpreter only injects builtins of triton.language(.core/.math); the kernel called another one"),
    (r"triton\.language must be visible from within jit'd function",
     "the Triton interpreter needs the kernel's module to import triton.language as a module"),
    (r"fail to convert (\S+) to ir type", "the Triton interpreter does not support the type {0}"),
]


def unsupported_reason(exc: BaseException) -> str | None:
    """One line naming the interpreter limitation behind ``exc`` (or an exception it was raised from), else None.

    The interpreter wraps what a kernel raises in InterpreterError(repr(cause)); both are looked at. A builtin
    called without ``_semantic`` counts only inside a kernel (an InterpreterError): outside, it is a misuse."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    in_kernel = any(type(e).__name__ == "InterpreterError" for e in chain)
    for e in chain:
        text = str(e)
        for pattern, reason in _REASONS:
            match = re.search(pattern, text)
            if match and (in_kernel or "_semantic" not in pattern):
                return reason.format(*match.groups())
        if isinstance(e, NotImplementedError) and "interpret" in text.lower():
            return "the Triton interpreter: " + (text.strip().splitlines() or [""])[0][:200]
    return None
