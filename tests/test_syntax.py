"""Every parse of Python source in the workbench goes through one lock (CPython 3.11's AST constructor is not safe
for two threads at once)."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest

from workbench import syntax

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"


def test_a_parse_waits_while_another_thread_holds_the_lock():
    parsed: list[ast.Module] = []
    with syntax._PARSING:
        worker = threading.Thread(target=lambda: parsed.append(syntax.parse("x = 1\n")))
        worker.start()
        worker.join(timeout=0.5)
        assert worker.is_alive() and not parsed  # blocked behind the held lock
    worker.join(timeout=10)
    assert not worker.is_alive() and isinstance(parsed[0].body[0], ast.Assign)


def test_a_syntax_error_names_the_file_and_leaves_the_lock_free():
    with pytest.raises(SyntaxError) as raised:
        syntax.parse("def f(:\n", "candidate.py")
    assert raised.value.filename == "candidate.py" and raised.value.lineno == 1
    assert not syntax._PARSING.locked()


def test_no_module_of_the_workbench_parses_around_the_lock():
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "syntax.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parse" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "ast":
                calls.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
            if isinstance(node, ast.Attribute) and node.attr == "PyCF_ONLY_AST":
                calls.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not calls
