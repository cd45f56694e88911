"""Which implementation each block of the replay model runs: its reference, a promoted operator, or any candidate file.

An ops spec is a list of words: ``reference`` (every block its reference), ``promoted`` (every block with a promoted
operator runs it, the others their reference), ``library`` (as ``promoted``, but each operator called through the
kernels library's custom op, ``torch.ops.workbench.<block>``: workbench.kernels) and ``<block>=<file>`` or
``<block>=reference`` for one block. Later words override earlier ones; the default is ``promoted``.
A block's target is "reference", an operator file, or LIBRARY_PREFIX and an operator file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from workbench.blocks import REGISTRY, get_block
from workbench.errors import WorkbenchError
from workbench.operators import import_operator, is_forward_only, list_promoted
from workbench.replay.arch import LOSS_BLOCKS

REFERENCE = "reference"
LIBRARY_PREFIX = "library:"

def reference_ops(blocks: tuple[str, ...]) -> dict[str, str]:
    """Every block of the model on its reference."""
    return {b: REFERENCE for b in blocks}


def operator_file(target: str) -> str | None:
    """The operator file a target runs (None for the reference)."""
    return None if target == REFERENCE else target.removeprefix(LIBRARY_PREFIX)


def absolute_target(target: str) -> str:
    """The target with its operator file as an absolute path."""
    file = operator_file(target)
    return target if file is None else target.removesuffix(file) + os.path.abspath(file)


def resolve_ops(words: list[str] | None, operators_dir: Path, blocks: tuple[str, ...]) -> dict[str, str]:
    """{block: "reference" | path of the operator file} for every one of ``blocks`` (the model's)."""
    chosen = reference_ops(blocks)
    for word in words or ["promoted"]:
        if word == REFERENCE:
            chosen = reference_ops(blocks)
        elif word in ("promoted", "library"):
            prefix = LIBRARY_PREFIX if word == "library" else ""
            for block in chosen:
                # training needs the backward: an operator promoted by a forward-only port is never chosen
                found = [m for m in list_promoted(operators_dir, block) if not is_forward_only(m)]
                chosen[block] = prefix + found[0]["path"] if found else REFERENCE
        elif "=" in word:
            block, _, target = word.partition("=")
            if block not in REGISTRY:
                raise WorkbenchError(f"unknown block '{block}' in --ops {word}")
            if block not in blocks and block not in LOSS_BLOCKS:
                raise WorkbenchError(f"block '{block}' is not part of the replay model ({', '.join(blocks)})")
            if target != REFERENCE and not Path(target).is_file():
                raise WorkbenchError(f"--ops {word}: no such file {target}")
            if block in LOSS_BLOCKS:  # the model has one loss head: naming a loss block selects it
                chosen = {b: t for b, t in chosen.items() if b not in LOSS_BLOCKS}
            chosen[block] = target if target == REFERENCE else str(Path(target).resolve())
        else:
            raise WorkbenchError(f"bad --ops word '{word}' (reference, promoted, library or "
                                 f"<block>=<file|reference>)")
    return chosen


def load_ops(chosen: dict[str, str]) -> dict[str, Callable]:
    """{block: callable with the reference's signature}. Candidate files are imported as modules (in the process
    that trains: a child process whose environment selects the Triton backend); a library target is the kernels
    library's op, backed by the operators folder that holds its file (the file must be what the op resolves to)."""
    ops = {}
    for block, target in chosen.items():
        spec = get_block(block)
        if target == REFERENCE:
            ops[block] = spec.training_reference or spec.reference
            continue
        if target.startswith(LIBRARY_PREFIX):
            ops[block] = _library_op(block, Path(operator_file(target)))
            continue
        ops[block] = import_operator(target, f"workbench_replay_op_{block}", block).run
    return ops


def _library_op(block: str, path: Path) -> Callable:
    """The kernels library's op of ``block``, backed by the operators folder holding ``path``
    (<folder>/<block>/<file>.py)."""
    import workbench.kernels as kernels

    op = kernels.OPS[block]
    path = path.resolve()
    kernels.set_operators_dir(path.parent.parent)
    if op.operator_path() != str(path):
        raise WorkbenchError(f"the kernels library's {block} op runs {op.operator_path()}, not {path}")
    return op


def describe(chosen: dict[str, str]) -> dict[str, str]:
    """The ops as the record shows them: "reference", the operator's file name, or "library:" and it."""
    return {block: target if target == REFERENCE else
            (LIBRARY_PREFIX if target.startswith(LIBRARY_PREFIX) else "") + Path(operator_file(target)).name
            for block, target in chosen.items()}
