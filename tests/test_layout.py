"""The layout shows the data flow: no module of the package imports another that imports
it back, at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "solver"


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(alias.name for alias in node.names)
        graph[path.stem] = found & {p.stem for p in PACKAGE.glob("*.py")}
    return graph


def test_no_two_modules_import_each_other():
    graph = _imports()
    cycles = []
    for start in sorted(graph):  # depth-first search for a path back to `start`
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    cycles.append(" -> ".join(path + [start]))
                elif nxt not in path and len(path) < len(graph):
                    stack.append((nxt, path + [nxt]))
    assert not cycles, cycles[:5]
