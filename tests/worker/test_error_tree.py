"""The exception tree in schema.errors' docstring lists every exception class the project defines."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
from pathlib import Path

import pytest

import schema.errors
import worker.appender
import worker.upstream

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "schema", ROOT / "worker", ROOT / "publisher", ROOT / "client" / "fanout_client")
_TREE_LINE = re.compile(r"^    (?P<lead>(?:[│ ]   )*(?:[├└]── )?)(?P<name>[A-Za-z_]\w*)(?P<rest>.*)$")


def _tree() -> dict[str, tuple[str | None, str]]:
    """Each class of the docstring's trees → (parent or None for a root, its description)."""
    doc = schema.errors.__doc__ or ""
    out: dict[str, tuple[str | None, str]] = {}
    for block in re.findall(r"::\n\n((?:    .*\n)+)", doc):
        stack: list[str] = []
        for line in block.splitlines():
            match = _TREE_LINE.match(line)
            assert match, f"not a tree line: {line!r}"
            depth = len(match["lead"]) // 4
            del stack[depth:]
            assert match["name"] not in out, f"{match['name']} twice in the tree"
            out[match["name"]] = (stack[-1] if stack else None, match["rest"].strip())
            stack.append(match["name"])
    return out


def _defined() -> dict[str, type[BaseException]]:
    """Every exception class defined (at module level) in schema/, worker/, publisher/ and client/fanout_client/."""
    out: dict[str, type[BaseException]] = {}
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            name = ".".join(path.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__")
            module = importlib.import_module(name)
            for attr, value in vars(module).items():
                if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name:
                    assert attr not in out, f"two exception classes named {attr}"
                    out[attr] = value
    return out


def _nested_exception_like() -> list[str]:
    """Classes defined inside a function or class whose bases look like exceptions (missed by _defined)."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            top = {id(node) for node in tree.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and id(node) not in top:
                    bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                    if any(b.endswith(("Error", "Exception")) or b == "Stopped" for b in bases):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    return found


def test_tree_lists_every_exception_class() -> None:
    tree = _tree()
    defined = _defined()
    roots = {name for name, (parent, _) in tree.items() if parent is None}
    assert roots == {"FanoutError", "Exception"}
    assert set(defined) == set(tree) - {"Exception"}
    assert _nested_exception_like() == []


@pytest.mark.parametrize("name", sorted(_defined()))
def test_tree_parent_is_the_real_base(name: str) -> None:
    cls = _defined()[name]
    parent, description = _tree()[name]
    assert [base.__name__ for base in cls.__bases__] == [parent or "Exception"]
    if description.startswith("*"):
        assert cls.__module__ == "schema.errors"
    else:
        assert description.startswith(f"{cls.__module__}:"), f"{name}: name its module {cls.__module__}"


def test_no_exception_class_shadows_a_builtin() -> None:
    assert not set(_defined()) & set(dir(builtins))


def test_worker_errors_derive_from_the_right_roots() -> None:
    assert issubclass(schema.errors.UpstreamTransportError, schema.errors.UpstreamError)
    assert issubclass(schema.errors.UpstreamTimeoutError, schema.errors.UpstreamError)
    for refusal in (schema.errors.FencedError, schema.errors.SeqConflictError, schema.errors.StreamClosedError):
        assert issubclass(refusal, schema.errors.AppendRefusedError)
        assert issubclass(refusal, schema.errors.InternalError)
    assert schema.errors.UpstreamTimeoutError("t", kind="idle").category == "timeout"
    assert schema.errors.UpstreamTransportError("x").category == "transport"


def test_worker_modules_re_export_the_same_classes() -> None:
    assert worker.upstream.UpstreamTransportError is schema.errors.UpstreamTransportError
    assert worker.upstream.UpstreamTimeoutError is schema.errors.UpstreamTimeoutError
    assert worker.appender.AppendRefusedError is schema.errors.AppendRefusedError
    assert worker.appender.FencedError is schema.errors.FencedError
    assert worker.appender.SeqConflictError is schema.errors.SeqConflictError
    assert worker.appender.StreamClosedError is schema.errors.StreamClosedError
