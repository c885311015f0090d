"""The configuration reference, generated from the settings Structs (a MkDocs hook).

Every ``FANOUT_*`` setting is a field of a frozen msgspec Struct that a process reads with
:func:`schema.settings.load_settings` (``WorkerSettings``, ``PublisherSettings``, the log
settings, ...). This module finds those Structs by reading the source of ``schema/``,
``worker/`` and ``publisher/`` for ``load_settings(<Struct>, ...)`` calls, and renders one
Markdown table per process: each variable's name, type (with its bounds), default, which
process reads it, and the field's attribute docstring (the string literal under the field,
read with :mod:`ast`, since Python keeps no such docstring at run time). A setting added to
any of these Structs appears in the reference without an edit here; a Struct that a new
``load_settings`` call reads must be named in :data:`READERS` (the build fails until it is).

MkDocs runs :func:`on_page_markdown` for every page (``hooks:`` in ``mkdocs.yml``); on
``configuration.md`` it replaces :data:`MARKER` with :func:`render`'s tables, so the site is
generated at build time and nothing generated is committed. ``python
docs/hooks/settings_reference.py`` prints the same Markdown. Imports no mkdocs.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import re
import sys
import textwrap
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec

ROOT: Final = Path(__file__).resolve().parents[2]
"""The repository's root (this file is ``docs/hooks/settings_reference.py``)."""
PACKAGES: Final = ("schema", "worker", "publisher")
"""Directories searched for ``load_settings`` calls."""
PAGE: Final = "configuration.md"
"""The page (path under ``docs/``) that holds :data:`MARKER`."""
MARKER: Final = "<!-- settings-reference -->"
"""The line of :data:`PAGE` that the generated tables replace."""
READERS: Final[dict[str, tuple[str, str]]] = {
    "worker.settings.WorkerSettings": ("Worker", "worker"),
    "publisher.settings.PublisherSettings": ("Publisher", "publisher"),
    "schema.logs.LogSettings": ("Logs", "worker, publisher, export, upstream, demo"),
    "schema.settings.RedisEnvironment": ("Redis topology of the tools", "export, demo"),
}
"""Struct (``module.Name``) → its section title and the ``fanout`` commands that read it, in page order."""
SHARED: Final = "Shared"
"""Title of the section of the variables that more than one Struct reads."""
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_CODE = re.compile(r"`[^`]+`")
_FIELD = re.compile(r"(?<![\w.-])[a-z][a-z0-9]*_[a-z0-9_]+(?![\w.(])")
"""A field-like name (with an underscore) that is no flag, module path or call, inside a code span."""


class SettingsReferenceError(Exception):
    """The settings cannot be rendered: a Struct nobody named in :data:`READERS`, or a page without :data:`MARKER`."""


@dataclass
class Variable:
    """One environment variable, merged over every Struct that has its field."""

    name: str
    readers: list[str] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=dict)
    docs: dict[str, str] = field(default_factory=dict)
    structs: list[str] = field(default_factory=list)


def variable_name(field_name: str) -> str:
    """Return the variable that sets ``field_name``, as :func:`schema.settings.load_settings` maps it.

    ``redis_url`` is ``REDIS_URL``, an ``otel_*`` field its ``OTEL_*`` variable, any other
    ``FANOUT_`` plus the field upper-cased.
    """
    if field_name == "redis_url" or field_name.startswith("otel_"):
        return field_name.upper()
    return "FANOUT_" + field_name.upper()


def settings_structs(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Return ``module.Name`` of every Struct passed to ``load_settings`` in ``packages`` under ``root``, sorted.

    Each module that calls ``load_settings`` is imported (``root`` must be importable) and
    the call's first argument looked up in it; a name that is no Struct (the parameter
    ``cls`` in ``load_settings`` itself) is skipped.
    """
    found = set()
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                        == "load_settings" and node.args and isinstance(node.args[0], ast.Name)):
                    value = getattr(importlib.import_module(module), node.args[0].id, None)
                    if isinstance(value, type) and issubclass(value, msgspec.Struct):
                        found.add(f"{value.__module__}.{value.__qualname__}")
    return sorted(found)


def attribute_docs(cls: type) -> dict[str, str]:
    """Return field → attribute docstring (cleaned, one paragraph) of ``cls`` and its bases, from source."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, msgspec.Struct)) or klass is msgspec.Struct:
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in itertools.pairwise(body):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def markdown_of(text: str, variable: str, fields: frozenset[str] = frozenset()) -> str:
    """Return a docstring as one Markdown table cell: reST literals and roles as code, pipes escaped.

    A field name of ``fields`` inside a code span becomes its variable (``lease_s / 3`` →
    ``FANOUT_LEASE_S / 3``); a leading ``FANOUT_X``: naming the row's own variable is dropped.
    """
    text = _ROLE.sub(r"`\1`", text.replace("``", "`"))
    text = _CODE.sub(lambda span: _FIELD.sub(
        lambda word: variable_name(word[0]) if word[0] in fields else word[0], span[0]), text)
    text = re.sub(rf"^`{re.escape(variable)}`:\s*", "", text)
    return (text[:1].upper() + text[1:]).replace("|", "\\|")


