"""Python source parsed to an AST by one thread at a time.

CPython 3.11 keeps the AST constructor's recursion depth per interpreter, not per thread: two threads parsing at once
can fail with ``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905). The driver verifies
and renders candidates on several threads, so every parse in the workbench goes through this lock.
"""

from __future__ import annotations

import ast
import threading

_PARSING = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse(source, filename), serialised across threads; raises SyntaxError as ast.parse does."""
    with _PARSING:
        return ast.parse(source, filename)
