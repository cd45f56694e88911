"""Where a candidate runs: Triton on a CUDA GPU, or the Triton interpreter on CPU.

A backend names the device tensors live on, the environment the sandbox sets before ``triton`` is imported, and the
dtypes and shape suites it can verify. New targets (triton-ascend, MUSA) are new entries here; blocks, templates and
the agent never look at the hardware.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from workbench.errors import WorkbenchError


@dataclass(frozen=True)
class Backend:
    name: str
    device: str
    dtypes: tuple[str, ...]
    suites: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


INTERPRETER = Backend(
    name="interpreter",
    device="cpu",
    # bfloat16 arithmetic is wrong in the interpreter (bit patterns treated as integers): GPU only.
    dtypes=("float32", "float16"),
    # the model card's sizes take hours on the interpreter: GPU only.
    suites=("smoke", "edge"),
    env={"TRITON_INTERPRET": "1"},
)

CUDA = Backend(
    name="cuda",
    device="cuda",
    dtypes=("float32", "float16", "bfloat16"),
    suites=("smoke", "edge", "model"),
)

BACKENDS = {b.name: b for b in (INTERPRETER, CUDA)}


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def get_backend(name: str | None = None) -> Backend:
    """``name`` or $WORKBENCH_BACKEND; "auto" (the default) is cuda when a GPU is visible, else the interpreter."""
    name = name or os.environ.get("WORKBENCH_BACKEND", "auto")
    if name == "auto":
        return CUDA if cuda_available() else INTERPRETER
    if name not in BACKENDS:
        raise WorkbenchError(f"unknown backend '{name}' (known: auto, {', '.join(BACKENDS)})")
    if name == "cuda" and not cuda_available():
        raise WorkbenchError("backend 'cuda' asked for, but torch sees no CUDA device")
    return BACKENDS[name]
