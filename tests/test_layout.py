"""The floor plan holds: no import circle, and no room imports what its docstring forbids.

Every package's docstring may say ``Must not import :mod:`a`, :mod:`b` ...``; this test reads
that sentence and walks the runtime imports of every module of the package (imports under
``if TYPE_CHECKING:`` are types only and skipped; imports inside functions count). It also
finds import circles among the product's modules (strongly connected components of the
runtime import graph), like the purity test does for the pure core.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOTS = {"schema": ROOT / "schema", "infra": ROOT / "infra", "worker": ROOT / "worker",
         "publisher": ROOT / "publisher", "tools": ROOT / "tools", "fanout_client": ROOT / "client" / "fanout_client"}
OURS = tuple(ROOTS)
_MOD = re.compile(r":mod:`([\w.]+)`")
_SENTENCE = re.compile(r"Must not import:?\s*((?:[^.`]|`[^`]*`)*)\.")
"""The sentence that names what a room must not import, up to its first period outside backticks."""


def _modules() -> dict[str, Path]:
    out = {}
    for top, base in ROOTS.items():
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            name = ".".join((top, *parts)).removesuffix(".__init__")
            out[name] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Runtime imports of our modules (the deepest known module each import statement names)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else ".".join([*name.split(".")[:-node.level], node.module])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {mod for mod in found if mod in known and mod != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def _forbidden(package: str) -> set[str]:
    doc = importlib.import_module(package).__doc__ or ""
    sentence = _SENTENCE.search(doc)
    return set(_MOD.findall(sentence.group(1))) if sentence else set()


PACKAGES = sorted(name for name, path in _modules().items() if path.name == "__init__.py")


def test_no_import_circle_anywhere() -> None:
    assert _cycles(_graph()) == []


def test_a_circle_is_found() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_what_its_room_forbids(package: str) -> None:
    forbidden = _forbidden(package)
    graph = _graph()
    inside = [module for module in graph if module == package or module.startswith(package + ".")]
    bad = [(module, target) for module in inside for target in graph[module]
           if any(target == f or target.startswith(f + ".") for f in forbidden)]
    assert bad == []


def test_the_product_rooms_name_what_they_must_not_import() -> None:
    rules = {package: _forbidden(package) for package in PACKAGES}
    assert {"worker", "publisher", "tools"} <= rules["infra"]
    assert {"worker", "tools"} <= rules["publisher"]
    assert {"publisher", "tools"} <= rules["worker"]
    assert {"infra", "worker", "publisher", "tools"} <= rules["schema"]
    assert "publisher.api" in rules["publisher.live"]
    assert {"publisher.api", "publisher.live"} <= rules["publisher.history"]
