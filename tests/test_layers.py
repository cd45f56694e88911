"""The package's layers, read from the source (every import, at the top or inside a function): the numerics import
nothing of the workbench, and the block catalog never imports the verifier that judges against it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n == "workbench" or n.startswith("workbench.")}


def test_the_numerics_module_imports_nothing_of_the_workbench():
    assert imports_of(PACKAGE / "numerics.py") == set()


def test_the_block_catalog_never_imports_the_verifier():
    upward = {f"{path.relative_to(PACKAGE)}: {name}" for path in (PACKAGE / "blocks").glob("*.py")
              for name in imports_of(path) if name.startswith("workbench.verify")}
    assert not upward
    # and the verifier takes its numerics from the shared module, like the blocks
    assert "workbench.numerics" in imports_of(PACKAGE / "verify" / "harness.py")
    assert "workbench.numerics" in imports_of(PACKAGE / "blocks" / "_moe.py")
