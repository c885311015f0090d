"""Error policy: how a failure becomes a ``stream.error`` the contract can show.

The default ``retryable`` per category, the ``stream.error`` status per category, and the
one redaction of messages shown to users (:func:`safe_message`, through
:func:`schema.redact.redact`; CONTRACT.md: ``message`` is safe to show a user: no
secrets, no prompt text, no upstream URL with credentials). Pure.
"""

from __future__ import annotations

from typing import Final

from schema.contract import ErrorCategory, ErrorStatus
from schema.redact import MAX_MESSAGE_CHARS as MAX_MESSAGE_CHARS
from schema.redact import safe_message as safe_message

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

