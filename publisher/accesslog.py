"""An access log that never prints credentials: the ``token`` query value is masked.

aiohttp's default format prints the request line (``%r``), query string included, and
read tokens travel in the query for EventSource clients. This logger prints method,
path, masked query, status, size and duration; it never reads ``Authorization``.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from multidict import MultiDict

MASK = "***"
SECRET_PARAMS = frozenset({"token"})
"""Query parameters whose values are masked."""


def masked_target(request: web.BaseRequest) -> str:
    """Return the request target (path and query) with secret parameter values masked."""
    query = request.rel_url.query
    if not any(name in SECRET_PARAMS for name in query):
        return request.path_qs
    masked = MultiDict((name, MASK if name in SECRET_PARAMS else value) for name, value in query.items())
    return str(request.rel_url.with_query(masked))


class MaskedAccessLogger(AbstractAccessLogger):
    """``<remote> "<METHOD> <target>" <status> <bytes> <ms>ms`` with the token masked."""

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