def type_of(hint: Any) -> str:
    """Return a type hint as the value a variable takes: ``integer 1..1024``, ``one of `a`, `b```."""
    if typing.get_origin(hint) is typing.Annotated:
        base, *extras = typing.get_args(hint)
        return type_of(base) + "".join(_bounds(meta) for meta in extras if isinstance(meta, msgspec.Meta))
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(f"`{value}`" for value in typing.get_args(hint))
    if typing.get_origin(hint) in (list, tuple, set, frozenset):
        return "comma-separated list"
    args = typing.get_args(hint)
    if args and type(None) in args:
        return " or ".join(type_of(arg) for arg in args if arg is not type(None)) + ", or unset"
    names = {bool: "boolean", int: "integer", float: "number", str: "text"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _bounds(meta: msgspec.Meta) -> str:
    """Return a Meta's numeric bounds as `` 1..1024``, `` >= 1`` or `` > 0`` (empty without bounds)."""
    if meta.ge is not None and meta.le is not None:
        return f" {_number(meta.ge)}..{_number(meta.le)}"
    bounds = {">=": meta.ge, ">": meta.gt, "<=": meta.le, "<": meta.lt}
    return "".join(f" {op} {_number(value)}" for op, value in bounds.items() if value is not None)


def _number(value: object) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def default_of(info: msgspec.structs.FieldInfo) -> str:
    """Return a field's default as written in a variable: ``1``/``0``, ``10`` for 10.0, ``empty``, ``required``."""
    if info.default is not msgspec.NODEFAULT:
        value = info.default
    elif info.default_factory is not msgspec.NODEFAULT:
        value = info.default_factory()
    else:
        return "required"
    if isinstance(value, bool):
        return f"`{int(value)}`"
    if value in ("", [], (), None):
        return "empty"
    return f"`{_number(value)}`"


def collect(structs: list[str], readers_of: Mapping[str, tuple[str, str]] = READERS) -> dict[str, Variable]:
    """Return variable name → :class:`Variable` over ``structs`` (``module.Name``), in field order.

    Raises:
        SettingsReferenceError: A Struct missing from ``readers_of``, or a field without an
            attribute docstring (the reference would have nothing to say about it).
    """
    variables: dict[str, Variable] = {}
    fields = frozenset(name for qualified in structs for name in _struct(qualified).__struct_fields__)
    for qualified in sorted(structs, key=lambda name: list(readers_of).index(name) if name in readers_of else -1):
        if qualified not in readers_of:
            raise SettingsReferenceError(f"{qualified} is read by load_settings but not named in READERS "
                                         f"of {__file__}: add its section title and the commands that read it")
        cls = _struct(qualified)
        hints, docs = typing.get_type_hints(cls, include_extras=True), attribute_docs(cls)
        readers = readers_of[qualified][1]
        for info in msgspec.structs.fields(cls):
            if not docs.get(info.name):
                raise SettingsReferenceError(f"{qualified}.{info.name} has no attribute docstring: write what "
                                             f"{variable_name(info.name)} does in the string under the field")
            var = variables.setdefault(variable_name(info.name), Variable(variable_name(info.name)))
            var.readers.append(readers)
            var.structs.append(qualified)
            var.types[readers], var.defaults[readers] = type_of(hints[info.name]), default_of(info)
            var.docs[readers] = markdown_of(docs[info.name], var.name, fields)
    return variables


def _struct(qualified: str) -> type[msgspec.Struct]:
    """Return the Struct named ``module.Name``."""
    module, _, name = qualified.rpartition(".")
    cls: type[msgspec.Struct] = getattr(importlib.import_module(module), name)
    return cls


def _cell(values: dict[str, str]) -> str:
    """One value when every Struct agrees, else ``reader: value`` for each."""
    distinct = [value for value in dict.fromkeys(values.values()) if value]
    if len(distinct) <= 1:
        return distinct[0] if distinct else ""
    return "<br>".join(f"{reader}: {value}" for reader, value in values.items() if value)


def sections(variables: dict[str, Variable],
             readers_of: Mapping[str, tuple[str, str]] = READERS) -> Iterator[tuple[str, list[Variable]]]:
    """Yield (title, variables): :data:`SHARED` first, then each Struct's own, in ``readers_of`` order."""
    shared = [var for var in variables.values() if len(var.structs) > 1]
    if shared:
        yield SHARED, shared
    for qualified, (title, _) in readers_of.items():
        own = [var for var in variables.values() if var.structs == [qualified]]
        if own:
            yield title, own


def render(structs: list[str] | None = None, readers_of: Mapping[str, tuple[str, str]] = READERS) -> str:
    """Return the Markdown reference: one ``###`` section and table per group of variables.

    Args:
        structs: ``module.Name`` of the Structs; every one :func:`settings_structs` finds when ``None``.
        readers_of: Struct → (section title, commands that read it); :data:`READERS` for the site.

    Raises:
        SettingsReferenceError: As :func:`collect`.
    """
    lines: list[str] = []
    structs = settings_structs() if structs is None else structs
    for title, group in sections(collect(structs, readers_of), readers_of):
        lines += [f"### {title}", "", "| variable | type | default | read by | meaning |",
                  "| --- | --- | --- | --- | --- |"]
        for var in group:
            readers = ", ".join(dict.fromkeys(", ".join(var.readers).split(", ")))
            lines.append(f"| `{var.name}` | {_cell(var.types)} | {_cell(var.defaults)} | {readers} "
                         f"| {_cell(var.docs)} |")
        lines.append("")
    return "\n".join(lines)


def on_page_markdown(markdown: str, /, *, page: Any, **_: Any) -> str:
    """MkDocs hook: put :func:`render`'s tables in place of :data:`MARKER` on :data:`PAGE`.

    Raises:
        SettingsReferenceError: :data:`PAGE` lost its marker line, or :func:`render` failed; the build stops.
    """
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise SettingsReferenceError(f"docs/{PAGE} must keep the line {MARKER}: the generated reference goes there")
    return markdown.replace(MARKER, render())


if __name__ == "__main__":
    sys.stdout.write(render())
