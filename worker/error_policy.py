"""Error policy: how a failure becomes a ``stream.error`` the contract can show.

The default ``retryable`` per category, the ``stream.error`` status per category, and the
one redaction of messages shown to users (:func:`safe_message`, through
:func:`schema.redact.redact`; CONTRACT.md: ``message`` is safe to show a user: no
secrets, no prompt text, no upstream URL with credentials). Pure.
"""

from __future__ import annotations

from typing import Final

from schema.contract import ErrorCategory, ErrorStatus
from schema.logs import quoted
from schema.redact import redact

RETRYABLE: Final[dict[ErrorCategory, bool]] = {
    "upstream_overloaded": True,
    "rate_limited": True,
    "upstream_error": True,
    "invalid_request": False,
    "authentication": False,
    "permission": False,
    "not_found": False,
    "context_length_exceeded": False,
    "content_filter": False,
    "timeout": True,
    "transport": True,
    "protocol": False,
    "worker_lost": True,
    "cancelled": False,
    "internal": False,
}
"""Default ``retryable`` per error category, used when an adapter does not say."""

STATUS_OF_CATEGORY: Final[dict[ErrorCategory, ErrorStatus]] = {
    "transport": "interrupted",
    "timeout": "interrupted",
    "worker_lost": "interrupted",
    "cancelled": "cancelled",
}
"""``stream.error`` status for categories that are not ``failed``."""

MAX_MESSAGE_CHARS: Final = 500
"""Longest error message passed on to readers; longer ones are cut."""


def safe_message(text: str) -> str:
    """Return ``text`` with every key-shaped string out (:func:`schema.redact.redact`), cut to MAX_MESSAGE_CHARS.

    The one path of every message shown to readers: ``stream.error``'s ``error.message``
    (the normalizer and the worker's own storage errors), meta ``error_message``.
    """
    masked = redact(text)
    return masked if len(masked) <= MAX_MESSAGE_CHARS else masked[: MAX_MESSAGE_CHARS - 1] + "…"


def redis_error_fields(exc: BaseException) -> str:
    """Return ``error=<class> message="<text>"`` for a log line: the server's message, masked and quoted.

    The text is :func:`safe_message` of ``str(exc)`` (credentials masked, cut), quoted by
    :func:`schema.logs.quoted` (backslashes, double quotes and line breaks escaped), so
    the key=value line stays one line.
    """
    return f"error={type(exc).__name__} message={quoted(safe_message(str(exc)), always=True)}"
