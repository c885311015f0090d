"""The publisher's named limits: request body size, open SSE responses, stream id shape.

Each limit is a setting (:mod:`publisher.settings`) and is inclusive: a value exactly at
the limit passes, one past it fails with a problem document.
"""

from __future__ import annotations

import asyncio
import re
from typing import Final

from aiohttp import web

from publisher.api.problems import ProblemError
from publisher.state import SETTINGS
from schema.contract import STREAM_ID_PATTERN

STREAM_ID_RE: Final = re.compile(STREAM_ID_PATTERN)
"""``^[A-Za-z0-9_-]{1,128}$`` (CONTRACT.md, Envelope)."""
READ_CHUNK_BYTES: Final = 64 * 1024


def valid_stream_id(stream_id: str) -> bool:
    """Return True when ``stream_id`` matches the contract's pattern (at most 128 chars)."""
    return STREAM_ID_RE.fullmatch(stream_id) is not None


def path_stream_id(request: web.Request) -> str:
    """Return the ``{stream_id}`` of the URL.

    Raises:
        ProblemError: ``not-found`` (404) for an id no stream can have (bad characters, or
            longer than 128): such a stream never exists.
    """
    stream_id = request.match_info["stream_id"]
    if not valid_stream_id(stream_id):
        raise ProblemError("not-found", "no such stream (ids match ^[A-Za-z0-9_-]{1,128}$)")
    return stream_id


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """Read the whole request body, refusing more than ``max_bytes`` bytes or a slow sender.

    A declared ``Content-Length`` past the limit is refused before reading; a chunked
    body is refused as soon as it passes the limit. The whole body must arrive within
    ``FANOUT_BODY_TIMEOUT_S``.

    Raises:
        ProblemError: ``body-too-large`` (413); a 408 problem (``about:blank``, "Request
            Timeout") when the body did not arrive in time (the connection is closed).
    """
    too_large = ProblemError("body-too-large", f"the request body exceeds {max_bytes} bytes (FANOUT_MAX_BODY_BYTES)")
    if request.content_length is not None and request.content_length > max_bytes:
        raise too_large
    timeout_s = request.app[SETTINGS].body_timeout_s
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while chunk := await request.content.read(READ_CHUNK_BYTES):
                size += len(chunk)
                if size > max_bytes:
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        raise web.HTTPRequestTimeout(  # a problem document via the middleware (about:blank, 408)
            reason="Request Timeout", headers={"Connection": "close"},
            text=f"the request body did not arrive within {timeout_s} s (FANOUT_BODY_TIMEOUT_S)") from None
    return b"".join(chunks)


class ConnectionGate:
    """Counts open SSE responses of this process against ``max_connections``.

    Args:
        limit: Most open responses (``FANOUT_MAX_CONNECTIONS``).
        retry_after_s: Reconnection delay hinted past the limit, seconds.
    """

    def __init__(self, limit: int, retry_after_s: int) -> None:
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.open = 0
        self.closing = False
        """Set at shutdown: every new SSE request is refused."""

    def try_acquire(self) -> str | None:
        """Take one slot (give it back with :meth:`release`), or say why not.

        Returns:
            ``None`` when a slot was taken; else the transient reason, a problem slug:
            ``shutting-down`` or ``too-many-connections``. An SSE request is then
            answered 200 with a ``retry:`` hint and closed (:func:`publisher.wire.sse.busy_body`),
            so a browser's EventSource reconnects instead of giving up.
        """
        if self.closing:
            return "shutting-down"
        if self.open >= self.limit:
            return "too-many-connections"
        self.open += 1
        return None

    def release(self) -> None:
        """Give back one slot."""
        self.open -= 1
