"""Settings from environment variables, parsed and validated by msgspec.

Each process defines a frozen Struct of its settings whose field names are the
variable names lower-cased without the ``FANOUT_`` prefix (``FANOUT_STREAM_TTL_S`` →
``stream_ttl_s``); :func:`load_settings` reads them from a mapping (``os.environ``).
Pure: takes the mapping, reads nothing itself.
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Collection, Mapping
from typing import Final, TypeVar

import msgspec

from schema.errors import FanoutError

T = TypeVar("T", bound=msgspec.Struct)

PREFIX = "FANOUT_"
FLAGS: Final = {"redis_prefix": "--prefix"}
"""Command-line flags not named ``--<field with dashes>`` (the others are)."""
"""Prefix of every fanout variable."""


EXPECTED_KINDS: Final = {
    "bool": "a boolean: 1, 0, true or false",
    "int": "an integer",
    "float": "a number",
    "str": "text",
}
"""How a refused value's expected type is worded, by msgspec's type name. The booleans are
what ``msgspec.convert(..., strict=False)`` takes from text (``true``/``false`` in any case)."""

_EXPECTED = re.compile(r"Expected `(\w+)`(?:, got `[^`]+`)?(.*)", re.DOTALL)


class SettingsError(FanoutError):
    """A configuration variable is missing or malformed; the process cannot start."""


class RedisEnvironment(msgspec.Struct, frozen=True, kw_only=True):
    """The Redis topology variable of commands that have no settings of their own (``export``, ``demo``)."""

    redis_cluster: bool = False
    """``FANOUT_REDIS_CLUSTER``: ``REDIS_URL`` names a seed node of a Redis Cluster (1, 0, true or false)."""


def redis_cluster_from_env(environ: Mapping[str, str]) -> bool:
    """Return ``FANOUT_REDIS_CLUSTER`` parsed as every process parses it.

    Raises:
        SettingsError: A value other than 1, 0, true or false (any case).
    """
    return load_settings(RedisEnvironment, environ).redis_cluster


def load_settings(cls: type[T], environ: Mapping[str, str], **overrides: object) -> T:
    """Build ``cls`` from ``FANOUT_*`` variables, then keyword overrides (CLI flags).

    Lists are written comma-separated (``FANOUT_API_KEYS=a,b``). Numbers and booleans
    are parsed from their text. ``REDIS_URL`` maps to ``redis_url`` when the Struct has it.

    Raises:
        SettingsError: A value that does not parse or fails validation, naming the variable.
    """
    fields = set(cls.__struct_fields__)
    raw: dict[str, object] = {}
    for name, value in environ.items():
        key = name[len(PREFIX):].lower() if name.startswith(PREFIX) else name.lower()
        if key in fields and (name.startswith((PREFIX, "OTEL_")) or name == "REDIS_URL"):
            raw[key] = _split_list(cls, key, value)
    raw.update({k: v for k, v in overrides.items() if v is not None})
    for field in _float_fields(cls) & raw.keys():
        if _non_finite(raw[field]):  # msgspec takes inf and nan from text: "no limit" is never meant
            name = next((n for n in (PREFIX + field.upper(), field.upper()) if n in environ), field)
            raise SettingsError(f"bad configuration: {name}={raw[field]!r}: expected a finite number")
    try:
        return msgspec.convert(raw, cls, strict=False)
    except msgspec.ValidationError as exc:
        given = {k for k, v in overrides.items() if v is not None}
        raise SettingsError(f"bad configuration: {_name_variable(cls, str(exc), raw, environ, given)}") from exc


def _name_variable(cls: type[msgspec.Struct], message: str, raw: Mapping[str, object],
                   environ: Mapping[str, str], flagged: Collection[str] = ()) -> str:
    """Rewrite msgspec's ``... - at `$.field``` into what set the field, with its value.

    A field given on the command line (``flagged``: it wins over the environment) is named
    by its flag (``--concurrency=0``, :data:`FLAGS`), else by the variable that set it;
    the reason is worded as what the setting accepts (:func:`_plain`).
    """
    detail, sep, path = message.rpartition(" - at `$.")
    if not sep:
        return f"{message} (variables FANOUT_<FIELD>)"
    field = path.rstrip("`").split("[", 1)[0].split(".", 1)[0]
    detail = _plain(detail, _choices(cls, field))
    if field in flagged:
        return f"{FLAGS.get(field, '--' + field.replace('_', '-'))}={raw.get(field)!r}: {detail}"
    for name in (PREFIX + field.upper(), field.upper()):
        if name in environ:
            return f"{name}={environ[name]!r}: {detail}"
    return f"{field}={raw.get(field)!r}: {detail}"


def _plain(detail: str, choices: list[str]) -> str:
    """Word msgspec's ``Expected `int`, got `str``` as what is accepted: ``expected an integer``.

    A range keeps its bound (``expected an integer >= 1``); a value outside a ``Literal``
    gets the accepted values (``expected one of auto, classic, sharded``). Other messages
    are returned as they are.
    """
    if choices and detail.startswith("Invalid enum value"):
        return f"expected one of {', '.join(choices)}"
    match = _EXPECTED.fullmatch(detail)
    if match is None or match[1] not in EXPECTED_KINDS:
        return detail
    return f"expected {EXPECTED_KINDS[match[1]]}{match[2]}"


def _float_fields(cls: type[msgspec.Struct]) -> set[str]:
    """Return the fields of ``cls`` that hold a number with a fraction (``float``, maybe optional)."""
    found = set()
    for field, hint in typing.get_type_hints(cls, include_extras=False).items():
        stack = [hint]
        while stack:
            current = stack.pop()
            if current is float:
                found.add(field)
            stack += list(typing.get_args(current))
    return found


def _non_finite(value: object) -> bool:
    """Return True for ``inf``, ``-inf`` and ``nan``, as text or as a float."""
    try:
        return not math.isfinite(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def _split_list(cls: type[msgspec.Struct], key: str, value: str) -> object:
    annotation = str(cls.__annotations__.get(key, ""))
    if "list" in annotation or "tuple" in annotation:
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _choices(cls: type[msgspec.Struct], field: str) -> list[str]:
    """Return the accepted values of a ``Literal`` (or optional ``Literal``) field, else ``[]``."""
    hints = typing.get_type_hints(cls, include_extras=False)
    found: list[str] = []
    stack = [hints.get(field)]
    while stack:
        hint = stack.pop()
        if typing.get_origin(hint) is typing.Literal:
            found += [str(value) for value in typing.get_args(hint)]
        elif typing.get_args(hint):
            stack += list(typing.get_args(hint))
    return found
