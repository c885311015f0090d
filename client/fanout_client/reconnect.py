"""What a reconnect needs: the SSE ``id`` worth sending back, one connection's outcome, the wait before the next.

Follows WHATWG HTML "9.2 Server-sent events" (``id``, ``retry``: the reconnection time). Pure:
no aiohttp.
"""

from __future__ import annotations

import random
from typing import Final

from fanout_client.contract import parse_event_id

DEFAULT_RETRY_MS: Final = 1000
"""Reconnect delay before the server sends a ``retry:`` hint (the WHATWG default is UA-defined)."""
MAX_BACKOFF_S: Final = 30.0
"""Longest wait between two reconnects."""


def event_id(text: str | None) -> str | None:
    """Return an SSE ``id`` worth sending back as ``Last-Event-ID`` (``<seq>`` or ``<seq>.<epoch>``), else ``None``."""
    if not text:
        return None
    try:
        parse_event_id(text)
    except ValueError:
        return None
    return text


class Connection:
    """What one connection learned beyond its events: whether it got an answer, and a 204."""

    __slots__ = ("complete", "connected")

    def __init__(self) -> None:
        self.complete = False
        self.connected = False


def backoff_s(retry_ms: int, failures: int) -> float:
    """Wait before reconnect ``failures``: the ``retry:`` hint, doubled per failure, full jitter after the first."""
    base = retry_ms / 1000.0
    if failures <= 1:
        return base
    ceiling: float = min(MAX_BACKOFF_S, base * 2.0 ** (failures - 1))
    return ceiling * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not cryptography
