"""The layout shows the data flow: the subpackages of solver/ are layers, each importing only
the layers below it (at module level or inside a function), with no cycle between modules."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "solver"
# The data flow, lowest first: a module may import its own layer and those before it.
LAYERS = ("vllm", "inputs", "memory", "startup", "opt", "planning", "emit", "api", "cli")
# Top-level modules: errors and defaults sit below every layer; the public API and the
# `python -m` entry sit above them all.
BOTTOM = {"errors", "defaults", "__init__"}
TOP = {"__main__"}
MAX_TOP_LEVEL_MODULES = 6
MAX_LINES = 400


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()  # a package is named by its folder; the package face is ""
    return ".".join(parts)


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> list[str]:
    """The package modules an import names, as dotted names below solver/."""
    if node.level == 0:
        if not (node.module or "").startswith("omni_autoconf"):
            return []
        base = node.module.split(".")[1:]
    else:
        here = module.split(".") if module else []
        if not is_package:
            here = here[:-1]
        base = here[: len(here) - (node.level - 1)] + (node.module.split(".") if node.module else [])
    if node.module is None or node.level and not node.module:
        return [".".join(base + [alias.name]) for alias in node.names]
    return [".".join(base + [alias.name]) for alias in node.names] + [".".join(base)]


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                found.update(t for t in _resolve(name, node, path.name == "__init__.py") if t in files)
            elif isinstance(node, ast.Import):
                found.update(a.name.split(".", 1)[1] for a in node.names
                             if a.name.startswith("omni_autoconf.") and a.name.split(".", 1)[1] in files)
        found.discard(name)
        graph[name] = found
    return graph


def layer(module: str) -> int:
    """A module's rank: -1 for the bottom modules, len(LAYERS) for the top ones."""
    head = module.split(".")[0] if module else "__init__"
    if head in BOTTOM:
        return -1
    if head in TOP:
        return len(LAYERS)
    if head not in LAYERS:
        raise AssertionError(f"solver/{head}: not a known layer; add it to LAYERS, BOTTOM or TOP")
    return LAYERS.index(head)


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if module == "" and target.split(".")[0] in TOP | set(LAYERS):
                continue  # the package face re-exports the API lazily (module __getattr__)
            if layer(target) > layer(module):
                out.append(f"{module or '__init__'} imports {target}, a higher layer")
    return out


def cycles(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for start in sorted(graph):  # depth-first search for a path back to `start`
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    found.append(" -> ".join(path + [start]))
                elif nxt not in path and len(path) < 12:
                    stack.append((nxt, path + [nxt]))
    return found


def test_no_lower_layer_imports_a_higher_one():
    assert not layering_violations(import_graph())


def test_no_import_cycle():
    # the package face's lazy re-exports are not import-time edges
    graph = {m: t - ({"api"} if m == "" else set()) for m, t in import_graph().items()}
    assert not cycles(graph), cycles(graph)[:5]


def test_the_layering_check_catches_an_upward_import(tmp_path):
    """The check itself can fail: a memory module that imports the planner is reported."""
    for rel, text in {"errors.py": "", "memory/__init__.py": "", "planning/__init__.py": "",
                      "planning/planner.py": "from ..memory import model\n",
                      "memory/model.py": "from ..planning.planner import plan\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph = import_graph(tmp_path)
    assert layering_violations(graph) == ["memory.model imports planning.planner, a higher layer"]
    assert cycles(graph)


def test_top_level_holds_few_modules_and_none_is_long():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long
