"""rayguard's modules import one another without a circle, and none is past 400 lines.

Every import counts: at module level, inside functions, and under ``TYPE_CHECKING``. A lazy
import hides a circle from the interpreter but not from the reader, who must still hold both
modules in mind at once. ``from pkg import name`` is an arrow to ``pkg/__init__.py`` unless
``name`` is a submodule; importing a submodule is not an arrow to its package (the package's
``__init__`` runs first, but that is the language's order, not a dependency of the code).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rayguard"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")
        if MODULES[module].name != "__init__.py":
            base = base[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source
            for a in node.names]


def _owner(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> the rayguard modules it imports, anywhere in its text."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in map(_owner, _targets(module, node)):
                    if target is not None and target != module:
                        graph[module].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        members.append(top)
                        if top == node:
                            break
                    if len(members) > 1:
                        found.append(sorted(members))
    return found


def _describe(circle: list[str], graph: dict[str, set[str]]) -> str:
    inside = set(circle)
    return "\n".join(f"  {m} -> {', '.join(sorted(graph[m] & inside))}" for m in circle)


def test_no_import_circle():
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles among rayguard's modules:\n" + "\n\n".join(
        _describe(c, graph) for c in found)


def test_the_walk_sees_lazy_and_type_only_imports(tmp_path):
    """The checker itself: a circle closed only by a function-level import and one closed
    only under TYPE_CHECKING are both found."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": set()}
    assert circles(graph) == [["a", "b"]]
    source = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from rayguard.train import setup\n"
                       "def f():\n    from rayguard.checkpoint.manifest import Manifest\n")
    seen = {_owner(t) for n in ast.walk(source) if isinstance(n, (ast.Import, ast.ImportFrom))
            for t in _targets("rayguard.config", n)}
    assert {"rayguard.train.setup", "rayguard.checkpoint.manifest"} <= seen


def test_no_module_is_past_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules past {MAX_LINES} lines: {long}"
