"""One log setup for every fanout process: the level, the line format, the handler on stderr.

``fanout worker``, ``fanout publisher``, ``fanout export``, ``fanout upstream`` and
``fanout demo`` call :func:`configure_from_env` once at start, so an operator's collector
reads one shape from every container:

* ``FANOUT_LOG_LEVEL`` (``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``; default ``INFO``), which
  the ``--log-level`` flag of the worker and the publisher overrides (:func:`add_arguments`);
* ``FANOUT_LOG_FORMAT``: ``logfmt`` (default), one line per record::

      ts=2025-01-31T09:30:00.123Z level=INFO logger=fanout.worker event=worker_start ...

  (``ts`` is UTC, ISO 8601 with milliseconds; the message follows as the caller wrote it,
  with its control characters escaped, so a value from a request, such as a model name with
  a newline, cannot start a forged line; a traceback on the lines after it), or ``json``,
  one JSON object per line with ``ts``,
  ``level``, ``logger`` and ``msg``, plus ``exc`` (the traceback text) when the record has one,
  and, when the message is wholly ``key=value`` pairs (the worker's ``event=...`` records),
  those pairs as fields of their own (``"event": "job_end"``), so a collector can filter on them.

Only the root logger gets a handler; filters that loggers carry (the publisher's
:class:`publisher.api.edge.ParseErrorFilter` on ``aiohttp.server``) run before any handler and
keep working under both formats. Handlers others add to the root (the OpenTelemetry log
handler) are left in place. Imports no asyncio, aiohttp, redis or opentelemetry.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from collections.abc import Mapping
from typing import Final, Literal, TextIO, get_args

import msgspec

from schema.cli import EXIT_USAGE, CommandError
from schema.settings import SettingsError, load_settings

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LogFormat = Literal["logfmt", "json"]
LEVELS: Final[tuple[str, ...]] = get_args(LogLevel)
"""Accepted ``FANOUT_LOG_LEVEL`` and ``--log-level`` values (exactly these, upper case)."""

LOGFMT: Final = "ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"
"""Line shape of the ``logfmt`` format (``asctime`` is :func:`timestamp`)."""
HANDLER_NAME: Final = "fanout"
"""Name of the root handler :func:`configure` installs (and replaces on a second call)."""


class LogSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The log settings of a process; field ``x`` is read from ``FANOUT_X``."""

    log_level: LogLevel = "INFO"
    """``FANOUT_LOG_LEVEL``: records below it are dropped, by every handler of the root logger (the
    log format's and the OpenTelemetry log export alike); ``--log-level`` of ``fanout worker`` and
    ``fanout publisher`` overrides it."""
    log_format: LogFormat = "logfmt"
    """``FANOUT_LOG_FORMAT``: ``logfmt`` lines or ``json`` objects, one per line, on stderr."""


def timestamp(record: logging.LogRecord) -> str:
    """Return the record's creation time as UTC ISO 8601 with milliseconds (``2025-01-31T09:30:00.123Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


_BARE_VALUE = re.compile(r'[^\s"=\\]+')
"""A logfmt value that needs no quotes: no space, quote, equals sign or backslash."""


def quoted(value: object, *, always: bool = False) -> str:
    r"""Return ``value`` as one logfmt value: bare when it can be (and not ``always``), else double-quoted.

    Inside the quotes a backslash, a double quote and a line break are escaped (``\\``, ``\"``, ``\n``), so
    a value from a request (a model name ``gpt level=ERROR``) stays one value and cannot
    add fields to its line. :func:`logfmt_pairs` reads it back.
    """
    text = str(value)
    if not always and _BARE_VALUE.fullmatch(text):
        return text
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "\\r").replace("\n", "\\n")
    return f'"{text}"'


CONTROL_ESCAPES: Final[dict[int, str]] = {
    code: {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(chr(code), f"\\x{code:02x}")
    for code in (*range(0x20), 0x7F)}
"""C0 control characters and DEL → their backslash escapes, for ``str.translate``."""


class LogfmtFormatter(logging.Formatter):
    """``ts=... level=... logger=... <message>``; a traceback, when present, on the following lines.

    The message's control characters (newline, carriage return, tab, the other C0 codes and
    DEL) are written as backslash escapes (a backslash and ``n``; ``x1b`` for ESC), so one record is one line
    whatever its arguments hold. The record itself is left as it was for other handlers.
    """

    def __init__(self) -> None:
        super().__init__(LOGFMT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        """Return the line's first part, the message's control characters escaped."""
        message = record.message
        record.message = message.translate(CONTROL_ESCAPES)
        try:
            return super().formatMessage(record)
        finally:
            record.message = message

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 (logging's name)
        """Return :func:`timestamp` of the record (``datefmt`` is ignored: one format everywhere)."""
        return timestamp(record)


_PAIR = re.compile(r'([A-Za-z_][\w.]*)=("(?:[^"\\]|\\.)*"|[^\s"]*)(?:\s+|$)')
"""One logfmt ``key=value`` pair: a bare value (no space, no quote) or a double-quoted one."""
_UNESCAPE: Final = {"n": "\n", "r": "\r"}
"""Backslash escapes of a quoted value other than the escaped character itself."""
RESERVED_FIELDS: Final = frozenset({"ts", "level", "logger", "msg", "exc"})
"""Fields of every JSON line, which a message's pairs never replace."""


