#!/usr/bin/env python3
"""The workbench package's import graph by room (a subpackage, or a top-level module), read from the source: every
import, at the top of a file or inside a function. Prints the layers (a room's layer is one above the highest room
it imports; layer 1 imports nothing of the workbench), each room's imports, and the cycles (rooms that import each
other, directly or around a loop: the imports that run upward).

    python scripts/import_layers.py [PACKAGE_DIR]     (default: the workbench package beside this script)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def room_of(module: str) -> str:
    """"workbench.store.queries" -> "store"; "workbench.cli" -> "cli"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imported_modules(node: ast.AST) -> list[str]:
    """The modules an import statement names: ``import a.b`` -> a.b; ``from a.b import c`` -> a.b;
    ``from workbench import store`` -> workbench.store (a room imported by name); relative imports are left out."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
        return []
    if node.module == "workbench":
        return [f"workbench.{a.name}" for a in node.names if not a.name.startswith("__")]
    return [node.module]


def imports(package: Path) -> dict[str, set[str]]:
    """{room: rooms it imports}, from every .py file under ``package``."""
    graph: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        room = room_of(".".join(rel.parts))
        graph.setdefault(room, set())
        for node in ast.walk(ast.parse(path.read_text())):
            names = imported_modules(node)
            for name in names:
                if name.startswith("workbench."):
                    graph[room].add(room_of(name))
        graph[room].discard(room)
    graph.pop("__init__", None)
    return {room: deps - {"__init__"} for room, deps in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one room (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layers(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each room's layer; the rooms of one cycle share a layer."""
    group = {room: room for room in graph}
    for component in cycles(graph):
        for room in component:
            group[room] = component[0]
    level: dict[str, int] = {}

    def depth(room: str, seen: frozenset = frozenset()) -> int:
        g = group[room]
        if g not in level:
            members = [r for r in graph if group[r] == g]
            deps = {group[d] for m in members for d in graph[m] if d in group} - {g}
            level[g] = 1 + max((depth(d, seen | {g}) for d in deps), default=0)
        return level[g]

    return {room: depth(room) for room in graph}


def main() -> None:
    package = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "workbench"
    graph = imports(package)
    level = layers(graph)
    for n in sorted(set(level.values()), reverse=True):
        for room in sorted(r for r in graph if level[r] == n):
            print(f"layer {n:2d}  {room:12s} imports {', '.join(sorted(graph[room])) or '-'}")
    loops = cycles(graph)
    print("cycles: " + ("; ".join(" <-> ".join(c) for c in loops) if loops else "none"))


if __name__ == "__main__":
    main()
