"""What every ``fanout`` subcommand shares: its exit statuses and one-line user errors.

A subcommand raises :class:`CommandError` for a mistake the user can fix (a bad flag or
variable, an unreadable file, a service it cannot reach); ``fanout_cli.main`` prints
``fanout <command>: <message>`` on stderr, never a traceback, and exits with the
error's status. The statuses are documented in README.md ("Python client and command
line"); they and :class:`CommandError` live in :mod:`fanout_client.errors`, so the
client's own commands share them. Pure: parses text, touches nothing.
"""

from __future__ import annotations

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
SECRET_QUERY_NAMES: Final = frozenset({"password"})
"""Query options of a Redis URL that hold a credential: redis-py passes every query option to
its connections, so ``redis://host/0?password=pw`` authenticates as ``redis://:pw@host/0`` does."""


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
