"""The block contract: a PyTorch reference, input factories, shape suites and tolerances for one block.

A candidate for a block is any Python file defining ``BLOCK = "<name>"`` and ``run`` with exactly the
reference's signature; verification calls both on the same inputs and compares outputs and gradients.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from workbench.numerics import Tolerance, default_tolerance
from workbench.vocabulary import key_values

if TYPE_CHECKING:
    from workbench.blocks._config import Found, ModelConfig

Shape = Mapping[str, int]
"""Named dimensions of one test case, e.g. ``{"rows": 3, "N": 4097}``."""

FAMILIES = ("linear_attention", "attention", "moe", "activation", "norm", "residual", "loss", "linear")
"""The block families, in the order a model card lists its parts: the attention, the experts, the FFN activations,
the norms, the residuals, the loss heads, the adapters."""

CARD_DIMS = ("calls",)
"""Dimensions a model card's shape may carry besides the block's own: ``calls``, how many times a step runs the block
at that shape where it is not once per layer (Block AttnRes mixes 1 to 9 sources, a shape per count). make_inputs
ignores them."""

SUITES = ("smoke", "edge", "model")
"""smoke: tiny, for the interpreter; edge: odd sizes and degenerate cases; model: the model card's sizes (GPU)."""


BF16, F32, I32, I64 = 2, 4, 4, 8
"""Bytes per element, for the cost model's work: bf16 tensors, float32 gates, states and scores, int64 indices."""


@dataclass(frozen=True)
class Work:
    """What one pass of a block must do at one shape (workbench.perf.cost): bytes, the compulsory HBM traffic (each
    input read once, each output written once); tensor_flops, matrix products at 2 per multiply-add; vector_flops,
    elementwise work large enough to matter against a target's vector peak."""

    bytes: float
    tensor_flops: float = 0.0
    vector_flops: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(self.bytes + other.bytes, self.tensor_flops + other.tensor_flops,
                    self.vector_flops + other.vector_flops)


@dataclass(frozen=True)
class Peer:
    """A published implementation of a block that the benchmarks time beside its operator (workbench.perf.bench):
    its name, the package that must be installed, and ``run`` with the reference's signature (it imports the
    package when called)."""

    name: str
    package: str
    run: Callable[..., Any]


def shape_label(shape: Shape) -> str:
    """``{"rows": 3, "N": 4097}`` -> ``"rows=3,N=4097"``."""
    return key_values(shape, ",")


