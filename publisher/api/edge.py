"""The socket edge: a cap on open sockets, and malformed requests answered without leaking them.

aiohttp's own server answers a request it cannot parse in plain text and logs the parse
error at ERROR with its traceback, whose message quotes the offending bytes (an
``Authorization`` value, say). Here, instead:

* :class:`EdgeRunner` (use it wherever ``web.AppRunner`` would be) makes its server count
  open sockets against ``FANOUT_MAX_SOCKETS``: one more is aborted at once, before any
  byte is read, so silent sockets cannot exhaust file descriptors and ``/healthz`` keeps
  answering. A browser's ``EventSource`` treats the abort as a network error and retries.
* Its connections answer a request that does not parse with a problem document
  (``application/problem+json``, ``about:blank``, the status aiohttp chose) and log one
  INFO line naming only the peer and the exception class.
* :class:`ParseErrorFilter`, installed on the ``aiohttp.server`` logger by
  :func:`install_log_filter`, strips the message arguments and traceback of every
  "Error handling request" record, whatever runner serves the app.

The header-read timeout is aiohttp's keep-alive timeout (``handler_args`` of the app,
``FANOUT_HEADER_TIMEOUT_S``): a connection that has not completed its request headers
when it fires is closed. Follows RFC 9457 and RFC 9110 section 15.5.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import logging
from collections.abc import Coroutine
from typing import Any, Final, TypeVar

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from publisher.api.problems import problem_response
from publisher.state import SETTINGS

log = logging.getLogger(__name__)

T = TypeVar("T")

SERVER_LOGGER: Final = "aiohttp.server"
"""aiohttp's logger of request-handling errors."""
PARSE_ERROR_PREFIX: Final = "Error handling request"
SHUTDOWN_CANCEL_S: Final = 0.05
"""After the shutdown grace, how long a cancelled request may unwind before its connection is closed, seconds."""


class ParseErrorFilter(logging.Filter):
    """Keeps aiohttp's "Error handling request" records but drops their arguments and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place; always keep it."""
        if isinstance(record.msg, str) and record.msg.startswith(PARSE_ERROR_PREFIX):
            kind = type(record.exc_info[1]).__name__ if record.exc_info and record.exc_info[1] else "unknown"
            record.msg, record.args = f"{PARSE_ERROR_PREFIX}: malformed request ({kind}); values not logged", None
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


def install_log_filter() -> None:
    """Add :class:`ParseErrorFilter` to aiohttp's server logger once per process."""
    logger = logging.getLogger(SERVER_LOGGER)
    if not any(isinstance(f, ParseErrorFilter) for f in logger.filters):
        logger.addFilter(ParseErrorFilter())


class EdgeRequestHandler(RequestHandler):
    """aiohttp's connection handler, answering unparseable requests with a problem document."""

    __slots__ = ()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """Return the problem response owed for a request aiohttp could not parse or serve.

        Raises:
            ConnectionError: Part of a response was already sent; the connection is dropped.
        """
        log.info("malformed request from %s: %s (%d); values not logged", request.remote,
                 type(exc).__name__ if exc else "unknown", status)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already started; the connection is dropped")
        reason = "Bad Request" if status < 500 else "Internal Server Error"
        detail = "the request could not be parsed as HTTP/1.1" if status < 500 else "internal error"
        body = {"type": "about:blank", "title": reason, "status": status, "detail": detail}
        response = problem_response(body, status)
        response.force_close()
        return response


class EdgeServer(web.Server):
    """aiohttp's server with :class:`EdgeRequestHandler` connections and a socket cap.

    Made by :class:`EdgeRunner` from the server aiohttp builds; ``max_sockets`` is read
    from the app's settings.
    """

    max_sockets: int
    open_sockets: int

    def __call__(self) -> RequestHandler:
        """Make the handler of one accepted connection (the protocol factory)."""
        return EdgeRequestHandler(self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        """Register a connection; abort it when it is one past ``max_sockets``."""
        super().connection_made(handler, transport)
        self.open_sockets += 1
        if self.open_sockets > self.max_sockets:
            log.warning("socket cap reached (%d open, FANOUT_MAX_SOCKETS); connection refused", self.max_sockets)
            transport.abort()

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        """Unregister a connection."""
        self.open_sockets -= 1
        super().connection_lost(handler, exc)

    async def shutdown(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 - aiohttp's signature
        """Let running requests finish for ``timeout`` seconds in all, then cancel them and close their connections.

        aiohttp's own shutdown waits ``timeout`` for a handler, then cancels its request
        and waits ``timeout`` again (twice the grace for a response blocked writing to a
        client that stopped reading), and a ``timeout`` of 0 means no limit at all; here
        ``FANOUT_SHUTDOWN_GRACE_S`` bounds the whole, and 0 cancels at once.
        """
        if timeout is None:
            await super().shutdown(None)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.gather(*(conn.shutdown(None) for conn in self._connections))
        await super().shutdown(SHUTDOWN_CANCEL_S)  # what still runs: cancelled, connection closed


class EdgeRunner(web.AppRunner):
    """``web.AppRunner`` whose server is an :class:`EdgeServer` (socket cap, problem answers)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = EdgeServer  # same layout, two methods more: no state of aiohttp's is copied
        assert isinstance(server, EdgeServer)
        server.max_sockets = self.app[SETTINGS].max_sockets
        server.open_sockets = 0
        return server


def uvloop_available() -> bool:
    """Return True when the optional ``uvloop`` package (extra ``fast``) is installed."""
    return importlib.util.find_spec("uvloop") is not None


def run(main: Coroutine[Any, Any, T], *, use_uvloop: bool = True) -> T:
    """Run ``main`` to completion on a new event loop: uvloop's when installed and wanted, else asyncio's.

    Args:
        main: The process's top coroutine.
        use_uvloop: ``FANOUT_UVLOOP`` (default on); off runs the standard loop (to
            measure with and without).
    """
    if use_uvloop and uvloop_available():
        import uvloop  # noqa: PLC0415 - optional dependency, imported only when used

        log.info("event loop: uvloop %s", importlib.metadata.version("uvloop"))
        result: T = uvloop.run(main)
        return result
    return asyncio.run(main)
