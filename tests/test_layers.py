"""The package's layers, read from the source (every import, at the top or inside a function): the numerics import
nothing of the workbench, the block catalog never imports the verifier that judges against it, and the store is a
leaf that only the layers above it import."""

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


# What the store may import of the workbench besides itself: the shared words, the user-facing errors, the settings.
STORE_MAY_IMPORT = {"workbench.errors", "workbench.vocabulary", "workbench.config"}


def test_the_store_imports_nothing_of_the_workbench_above_it():
    files = sorted((PACKAGE / "store").rglob("*.py"))
    assert PACKAGE / "store" / "migrations" / "env.py" in files  # the migrations are read too
    upward = {f"{path.relative_to(PACKAGE)}: {name}" for path in files for name in imports_of(path)
              if name not in STORE_MAY_IMPORT and name != "workbench.store" and not name.startswith("workbench.store.")}
    assert not upward
    # and the dashboard's DataFrames and the block statuses are built above it, from its typed reads
    assert "workbench.store.queries" in imports_of(PACKAGE / "status.py")
    assert "workbench.status" in imports_of(PACKAGE / "dashboard" / "frames.py")
