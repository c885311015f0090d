"""What every ``fanout`` subcommand shares: its exit statuses and one-line user errors.

A subcommand raises :class:`CommandError` for a mistake the user can fix (a bad flag or
variable, an unreadable file, a service it cannot reach); ``fanout_cli.main`` prints
``fanout <command>: <message>`` on stderr, never a traceback, and exits with the
error's status. The statuses are documented in README.md ("Python client and command
line"). Pure: parses text, touches nothing.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit, urlunsplit

from schema.errors import FanoutError

EXIT_OK: Final = 0
"""The command did what was asked (a followed stream ended ``completed`` or ``incomplete``)."""
EXIT_REFUSED: Final = 1
"""The publisher refused the call, a replayed body broke an invariant, or a health check failed."""
EXIT_USAGE: Final = 2
"""Bad input: a flag, a variable, a file, a port already in use (argparse uses 2 as well)."""
EXIT_STREAM_ERROR: Final = 3
"""A followed stream ended in ``stream.error`` (``failed``, ``interrupted``, ``cancelled``)."""
EXIT_UNREACHABLE: Final = 4
"""A service the command needs does not answer: the publisher (``FANOUT_URL``) or Redis (``REDIS_URL``)."""
EXIT_INTERRUPTED: Final = 130
"""Ctrl-C (SIGINT) in a command that does not drain on it, as shells report it."""

REDIS_SCHEMES: Final = ("redis", "rediss", "unix")
"""URL schemes redis-py accepts (redis-py ``ConnectionPool.from_url``)."""


class CommandError(FanoutError):
    """A command cannot go on; ``fanout`` prints the message as one line and exits.

    Args:
        message: What is wrong and what to do, one line, no secret.
        exit_status: One of the ``EXIT_*`` statuses above.
    """

    def __init__(self, message: str, *, exit_status: int = EXIT_USAGE) -> None:
        super().__init__(message, category="invalid_request")
        self.exit_status = exit_status


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (for messages and logs).

    Args:
        url: Any URL text, possibly malformed (then returned as ``<unparsable URL>``
            when it could hold a password, else unchanged).
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparsable URL>" if "@" in url else url
    if not password:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


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
