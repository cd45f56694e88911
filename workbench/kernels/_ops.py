"""The machinery behind every block module: a block's promoted operator as a pair of opaque ``torch.library`` custom
ops, ``workbench::<block>`` and ``workbench::<block>_backward``.

    workbench::<block>(<the reference's arguments>) -> <the reference's outputs>
    workbench::<block>_backward(Tensor?[] grads, bool[] needs, <the reference's arguments>) -> Tensor[]

The schema is read from the block's reference (workbench/blocks/<block>.py): tensors, optional tensors and the
non-tensor arguments (eps, scale, topk, reduction, ...) in its order with its defaults, one output per name in
``spec.outputs``.
The fake implementations run the block's reference on the fake inputs (or a per-block rule where the reference is
data-dependent), so both ops trace under ``torch.compile(fullgraph=True)`` without graph breaks.

Autograd, two paths; the gradients come from the operator's own autograd.Function backward (its Triton backward
kernels) on both, bitwise the same:

- Eager (not under ``torch.compile``), grad enabled and a grad input requiring grad: the forward op runs the
  operator's ``run`` once, with grad, on detached leaf copies of the grad inputs, and the autograd node keeps that
  graph (the operator's saved tensors, on its own ctx); backward is ``torch.autograd.grad`` on it: no second forward.
  How: the op's Autograd kernel (``_autograd_kernel``, wrapping torch's generated one) decides and hands the
  dispatch-key state it was called with to the forward (a thread-local slot), since torch runs the forward below
  autograd; the forward hands the graph to ``setup_context`` the same way. Both slots are cleared when the Autograd
  kernel returns, so a call without an autograd node (no_grad, inference_mode, nothing requiring grad) keeps nothing.
  A second backward through the same node (``retain_graph=True``), or one after an output was modified in place,
  recomputes instead (the next path), as the op did before.
- Under ``torch.compile`` (AOTAutograd on fake tensors), with fake or subclass tensors, under a dispatch mode or a
  functorch transform: ``setup_context`` saves the inputs and backward is the opaque ``workbench::<block>_backward``,
  which runs ``run`` again with grad on the saved inputs and calls ``torch.autograd.grad`` (one extra forward). What
  the operator's autograd.Function keeps cannot be returned from the forward op generically: its count and shapes
  are only known by running the kernels (a fake implementation cannot), and part of it is Python state on ``ctx``,
  some of it data-dependent. Calling the backward op directly always recomputes.

The backward op gives one gradient per name in ``spec.grad_inputs`` (an empty tensor where ``needs`` is False or the
input is None). Outputs are fresh (``_fresh``): contiguous, sharing memory with no input and no other output; on the
eager path an output shares its version counter with the kept graph's, so an in-place change of it is seen.

On the Triton interpreter (``TRITON_INTERPRET=1``) bfloat16 is refused where it would be wrong: the interpreter keeps
bfloat16 as raw uint16 bit patterns, and its ``tl.dot`` multiplies them as integers (relative errors ~1e8; triton
issue #11584), as would its elementwise arithmetic. While an op runs there, a kernel that hands bfloat16 operands to
``tl.dot`` (or to elementwise arithmetic) stops with ``InterpreterBFloat16Error``, one line; operators that upcast to
float32 before their dots (kda, moe_router) run bfloat16 and are right (tests/kernels/).

Which operator backs a block: the newest promoted one in the operators folder (``set_operators_dir``; default
``Settings.load().operators_dir``: ``$WORKBENCH_OPERATORS`` or ``./operators``), resolved at the first call and kept;
the training operator under the block's name, a forward-only (decode) port under ``<block>:forward-only``
(``BlockOp.forward_only``: ``workbench::<block>_forward_only``, no autograd).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import torch
from torch._library.autograd import make_autograd_impl
from torch.utils._python_dispatch import _get_current_dispatch_mode

from workbench.blocks import REGISTRY, get_block
from workbench.config import Settings
from workbench.errors import WorkbenchError
from workbench.operators import FORWARD_ONLY_SUFFIX, import_operator, newest_promoted

NAMESPACE = "workbench"

SCHEMA_TYPES = {"torch.Tensor": "Tensor", "torch.Tensor | None": "Tensor?", "float": "float", "float | None": "float?",
                "int": "int", "int | None": "int?", "bool": "bool", "str": "str"}
"""The reference's annotations (as written) and their types in a torch.library schema."""

