"""The ops the integrations' module forwards compute with: the promoted operators (``workbench.kernels``) by default,
the catalog's references inside ``computing_with(REFERENCES)``: the onboarding probe runs the very forward that
``apply_workbench_kernels`` swaps in, in float64 through the references, and holds it to the module it replaces.

    from workbench.integrations.ops import ops
    y = ops.rmsnorm(x, weight, eps)             # workbench.kernels.rmsnorm, or the block's reference in a probe
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

_TABLE: contextvars.ContextVar[Mapping[str, Callable[..., Any]] | None] = contextvars.ContextVar("ops", default=None)


class _Ops:
    """``ops.<block>``: the block's op in the table in use (the kernels library's unless ``computing_with``)."""

    def __getattr__(self, block: str) -> Callable[..., Any]:
        try:
            return current_table()[block]
        except KeyError:
            raise AttributeError(f"no op for block '{block}'") from None


ops = _Ops()


def current_table() -> Mapping[str, Callable[..., Any]]:
    """The ops table in use: ``computing_with``'s, else the kernels library's."""
    table = _TABLE.get()
    if table is None:
        import workbench.kernels as wk

        table = wk.OPS
    return table


def references() -> dict[str, Callable[..., Any]]:
    """Every catalog block's reference by name: the table a probe computes with (float64 capable). A serving block
    updates its cache in place (``updated_in_place``) where its reference returns an updated copy: its entry writes
    the copy back into the cache passed and returns that, as the op does."""
    from workbench.blocks import REGISTRY

    return {name: in_place(spec) if spec.updated_in_place else spec.reference for name, spec in REGISTRY.items()}


def in_place(spec) -> Callable[..., Any]:
    """``spec``'s reference with the op's contract: each updated_in_place input gets the reference's updated copy
    and is the output returned in its place."""
    import inspect

    signature = inspect.signature(spec.reference)

    def run(*args: Any, **kwargs: Any) -> Any:
        given = signature.bind(*args, **kwargs).arguments
        outputs = list(spec.reference(*args, **kwargs))
        for name, index in spec.in_place_outputs.items():
            given[name].copy_(outputs[index])
            outputs[index] = given[name]
        return tuple(outputs)
    return run


@contextmanager
def computing_with(table: Mapping[str, Callable[..., Any]]) -> Iterator[None]:
    """Within the block, ``ops.<block>`` is ``table[block]``."""
    token = _TABLE.set(table)
    try:
        yield
    finally:
        _TABLE.reset(token)
