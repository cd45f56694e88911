"""The candidate contract, read from the source without running it: a Python module with ``BLOCK = "<block>"``
and a function ``run`` at module level whose parameters are the reference's. The one reader of it for the
verifier (which block a file is for), the agent (the check before verification) and the LLM proposer (what a
reply's code defines)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from workbench import syntax

_BLOCK_RE = re.compile(r"""^BLOCK\s*(?::\s*str\s*)?=\s*["']([A-Za-z0-9_]+)["']""", re.M)


@dataclass(frozen=True)
class Definitions:
    """What a module defines at its top level: the BLOCK string (None: no BLOCK, or not a string constant;
    has_block: a BLOCK name of any kind) and run's positional parameters (None: no run)."""

    block: str | None
    has_block: bool
    run_args: tuple[str, ...] | None


def definitions(tree: ast.Module) -> Definitions:
    block, has_block, run_args = None, False, None
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "BLOCK" for t in targets):
                has_block = True
                if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                    block = node.value.value
        elif isinstance(node, ast.FunctionDef) and node.name == "run":
            run_args = tuple(a.arg for a in node.args.args)
    return Definitions(block, has_block, run_args)


def declared_block(source: str) -> str | None:
    """The block a candidate says it is for; a module that does not parse still says it by its BLOCK line."""
    try:
        return definitions(syntax.parse(source)).block
    except SyntaxError:
        match = _BLOCK_RE.search(source)
        return match.group(1) if match else None


def contract_problem(source: str, path: str, block: str, arg_names: tuple[str, ...]) -> str | None:
    """None when ``source`` compiles, says BLOCK = ``block`` and defines run(<arg_names>); else the problem in one
    line (a syntax error with its file, line and text)."""
    try:
        tree = syntax.parse(source, path)
    except SyntaxError as exc:
        line = (exc.text or "").strip()
        return f"{Path(path).name}:{exc.lineno}: SyntaxError: {exc.msg}" + (f": {line[:200]}" if line else "")
    found = definitions(tree)
    if found.block != block:
        return f"BLOCK is {found.block!r}, expected {block!r}" if found.has_block else \
            f"no BLOCK = \"{block}\" at module level"
    if found.run_args is None:
        return "no module-level function run"
    if found.run_args != arg_names:
        return f"run({', '.join(found.run_args)}) does not match the reference's signature ({', '.join(arg_names)})"
    return None