_folder: Path | None = None
_resolved: dict[str, str] = {}          # key -> operator file, for the current folder
_modules: dict[str, ModuleType] = {}    # operator file -> its imported module

_local = threading.local()
RUNS: collections.Counter[str] = collections.Counter()
"""How many times each op's operator has run its forward in this process (``workbench::<block>`` and its
forward-only op by their keys): the evidence that a swapped-in op computed, not the shipped module it replaced
(``workbench parity`` fails a block that was swapped in and never ran)."""
"""Per thread: ``want`` (an op and the dispatch-key state its Autograd kernel was called with, for its forward to run
with grad; taken by that forward), ``kept`` (the forward's graph, taken by the op's setup_context; both cleared when
the Autograd kernel returns), ``guard`` (an op is running on the interpreter: bfloat16 operands refused)."""

BF16_GUARDED = ("create_dot", "binary_op", "unary_op", "create_fma")
"""The interpreter's builder methods that compute on bfloat16 handles as on integers (uint16 bit patterns)."""


class InterpreterBFloat16Error(WorkbenchError):
    """An op would compute in bfloat16 on the Triton interpreter, which computes bfloat16 wrong: one line."""


class _BFloat16Operands(Exception):
    """Raised inside an interpreted kernel by the guard: ``method`` got bfloat16 handles."""

    def __init__(self, method: str):
        super().__init__(f"bfloat16 operands to the interpreter's {method}")
        self.method = method


class _Kept(NamedTuple):
    """What an eager forward with grad hands its setup_context: the op, its returned outputs (to recognise them),
    the operator's outputs with their autograd graph, and the leaves (grad input position -> detached leaf)."""

    op: BlockOp
    outputs: list[torch.Tensor]
    graph: tuple[torch.Tensor, ...]
    leaves: dict[int, torch.Tensor]


