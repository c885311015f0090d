"""What every ``fanout`` subcommand shares: its exit statuses and one-line user errors.

A subcommand raises :class:`CommandError` for a mistake the user can fix (a bad flag or
variable, an unreadable file, a service it cannot reach); ``fanout_cli.main`` prints
``fanout <command>: <message>`` on stderr, never a traceback, and exits with the
error's status. The statuses are documented in docs/client.md ("Exit statuses"); they
and :class:`CommandError` live in :mod:`fanout_client.errors`, so the
client's own commands share them. The argparse ``type`` parsers here (:func:`at_least`,
:func:`above`, :func:`port_number`, :func:`existing_directory`) turn a bad flag value into
argparse's one-line usage error (exit 2) for every subcommand alike. Pure: parses text,
touches nothing (:func:`existing_directory` only asks whether a path is a directory).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Final
from urllib.parse import unquote_plus, urlsplit, urlunsplit

from fanout_client.errors import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from fanout_client.errors import EXIT_OK as EXIT_OK
from fanout_client.errors import EXIT_REFUSED as EXIT_REFUSED
from fanout_client.errors import EXIT_STREAM_ERROR as EXIT_STREAM_ERROR
from fanout_client.errors import EXIT_UNREACHABLE as EXIT_UNREACHABLE
from fanout_client.errors import EXIT_USAGE as EXIT_USAGE
from fanout_client.errors import CommandError as CommandError

REDIS_SCHEMES: Final = ("redis", "rediss", "unix")
"""URL schemes redis-py accepts (redis-py ``ConnectionPool.from_url``)."""
DEFAULT_REDIS_URL: Final = "redis://localhost:6379/0"
"""The Redis every role uses when ``REDIS_URL`` (or ``--redis-url``) is unset (docs/configuration.md)."""
MAX_PORT: Final = 65535
"""Largest TCP port number (RFC 793: ports are 16-bit)."""
SECRET_QUERY_NAMES: Final = frozenset({"password"})
"""Query options of a Redis URL that hold a credential: redis-py passes every query option to
its connections, so ``redis://host/0?password=pw`` authenticates as ``redis://:pw@host/0`` does."""


def at_least(kind: Callable[[str], int], low: int) -> Callable[[str], int]:
    """Return an argparse ``type``: ``kind(text)`` when it is >= ``low``, else a usage error (exit 2).

    Args:
        kind: Parses the flag's text (``int``); a ``ValueError`` means it is not a whole number.
        low: Smallest value accepted.
    """
    def parse(text: str) -> int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (>= {low})") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r} is below {low}")
        return value
    return parse


def above(low: float) -> Callable[[str], float]:
    """Return an argparse ``type``: a float strictly above ``low`` (never nan), else a usage error (exit 2)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number (> {low:g})") from None
        if not value > low:  # also refuses nan
            raise argparse.ArgumentTypeError(f"{text!r} is not above {low:g}")
        return value
    return parse


def port_number(text: str) -> int:
    """Parse ``--port``: a TCP port 0-65535, where 0 lets the OS pick a free one.

    Raises:
        argparse.ArgumentTypeError: Not a whole number in 0-65535 (argparse exits 2 with the message).
    """
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: use 1-{MAX_PORT}, or 0 for any free port")
    return value


def existing_directory(text: str) -> Path:
    """Parse a flag naming a directory that must already exist.

    Raises:
        argparse.ArgumentTypeError: The path does not exist or is not a directory (argparse exits 2).
    """
    path = Path(text)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"{text!r} {what}: give an existing directory")
    return path


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (for messages and logs).

    Both places redis-py reads a password from are masked: the user info
    (``redis://user:pw@host``) and the ``password`` query option (``?password=pw``,
    :data:`SECRET_QUERY_NAMES`; its name compared as redis-py decodes it). Everything else
    is shown as written.

    Args:
        url: Any URL text, possibly malformed (then returned as ``<unparsable URL>``
            when it could hold a password, else unchanged).
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparsable URL>" if "@" in url or "password" in url.lower() else url
    if password:
        user = parts.username or ""
        host = parts.netloc.rpartition("@")[2]
        url = urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    head, mark, tail = url.partition("?")  # the query, as written, up to a fragment
    query, hash_mark, fragment = tail.partition("#")
    return head + mark + _masked_query(query) + hash_mark + fragment


def _masked_query(query: str) -> str:
    """Return ``query`` with the value of each option named in :data:`SECRET_QUERY_NAMES` replaced by ``***``."""
    pairs = query.split("&")
    for index, pair in enumerate(pairs):
        name, equals, _ = pair.partition("=")
        if equals and unquote_plus(name).strip().lower() in SECRET_QUERY_NAMES:
            pairs[index] = f"{name}=***"
    return "&".join(pairs)


def check_redis_url(url: str, *, source: str = "REDIS_URL") -> None:
    """Refuse a Redis URL redis-py cannot use, before any connection is tried.

    Args:
        url: The configured URL.
        source: Where it came from, named in the message (``REDIS_URL or --redis-url``).

    Raises:
        CommandError: ``EXIT_USAGE`` when the scheme is not ``redis``, ``rediss`` or ``unix``.
    """
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in REDIS_SCHEMES:
        raise CommandError(f"{source} {redact_url(url)!r} is not a Redis URL: write it as "
                           "redis://host:6379/0 (or rediss://, unix://)")


def redis_refused(url: str, exc: BaseException, *, source: str = "REDIS_URL") -> CommandError:
    """Return the error for a Redis that answered but refused the URL's user, password or database.

    Starting Redis would not help, so the message says to fix ``source`` instead (exit 2:
    a variable is wrong).

    Args:
        url: The Redis URL that was tried (its password is masked in the message).
        exc: What redis-py raised (``invalid username-password pair``, ``DB index is out of range``).
        source: Where the URL came from.
    """
    reason = str(exc).rstrip(".") or type(exc).__name__
    return CommandError(f"Redis at {redact_url(url)} answered but refused it ({reason}): check the user, password "
                        f"and database number in {source}", exit_status=EXIT_USAGE)


def redis_unreachable(url: str, exc: BaseException, *, source: str = "REDIS_URL") -> CommandError:
    """Return the error for a Redis that did not answer, naming the URL and the fix.

    Args:
        url: The Redis URL that was tried (its password is masked in the message).
        exc: What redis-py raised (its text names the host and the OS error).
        source: Where the URL came from.
    """
    reason = str(exc).rstrip(".") or type(exc).__name__
    return CommandError(f"cannot reach Redis at {redact_url(url)} ({reason}): start Redis, "
                        f"or point {source} at a running one", exit_status=EXIT_UNREACHABLE)
