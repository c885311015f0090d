"""An access log that never prints credentials: query values are masked but for known harmless ones.

aiohttp's default format prints the request line (``%r``), query string included, and
read tokens travel in the query for EventSource clients (``?token=``). Clients also put
credentials in parameters the API never reads (``?api_key=``, ``?key=`` as Gemini's API
takes it), so every value is masked except those of :data:`PLAIN_PARAMS`; the names stay,
to tell what was sent. This logger prints method, path, masked query, status, size and
duration; it never reads ``Authorization``.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from multidict import MultiDict

MASK = "***"
PLAIN_PARAMS = frozenset({"last_event_id", "resume"})
"""Query parameters of the API whose values are logged as sent (no credential); every other value is masked."""


def masked_target(request: web.BaseRequest) -> str:
    """Return the request target (path and query), each value not of :data:`PLAIN_PARAMS` replaced by ``***``."""
    query = request.rel_url.query
    if all(name in PLAIN_PARAMS for name in query):
        return request.path_qs
    masked = MultiDict((name, value if name in PLAIN_PARAMS else MASK) for name, value in query.items())
    return str(request.rel_url.with_query(masked))


class MaskedAccessLogger(AbstractAccessLogger):
    """``<remote> "<METHOD> <target>" <status> <bytes> <ms>ms``, query values masked (:func:`masked_target`)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        """Write one access-log line (``time`` is the request duration in seconds)."""
        self.logger.info(
            '%s "%s %s" %s %s %.1fms',
            request.remote,
            request.method,
            masked_target(request),
            response.status,
            response.body_length,
            time * 1000,
        )