def interpreting() -> bool:
    """Whether Triton kernels run on the interpreter (TRITON_INTERPRET=1, as everywhere in the workbench)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _install_bf16_guard() -> None:
    """Wrap the interpreter builder's BF16_GUARDED methods (once): while ``_local.guard`` is set (an op of this
    library is running), bfloat16 operands raise _BFloat16Operands instead of giving a wrong number. Kernels run
    by anything else are untouched."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_workbench_bf16_guard", False):
        return

    def guard(method: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def guarded(self, *args, **kwargs):
            if getattr(_local, "guard", False) and any(
                    isinstance(a, interpreter.TensorHandle) and a.dtype == tl.bfloat16 for a in args):
                raise _BFloat16Operands(method)
            return original(self, *args, **kwargs)
        return guarded

    for method in BF16_GUARDED:
        setattr(builder, method, guard(method, getattr(builder, method)))
    builder._workbench_bf16_guard = True


def _bf16_method(exc: BaseException) -> str | None:
    """The guarded method behind ``exc`` (the interpreter wraps a kernel's exception in InterpreterError), else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, _BFloat16Operands):
            return exc.method
        exc = exc.__cause__ or exc.__context__
    return None


def set_operators_dir(folder: str | Path | None) -> None:
    """Back every op by the operators promoted in ``folder`` (None: the settings' folder again), from the next call."""
    global _folder
    _folder = Path(folder) if folder is not None else None
    _resolved.clear()


def operators_dir() -> Path:
    """The folder the ops take their operators from."""
    return _folder if _folder is not None else Settings.load().operators_dir


def operator_path(key: str) -> str:
    """The file of the newest promoted operator under ``key`` (a block's name, or it and ":forward-only")."""
    if key not in _resolved:
        folder = operators_dir()
        found = newest_promoted(folder).get(key)
        if found is None:
            raise WorkbenchError(f"no promoted operator for '{key}' in {folder}")
        _resolved[key] = str(Path(found["path"]).resolve())
    return _resolved[key]


def load_operator(block: str, path: str) -> ModuleType:
    """The operator file ``path`` imported as a module (once per file); it must define BLOCK = ``block`` and run."""
    if path not in _modules:
        _modules[path] = import_operator(path, f"workbench_kernels_{Path(path).stem}", block)
    return _modules[path]


def _as_tuple(outputs: Any) -> tuple:
    return outputs if isinstance(outputs, tuple) else (outputs,)


def _fresh(outputs: Sequence[torch.Tensor], inputs: Sequence[Any]) -> list[torch.Tensor]:
    """Contiguous outputs, none sharing memory with an input or another output (a custom op's contract)."""
    taken = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.numel()}
    fresh = []
    for out in outputs:
        out = out.contiguous()
        if out.numel() and out.untyped_storage().data_ptr() in taken:
            out = out.clone()
        taken.add(out.untyped_storage().data_ptr())
        fresh.append(out)
    return fresh


class BlockOp:
    """A block's promoted operator as custom ops. Call it like the block's reference (same arguments, same outputs);
    ``op`` is ``torch.ops.workbench.<block>``. Its fake implementation is the block's ``abstract_outputs`` where the
    reference cannot run on fake tensors (data-dependent sizes or values), else the reference. A cache the block
    updates in place (``BlockSpec.updated_in_place``) is a mutated argument of the op (``Tensor(a!)``), not one of
    its returns: calling the BlockOp gives it back in its place among the outputs, as the reference does. A block
    without gradients has no autograd formula (calling it on tensors that require grad gives outputs that do not)."""

    def __init__(self, block: str, forward_only: bool = False):
        self.spec = get_block(block)
        self.block = block
        self.key = block + (FORWARD_ONLY_SUFFIX if forward_only else "")
        self.name = block + ("_forward_only" if forward_only else "")
        self._forward_only_op: BlockOp | None = None
        params = inspect.signature(self.spec.reference).parameters
        self.arg_names = tuple(params)
        self.defaults = tuple(p.default for p in params.values())
        self.grad_positions = tuple(self.arg_names.index(name) for name in self.spec.grad_inputs)
        # updated input's position among the arguments -> its position among the reference's outputs
        self.in_place = {self.arg_names.index(name): pos for name, pos in self.spec.in_place_outputs.items()}
        mutated = {name: f"Tensor({chr(ord('a') + i)}!)" for i, name in enumerate(self.spec.updated_in_place)}
        args = ", ".join(f"{mutated.get(name) or self._schema_type(p)} {name}{self._schema_default(p)}"
                         for name, p in params.items())
        returned = len(self.spec.outputs) - len(self.in_place)
        outputs = ", ".join(["Tensor"] * returned)
        returns = outputs if returned == 1 else f"({outputs})"
        qualified = f"{NAMESPACE}::{self.name}"
        self.custom_op = torch.library.custom_op(qualified, self._forward, mutates_args=tuple(mutated),
                                                 schema=f"({args}) -> {returns}")
        self.custom_op.register_fake(self._fake)
        self.op = getattr(getattr(torch.ops, NAMESPACE), self.name)
        self.backward_op = None
        if not forward_only and self.grad_positions:
            backward = torch.library.custom_op(f"{qualified}_backward", self._backward, mutates_args=(),
                                               schema=f"(Tensor?[] grads, bool[] needs, {args}) -> Tensor[]")
            backward.register_fake(self._backward_fake)
            self.backward_op = getattr(getattr(torch.ops, NAMESPACE), f"{self.name}_backward")
            self.custom_op.register_autograd(self._autograd_backward, setup_context=self._setup_context)
            # torch's generated Autograd kernel, wrapped to tell the forward (run below autograd) whether to keep
            # its graph; the override is torch's own "Overriding a previously registered kernel" warning, silenced
            self._generated_autograd = make_autograd_impl(self.op.default, self.custom_op)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Warning only once for all operators")
                self.custom_op._lib.impl(self.name, self._autograd_kernel, "Autograd", with_keyset=True)

    def _filled(self, args: Sequence[Any]) -> tuple:
        """``args`` with the trailing arguments the dispatcher stripped put back: torch removes the arguments equal
        to their schema defaults before it calls a Python kernel (attention's ``rel=None``)."""
        return (*args, *self.defaults[len(args):])

    def _schema_type(self, param: inspect.Parameter) -> str:
        annotation = param.annotation if isinstance(param.annotation, str) else inspect.formatannotation(
            param.annotation)
        if annotation not in SCHEMA_TYPES:
            raise WorkbenchError(f"{self.block}: argument '{param.name}' of type {annotation} has no schema type")
        return SCHEMA_TYPES[annotation]

    @staticmethod
    def _schema_default(param: inspect.Parameter) -> str:
        """``=<default>`` for a reference argument with a default (numbers, booleans, None), else ""."""
        if param.default is inspect.Parameter.empty:
            return ""
        return "=" + {None: "None", True: "True", False: "False"}.get(param.default, repr(param.default))

    def __call__(self, *args: Any) -> Any:
        returned = self.op(*args)
        if not self.in_place:
            return returned
        rest = iter(_as_tuple(returned))
        by_position = {pos: args[arg] for arg, pos in self.in_place.items()}
        return tuple(by_position[pos] if pos in by_position else next(rest) for pos in range(len(self.spec.outputs)))

    def operator_path(self) -> str:
        """The operator file backing this op (resolved in the operators folder at the first call)."""
        return operator_path(self.key)

    def operator(self) -> ModuleType:
        """The promoted operator's module (BLOCK, run, its kernels)."""
        return load_operator(self.block, self.operator_path())

    @property
    def forward_only(self) -> BlockOp:
        """``workbench::<block>_forward_only``: the block's forward-only (decode) operator, no autograd; registered
        at first use."""
        if self._forward_only_op is None:
            self._forward_only_op = BlockOp(self.block, forward_only=True)
        return self._forward_only_op

    # --- implementations -------------------------------------------------------------------------------------

    def _returned(self, outputs: list[torch.Tensor]) -> Any:
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @contextlib.contextmanager
    def _interpreter_guard(self, op_name: str, args: Sequence[Any]) -> Iterator[None]:
        """On the interpreter: bfloat16 operands to tl.dot or arithmetic in the kernels run inside refused, as
        InterpreterBFloat16Error (one line); elsewhere nothing."""
        if not interpreting():
            yield
            return
        _install_bf16_guard()
        previous, _local.guard = getattr(_local, "guard", False), True
        try:
            yield
        except Exception as exc:
            method = _bf16_method(exc)
            if method is None:
                raise
            raise InterpreterBFloat16Error(self._bf16_refusal(op_name, method, args)) from None
        finally:
            _local.guard = previous

    def _bf16_refusal(self, op_name: str, method: str, args: Sequence[Any]) -> str:
        dtypes = sorted({str(a.dtype).removeprefix("torch.") for a in args
                         if isinstance(a, torch.Tensor) and a.is_floating_point()})
        what = ("tl.dot on bfloat16 operands, which the Triton interpreter multiplies wrong (triton issue #11584)"
                if method == "create_dot" else
                "bfloat16 arithmetic, which the Triton interpreter computes on raw bit patterns")
        return (f"{NAMESPACE}::{op_name} refused in {'/'.join(dtypes) or 'bfloat16'} on the Triton interpreter "
                f"(TRITON_INTERPRET=1): its kernels ({Path(self.operator_path()).name}) run {what}; "
                f"call it with float32 or float16 tensors on CPU, or run on a GPU")

    def _keeps(self, args: Sequence[Any]) -> bool:
        """Whether a call will make an autograd node whose backward can use the forward's own graph: eager (not
        compiling, no dispatch mode or functorch transform, plain tensors), grad enabled, a grad input requiring
        grad."""
        if not torch.is_grad_enabled() or torch.compiler.is_compiling():
            return False
        if torch._C._are_functorch_transforms_active() or _get_current_dispatch_mode() is not None:
            return False
        if any(isinstance(a, torch.Tensor) and (type(a) not in (torch.Tensor, torch.nn.Parameter) or a.is_meta)
               for a in args):
            return False
        return any(args[pos] is not None and args[pos].requires_grad for pos in self.grad_positions)

    def _autograd_kernel(self, keyset: Any, *args: Any, **kwargs: Any) -> Any:
        """The op's Autograd kernel: torch's generated one, told beforehand (``_local.want``) whether the forward is
        to keep its graph; whatever no setup_context took is dropped on the way out."""
        previous = getattr(_local, "want", None), getattr(_local, "kept", None)
        _local.want = ((self, torch._C._dispatch_tls_local_include_set(),
                        torch._C._dispatch_tls_local_exclude_set()) if self._keeps(self._filled(args)) else None)
        _local.kept = None
        try:
            return self._generated_autograd(keyset, *args, **kwargs)
        finally:
            _local.want, _local.kept = previous

    def _forward(self, *args: Any) -> Any:
        RUNS[self.key] += 1
        args = self._filled(args)
        want, _local.want = getattr(_local, "want", None), None
        with self._interpreter_guard(self.name, args):
            if want is not None and want[0] is self:
                return self._returned(self._forward_keeping(args, want[1], want[2]))
            with torch.no_grad():
                outputs = _fresh(self._updated(args, _as_tuple(self.operator().run(*args))), args)
        return self._returned(outputs)

    def _updated(self, args: Sequence[Any], outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The operator's outputs less the caches it updates in place: each is its argument's memory (verified so;
        a copy it returned instead is written back into the argument)."""
        positions = set(self.in_place.values())
        for arg, pos in self.in_place.items():
            if outputs[pos] is not args[arg]:
                args[arg].copy_(outputs[pos])
        return [o for pos, o in enumerate(outputs) if pos not in positions]

    def _forward_keeping(self, args: Sequence[Any], include: Any, exclude: Any) -> list[torch.Tensor]:
        """Run the operator with grad on detached leaf copies of the grad inputs that require grad, with the
        dispatch keys of the caller (torch runs a custom op's forward with autograd excluded), and hand the graph to
        setup_context; return fresh outputs sharing the graph's memory."""
        with torch._C._ForceDispatchKeyGuard(include, exclude), torch.enable_grad():
            inputs = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
            leaves = {}
            for pos in self.grad_positions:
                if args[pos] is not None and args[pos].requires_grad:
                    leaves[pos] = inputs[pos] = args[pos].detach().requires_grad_(True)
            graph = _as_tuple(self.operator().run(*inputs))
            outputs = _fresh([o.detach() for o in graph], args)
        _local.kept = _Kept(self, outputs, graph, leaves)
        return outputs

    def _fake(self, *args: Any) -> Any:
        reference = self.spec.abstract_outputs or self.spec.reference
        with torch.no_grad():
            outputs = [o.new_empty(o.shape) for pos, o in enumerate(_as_tuple(reference(*self._filled(args))))
                       if pos not in self.in_place.values()]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @staticmethod
    def _gradients(outputs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None],
                   leaves: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Gradient of ``outputs`` (upstream ``grads``) for each leaf by position; zeros where none reaches it."""
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if g is not None and o.requires_grad]
        found = dict.fromkeys(leaves)
        if pairs and leaves:
            found = dict(zip(leaves, torch.autograd.grad([o for o, _ in pairs], list(leaves.values()),
                                                         [g for _, g in pairs], allow_unused=True), strict=True))
        return {pos: grad if grad is not None else torch.zeros_like(leaves[pos]) for pos, grad in found.items()}

    def _backward(self, grads: list[torch.Tensor | None], needs: list[bool], *args: Any) -> list[torch.Tensor]:
        args = self._filled(args)
        inputs, leaves = list(args), {}
        for pos, need in zip(self.grad_positions, needs, strict=True):
            if need and args[pos] is not None:
                leaves[pos] = inputs[pos] = args[pos].detach().requires_grad_(True)
        with self._interpreter_guard(f"{self.name}_backward", args):
            with torch.enable_grad():
                outputs = _as_tuple(self.operator().run(*inputs))
            found = self._gradients(outputs, grads, leaves)
        like = next(t for t in args if isinstance(t, torch.Tensor))
        return _fresh([found[pos] if pos in found else like.new_empty(0) for pos in self.grad_positions], args)

    def _backward_fake(self, grads: list[torch.Tensor | None], needs: list[bool], *args: Any) -> list[torch.Tensor]:
        args = self._filled(args)
        like = next(t for t in args if isinstance(t, torch.Tensor))
        return [args[pos].new_empty(args[pos].shape) if need and args[pos] is not None else like.new_empty(0)
                for pos, need in zip(self.grad_positions, needs, strict=True)]

    def _setup_context(self, ctx: Any, inputs: tuple, output: Any) -> None:
        kept, _local.kept = getattr(_local, "kept", None), None
        ctx.save_for_backward(*(a if isinstance(a, torch.Tensor) else None for a in inputs))
        ctx.plain = [None if isinstance(a, torch.Tensor) else a for a in inputs]
        ctx.kept = None
        outputs = _as_tuple(output)
        if kept is not None and kept.op is self and len(kept.outputs) == len(outputs) \
                and all(a is b for a, b in zip(kept.outputs, outputs, strict=True)):
            # not the returned outputs themselves (their grad_fn is this node: a reference cycle)
            ctx.kept = (kept.graph, kept.leaves, [o._version for o in kept.graph])

    def _autograd_backward(self, ctx: Any, *grads: torch.Tensor | None) -> tuple:
        # one gradient per argument the call passed (the dispatcher strips trailing defaults: those need none)
        given = len(ctx.needs_input_grad)
        needs = [pos < given and bool(ctx.needs_input_grad[pos]) for pos in self.grad_positions]
        result: list[torch.Tensor | None] = [None] * given
        kept, ctx.kept = ctx.kept, None  # used once: a second backward through this node recomputes
        if not any(needs):
            return tuple(result)
        if kept is not None and self._kept_usable(kept, needs):
            graph, leaves, _ = kept
            with self._interpreter_guard(f"{self.name} (its backward)", list(leaves.values())):
                found = self._gradients(graph, grads, leaves)
        else:
            args = [t if t is not None else plain for t, plain in zip(ctx.saved_tensors, ctx.plain, strict=True)]
            found = dict(zip(self.grad_positions, self.backward_op(list(grads), needs, *args), strict=True))
        for pos, need in zip(self.grad_positions, needs, strict=True):
            if need and pos in found:
                result[pos] = found[pos]
        return tuple(result)

    def _kept_usable(self, kept: tuple, needs: list[bool]) -> bool:
        """The kept graph answers this backward: the same inputs need grad, no output was modified in place since
        (its values may be saved in the graph), and no graph of the gradients is wanted (create_graph: the backward
        op, whose missing derivative then says so, instead of gradients that silently carry none)."""
        graph, leaves, versions = kept
        wanted = {pos for pos, need in zip(self.grad_positions, needs, strict=True) if need}
        return (set(leaves) == wanted and not torch.is_grad_enabled()
                and all(o._version == v for o, v in zip(graph, versions, strict=True)))


OPS: dict[str, BlockOp] = {block: BlockOp(block) for block in REGISTRY}
"""Every block's op by block name: one per block of the catalog (adding a block adds its op)."""