@dataclass(frozen=True)
class BlockSpec:
    """One architecture block of the catalog.

    reference(*inputs) -> Tensor | tuple[Tensor, ...]: differentiable PyTorch reference; computes in at least float32
        and in float64 when given float64 inputs, returns outputs in the input dtype.
    make_inputs(shape, dtype, seed, device) -> dict: every argument of ``reference`` by name, tensors in ``dtype``
        with realistic distributions; non-tensor arguments (eps, scale) as Python values.
    grad_inputs: names of the tensor inputs whose gradients are verified.
    outputs: names of the outputs, in the order ``reference`` returns them.
    shapes: the ``smoke`` and ``edge`` suites; the ``model`` suite comes from the model cards.
    host_ops: torch operators (``"aten.sum"``) that a candidate's host code may call besides allocation, views and
        copies (which every block may use): anything else during ``run`` or its backward is a torch fallback.
    comparators: custom comparison per quantity, keyed "forward:<output>" or "grad:<input>", with the signature
        of ``workbench.numerics.compare``, optionally with the keywords ``truth_outputs`` and ``lowp_outputs``
        (every output by name) and ``inputs`` (the trial's, by name), e.g. set overlap for top-k indices judged
        against the true scores; default: that compare.
    hidden_shapes: draws extra shapes at verification time (never shown to the candidate's author) from an rng;
        default: random sizes within the ranges of the smoke and edge suites.
    training_reference: an exact, faster form of ``reference`` with the same signature (tested against it), which
        loss-curve replays train with where the clear form is too slow; default: ``reference``.
    abstract_inputs(shape, dtype) -> dict: the inputs as meta tensors (shapes and dtypes, no data), for capturing a
        candidate's kernel launches at sizes too large to materialise (the model suite); default: ``make_inputs``
        on the meta device, which serves every block whose input factory has no data-dependent step.
    abstract_outputs(*inputs) -> outputs: empty outputs of the right shapes and dtypes from (fake) inputs, for the
        library op's fake implementation (workbench.kernels) where the reference cannot run on fake tensors (a
        data-dependent size or value); default: the reference itself.
    work(shape) -> (forward, backward) Work: what each pass must move and compute at ``shape``, written from the
        math above (workbench.perf.cost models times from it).
    peers: published implementations the benchmarks time beside the operator (Liger-Kernel, fla, CCE).
    not_compiled: why the benchmarks do not time ``torch.compile`` of the reference ("" when they do).
    onboard(model) -> list[Found]: the block's entries in the card of a model whose config calls for it (none when it
        does not), from the shared reading of the config (workbench.blocks._config.ModelConfig); workbench.onboard
        runs every block's rule, family by family in FAMILIES order.
    updated_in_place: inputs the block updates in place (a serving cache), each also an output of the same name:
        ``run`` returns that very tensor, its contents after the call are compared like any output, and it is exempt
        from the input-mutation and aliasing checks (a copy returned instead is the verdict not_in_place); the
        reference returns an updated copy and leaves its input alone.
    supersedes: blocks whose card entries this block's replace where both rules find the config's layers: a
        variant whose config fields also satisfy its base's rule (dsa_kpool_indexer: a k-pool config has
        dsa_indexer's fields too).
    replay: the part of the replay model (workbench.replay.arch) that calls the block: "layer" (every layer),
        "moe" (every MoE layer), "shared_expert" (the shared expert's activation: one of these), "loss" (the loss
        head: one of these), or the letter of the attention layers that call it ("K" linear, "D" gated DSA, "M"
        MLA); "" when no replay model calls it.
    """

    name: str
    family: str
    summary: str
    reference: Callable[..., Any]
    make_inputs: Callable[[Shape, torch.dtype, int, str], dict[str, Any]]
    grad_inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    shapes: Mapping[str, list[Shape]]
    tolerance: Callable[[torch.dtype], Tolerance] = default_tolerance
    host_ops: tuple[str, ...] = ()
    comparators: Mapping[str, Callable[..., dict]] = field(default_factory=dict)
    hidden_shapes: Callable[[random.Random], list[Shape]] | None = None
    training_reference: Callable[..., Any] | None = None
    abstract_inputs: Callable[[Shape, torch.dtype], dict[str, Any]] | None = None
    abstract_outputs: Callable[..., Any] | None = None
    work: Callable[[Shape], tuple[Work, Work]] | None = None
    peers: tuple[Peer, ...] = ()
    not_compiled: str = ""
    onboard: Callable[[ModelConfig], list[Found]] | None = None
    updated_in_place: tuple[str, ...] = ()
    supersedes: tuple[str, ...] = ()
    replay: str = ""

    def meta_inputs(self, shape: Shape, dtype: torch.dtype) -> dict[str, Any]:
        """Every argument of ``reference`` at ``shape``, tensors on the meta device (see ``abstract_inputs``)."""
        if self.abstract_inputs is not None:
            return self.abstract_inputs(shape, dtype)
        with torch.device("meta"):
            return self.make_inputs(shape, dtype, 0, "meta")

    @property
    def arg_names(self) -> tuple[str, ...]:
        """The positional signature that ``run`` must have."""
        return tuple(inspect.signature(self.reference).parameters)

    @property
    def in_place_outputs(self) -> dict[str, int]:
        """{updated input: its position among the outputs}."""
        return {name: self.outputs.index(name) for name in self.updated_in_place}

    def reference_source(self) -> str:
        return inspect.getsource(inspect.getmodule(self.reference))
