"""Which implementation each block of the replay model runs: its reference, a promoted operator, or any candidate file.

An ops spec is a list of words: ``reference`` (every block its reference), ``promoted`` (every block with a promoted
operator runs it, the others their reference) and ``<block>=<file>`` or ``<block>=reference`` for one block. Later
words override earlier ones; the default is ``promoted``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from workbench.blocks import REGISTRY, get_block
from workbench.errors import WorkbenchError
from workbench.operators import is_forward_only, list_promoted

REFERENCE = "reference"

# The blocks the replay model calls, by the role it calls them in.
MODEL_BLOCKS = ("attnres", "rmsnorm", "kda", "dsa_indexer", "dsa_sparse_attention", "moe_router", "moe_permute",
                "moe_grouped_gemm", "moe_combine", "swiglu", "lora_linear", "vocab_blockwise_ce")
# Either loss block is the model's loss head (vocab_blockwise_ce unless the other is named).
LOSS_BLOCKS = ("vocab_blockwise_ce", "seq_chunked_ce")


def replay_mode_for(block: str) -> str | None:
    """The replay mode that exercises ``block`` (lora_linear runs only in LoRA replays); None if none does."""
    if block == "lora_linear":
        return "lora"
    return "scratch" if block in MODEL_BLOCKS or block in LOSS_BLOCKS else None


REFERENCE_OPS = {b: REFERENCE for b in MODEL_BLOCKS}  # every block of the model on its reference


def resolve_ops(words: list[str] | None, operators_dir: Path) -> dict[str, str]:
    """{block: "reference" | path of the operator file} for every block of the model."""
    chosen = dict(REFERENCE_OPS)
    for word in words or ["promoted"]:
        if word == REFERENCE:
            chosen = dict(REFERENCE_OPS)
        elif word == "promoted":
            for block in chosen:
                # training needs the backward: an operator promoted by a forward-only port is never chosen
                found = [m for m in list_promoted(operators_dir, block) if not is_forward_only(m)]
                chosen[block] = found[0]["path"] if found else REFERENCE
        elif "=" in word:
            block, _, target = word.partition("=")
            if block not in REGISTRY:
                raise WorkbenchError(f"unknown block '{block}' in --ops {word}")
            if block not in MODEL_BLOCKS and block not in LOSS_BLOCKS:
                raise WorkbenchError(f"block '{block}' is not part of the replay model ({', '.join(MODEL_BLOCKS)})")
            if target != REFERENCE and not Path(target).is_file():
                raise WorkbenchError(f"--ops {word}: no such file {target}")
            if block in LOSS_BLOCKS:  # the model has one loss head: naming a loss block selects it
                chosen = {b: t for b, t in chosen.items() if b not in LOSS_BLOCKS}
            chosen[block] = target if target == REFERENCE else str(Path(target).resolve())
        else:
            raise WorkbenchError(f"bad --ops word '{word}' (reference, promoted or <block>=<file|reference>)")
    return chosen


def load_ops(chosen: dict[str, str]) -> dict[str, Callable]:
    """{block: callable with the reference's signature}. Candidate files are imported as modules (in the process
    that trains: a child process whose environment selects the Triton backend)."""
    ops = {}
    for block, target in chosen.items():
        spec = get_block(block)
        if target == REFERENCE:
            ops[block] = spec.training_reference or spec.reference
            continue
        name = f"workbench_replay_op_{block}"
        module_spec = importlib.util.spec_from_file_location(name, target)
        if module_spec is None or module_spec.loader is None:
            raise WorkbenchError(f"cannot import {target}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
        if getattr(module, "BLOCK", None) != block or not callable(getattr(module, "run", None)):
            raise WorkbenchError(f"{target} does not define BLOCK = '{block}' and run(...)")
        ops[block] = module.run
    return ops


def describe(chosen: dict[str, str]) -> dict[str, str]:
    """The ops as the record shows them: "reference" or the operator's file name."""
    return {block: target if target == REFERENCE else Path(target).name for block, target in chosen.items()}
