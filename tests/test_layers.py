"""The layers run one way: ``samplers`` <- ``runner`` <- ``experiments`` <- ``scripts`` (what make
targets run: benchmarks, the docs' tables, the browser check), and no module imports
itself back through others (every import counted, also those inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit  # in one process, seconds

PACKAGES = ("samplers", "runner", "experiments", "scripts")
LAYER = {"samplers": 0, "runner": 1, "experiments": 2, "scripts": 3}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from a.b import c`` counts ``a.b`` and, when
    ``a.b.c`` is a module, that too)."""
    modules = {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_no_layer_imports_a_layer_above_it():
    upward = [
        f"{module} imports {target}"
        for module, targets in _imports().items()
        for target in targets
        if LAYER[target.split(".")[0]] > LAYER[module.split(".")[0]]
    ]
    assert not upward, upward


def test_no_circle_of_imports():
    graph = _imports()
    # A package's __init__ re-exports its modules: an edge to the package is an edge into it.
    circles = []
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, circles
