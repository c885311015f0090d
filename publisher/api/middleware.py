"""Request middleware: one server span per request, CORS preflights, problem documents for every error.

:func:`edge_middleware` is the app's only middleware. It does, outermost first, what
three middlewares did: the request's SERVER span (sees the final status, problem
documents included), the answer to a CORS preflight, and problem documents. One
coroutine instead of three keeps one frame (and one aiohttp wrapper) per request in
flight. CORS headers of ordinary and streaming responses are added by
:func:`add_cors_headers` on ``on_response_prepare``, the one place every response passes
before its headers are sent.

The span covers the handler: for an SSE response, whose body aiohttp writes after the
handler returned (:class:`publisher.api.events.EventStream`), that is the handshake up to the
response headers; the body is not in the span.

Follows RFC 9457 (problem details), the Fetch standard's CORS protocol, and the
OpenTelemetry HTTP server span conventions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from opentelemetry import context, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from infra.redis_client import REDIS_ERRORS
from publisher.api.problems import FieldError, ProblemError, from_http_exception
from publisher.state import SETTINGS, TELEMETRY
from publisher.wire.durable import EXPOSE_HEADERS as DURABLE_EXPOSE_HEADERS
from schema.errors import InternalError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ALLOW_METHODS = "GET, POST, OPTIONS"
ALLOW_HEADERS = "Authorization, Content-Type, Last-Event-ID, If-None-Match"
EXPOSE_HEADERS = ", ".join(("Location", "Retry-After", "WWW-Authenticate", *DURABLE_EXPOSE_HEADERS))
PREFLIGHT_MAX_AGE_S = 600


def route_of(request: web.Request) -> str | None:
    """Return the matched route template (``/v1/streams/{stream_id}``), or ``None``."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Serve one request inside its SERVER span; answer preflights; turn errors into problem documents.

    The span is named ``<method> <route>`` (no query string) and made current with
    ``context.attach`` (no generator context manager). A CORS preflight (``OPTIONS`` +
    ``Access-Control-Request-Method``) of a known route is answered here
    (:func:`preflight_response`). Any other request goes to the handler, after
    :func:`refuse_repeated_headers`; every error raised before a response started is
    answered as a problem document. An unexpected exception (a bug, or stored state no
    writer of ours makes) is logged with its traceback and answered ``500``
    ``internal``, never aiohttp's plain-text page. Handlers that start a response body
    (SSE) end it themselves on any error, so nothing reaches here after headers were sent.
    """
    span = _server_span(request)
    token = context.attach(trace.set_span_in_context(span))
    try:
        response = await _respond(request, handler)
        span.set_attribute("http.response.status_code", response.status)
        if response.status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        return response
    except asyncio.CancelledError:  # the client left (handler cancellation): not a server error
        span.set_attribute("fanout.client_disconnected", True)
        raise
    except Exception as exc:  # a redirect (HTTPException below 400) passes through
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        context.detach(token)
        span.end()


def _server_span(request: web.Request) -> trace.Span:
    """Start the request's SERVER span, ``<method> <route>``, continuing the caller's trace context."""
    route = route_of(request)
    attributes = {"http.request.method": request.method, "url.path": request.path, "url.scheme": request.scheme}
    if route is not None:
        attributes["http.route"] = route
    return request.app[TELEMETRY].tracer.start_span(
        f"{request.method} {route}" if route else request.method,
        context=propagate.extract(request.headers),
        kind=SpanKind.SERVER,
        attributes=attributes,
    )


async def _respond(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer a preflight, else run the handler; an error raised before a response started becomes a problem."""
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        return preflight_response(request)
    try:
        refuse_repeated_headers(request)
        return await handler(request)
    except Exception as exc:
        return problem_for(request, exc)


def problem_for(request: web.Request, exc: Exception) -> web.Response:
    """Return the problem document answering ``exc``, raised by a handler before its response started.

    Call it from the ``except`` block (an unexpected exception is logged with its traceback).

    Raises:
        web.HTTPException: ``exc`` itself when it is a redirect (status below 400).
    """
    if isinstance(exc, ProblemError):
        return exc.response()
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        return from_http_exception(exc)
    if isinstance(exc, (*REDIS_ERRORS, InternalError)):  # the cluster client also raises RedisClusterException
        if isinstance(exc, REDIS_ERRORS):
            request.app[TELEMETRY].redis_error(exc)
        log.warning("%s %s: storage unavailable: %s", request.method, request.path, exc)
        return ProblemError("redis-unavailable", "storage is unavailable; retry later",
                            headers={"Retry-After": str(request.app[SETTINGS].busy_retry_after_s)}).response()
    log.exception("%s %s: unexpected error", request.method, request.path)
    return ProblemError("internal", "internal error; it was logged").response()


SINGLE_HEADERS = ("Authorization", "Last-Event-ID")
"""Headers a request may carry at most once; a second one is a 400, never "first wins"."""


def refuse_repeated_headers(request: web.Request) -> None:
    """Refuse a request that repeats a header of :data:`SINGLE_HEADERS`.

    Raises:
        ProblemError: ``invalid-field`` (400) naming the header (never its values).
    """
    for name in SINGLE_HEADERS:
        if len(request.headers.getall(name, ())) > 1:
            raise ProblemError("invalid-field", f"the {name} header is sent more than once; send it once",
                               errors=[FieldError(field=name, detail="sent more than once")])


def _allowed_origin(request: web.Request) -> str | None:
    origin = request.headers.get("Origin")
    allowed = request.app[SETTINGS].cors_origins
    if origin is None or not allowed:
        return None
    if "*" in allowed:
        return "*"
    return origin if origin in allowed else None


def preflight_response(request: web.Request) -> web.Response:
    """Answer a CORS preflight: ``204`` (granting methods and headers to an allowed origin), or ``404`` off routes."""
    exc = request.match_info.http_exception
    if exc is not None and exc.status == 404:
        return from_http_exception(exc)
    headers = {}
    if _allowed_origin(request) is not None:
        headers = {
            "Access-Control-Allow-Methods": ALLOW_METHODS,
            "Access-Control-Allow-Headers": ALLOW_HEADERS,
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
        }
    return web.Response(status=204, headers=headers)


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Add ``Access-Control-Allow-Origin`` (and ``Vary: Origin``) for an allowed origin."""
    origin = _allowed_origin(request)
    if origin != "*" and request.app[SETTINGS].cors_origins:
        response.headers.add("Vary", "Origin")
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