def logfmt_pairs(message: str) -> dict[str, str] | None:
    r"""Return the ``key=value`` pairs of a message made only of them, else ``None``.

    A quoted value loses its quotes and its backslash escapes (``\"`` is ``"``). A
    message with anything else in it (prose, a stray quote) gives ``None``: it is kept
    as ``msg`` only, never half-parsed. A key seen twice keeps its first value.
    """
    pairs: dict[str, str] = {}
    position = 0
    while position < len(message):
        match = _PAIR.match(message, position)
        if match is None or match.end() == position:
            return None
        key, value = match.group(1), match.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", lambda m: _UNESCAPE.get(m[1], m[1]), value[1:-1])
        pairs.setdefault(key, value)
        position = match.end()
    return pairs or None


class JsonFormatter(logging.Formatter):
    """One JSON object per record on one line: ``ts``, ``level``, ``logger``, ``msg`` and maybe ``exc``.

    ``exc`` holds the traceback (and ``stack_info``, when asked for) as text, newlines escaped
    by JSON; non-ASCII text stays as UTF-8. A message made only of ``key=value`` pairs
    (:func:`logfmt_pairs`) adds each pair as a field, except the five above. No other
    attribute of the record is written (no ``extra`` fields), so a line tells what the
    message tells after the loggers' filters ran.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as one line of JSON (no trailing newline)."""
        message = record.getMessage()
        line: dict[str, str] = {"ts": timestamp(record), "level": record.levelname, "logger": record.name,
                                "msg": message}
        for key, value in (logfmt_pairs(message) or {}).items():
            if key not in RESERVED_FIELDS:
                line[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        details = [text for text in (record.exc_text, record.stack_info and self.formatStack(record.stack_info))
                   if text]
        if details:
            line["exc"] = "\n".join(details)
        return json.dumps(line, ensure_ascii=False)


FORMATTERS: Final[dict[str, type[logging.Formatter]]] = {"logfmt": LogfmtFormatter, "json": JsonFormatter}
"""``FANOUT_LOG_FORMAT`` value → its formatter."""


def load(environ: Mapping[str, str], *, log_level: str | None = None) -> LogSettings:
    """Read :class:`LogSettings` from ``FANOUT_LOG_LEVEL`` / ``FANOUT_LOG_FORMAT``; ``log_level`` (a flag) wins.

    Raises:
        SettingsError: A value outside the accepted set, naming the variable, its value
            and the accepted values (:func:`schema.settings.load_settings`).
    """
    return load_settings(LogSettings, environ, log_level=log_level)


def make_handler(settings: LogSettings, stream: TextIO) -> logging.Handler:
    """Return a handler writing ``settings.log_format`` lines to ``stream`` (not yet installed)."""
    handler = logging.StreamHandler(stream)
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(FORMATTERS[settings.log_format]())
    return handler


def configure(settings: LogSettings, stream: TextIO | None = None) -> logging.Handler:
    """Set the root logger's level and its one fanout handler, replacing the one a previous call installed.

    Args:
        settings: Level and format.
        stream: Where lines go; ``sys.stderr`` (as it is at the call) when ``None``.

    Returns:
        The installed handler (a test removes it with ``logging.getLogger().removeHandler``).
    """
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(old)
        old.close()
    handler = make_handler(settings, sys.stderr if stream is None else stream)
    root.addHandler(handler)
    root.setLevel(settings.log_level)
    return handler


def configure_from_env(environ: Mapping[str, str], *, log_level: str | None = None) -> LogSettings:
    """Read the log settings (:func:`load`) and install them (:func:`configure`) on stderr.

    Raises:
        CommandError: ``EXIT_USAGE`` for a bad ``FANOUT_LOG_LEVEL`` or ``FANOUT_LOG_FORMAT``;
            ``fanout_cli`` prints it as one line, and the process must not start.
    """
    try:
        settings = load(environ, log_level=log_level)
    except SettingsError as exc:
        raise CommandError(str(exc), exit_status=EXIT_USAGE) from exc
    configure(settings)
    return settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``--log-level`` (overrides ``FANOUT_LOG_LEVEL``; argparse refuses other values, exit 2)."""
    parser.add_argument("--log-level", default=None, choices=LEVELS,
                        help=f"log level (env FANOUT_LOG_LEVEL; default {LogSettings().log_level})")
