"""``GET /v1/streams/{stream_id}/events``: the stream over SSE with exact ``Last-Event-ID`` resume.

Before any byte of the body, the request is answered in full when it can be:

==========================================================  ======================
situation                                                   answer
==========================================================  ======================
position not ``<seq>`` or ``<seq>.<epoch>``                 400 ``invalid-position``
no meta, no events, no tombstone                            404 ``not-found``
position names an epoch that is not the stream's (meta's,   410 ``history-reset``
or the tombstone's): the stream was written again
tombstone only, position = its last seq                     204
tombstone only, any other position                          410 ``history-expired``
position above the stored top (meta ``last_seq``)           410 ``position-ahead``
ended and position = last seq                               204
ended, ``If-None-Match`` names the response's ``ETag``      304 (:mod:`publisher.api.caching`)
first entry after the position is not position + 1         410 ``history-trimmed``
events gone although meta says more exist                   410 ``history-expired``
the first page read belongs to another generation           410 ``history-reset``
otherwise (queued, running, or ended with events to send)   200 ``text/event-stream``
==========================================================  ======================

The position is ``Last-Event-ID``, else the ``last_event_id`` query parameter, else 0
(an empty value counts as absent, as EventSource never sends one): ``<seq>`` (no
generation check, as before contract 1.1) or ``<seq>.<epoch>``, the SSE ``id`` of the
event the client holds. Every ``id:`` sent is ``<seq>.<epoch>`` once the stream has an
epoch. The live subscription is taken before the first history read (B18). Without a
position, ``?snapshot=1`` sends one ``stream.snapshot`` first and the history after its
seq (:mod:`publisher.api.snapshot`, which tables its own answers).

Follows WHATWG HTML "9.2 Server-sent events" and RFC 9457.
"""

from __future__ import annotations

import logging
import random

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from opentelemetry import trace

from infra.redis_client import REDIS_ERRORS
from publisher.api.auth import authorize_read
from publisher.api.caching import Freshness, freshness
from publisher.api.fair_share import Claim
from publisher.api.limits import path_stream_id
from publisher.api.positions import Position, check_first_page, early_answer, parse_position, reader_epoch
from publisher.api.problems import ProblemError
from publisher.api.snapshot import read_snapshot, wants_snapshot
from publisher.history.entries import Page
from publisher.history.store import StreamInfo
from publisher.history.visibility import Projection, Scope
from publisher.live.reader import Reader
from publisher.live.session import Session
from publisher.state import BUDGET, FAIR_SHARES, GATE, HUB, SETTINGS, STORE, TELEMETRY
from publisher.wire.sse import SSE_HEADERS, busy_body, retry_frame
from schema.errors import InternalError

log = logging.getLogger(__name__)


async def stream_events(request: web.Request) -> web.StreamResponse:
    """Serve one stream over SSE (see the module table for every non-200 answer).

    A transient refusal (``FANOUT_MAX_CONNECTIONS`` reached, the credential's own limit
    reached (``FANOUT_MAX_CONNECTIONS_PER_*``, :mod:`publisher.api.fair_share`), shutting down,
    Redis pool busy or unreachable, live subscription not confirmed) is never a status
    that makes EventSource give up: it is a 200 holding only a ``retry:`` hint, jittered
    around ``FANOUT_BUSY_RETRY_AFTER_S`` (``FANOUT_SHARE_RETRY_AFTER_S`` past the credential's
    own limit: :func:`busy_stream`). A 200 event stream is returned
    prepared (headers sent) and its body written afterwards (:class:`EventStream`).

    Raises:
        ProblemError: 400, 401, 403, 404, 410 as tabled (real client errors).
    """
    stream_id = path_stream_id(request)
    scope = authorize_read(request, stream_id)
    position = parse_position(request)
    telemetry = request.app[TELEMETRY]
    if position.seq > 0:
        telemetry.resumes.add(1)
    admitted = _admit(request)
    if not isinstance(admitted, Claim):
        return await busy_stream(request, *admitted)
    claim = admitted
    response: web.StreamResponse | None = None
    try:
        response = await _answer(request, stream_id, scope, position, claim)
        return response
    except ProblemError as exc:
        if exc.status == 410:
            telemetry.gone.add(1, {"cause": exc.slug})
        raise
    except (*REDIS_ERRORS, InternalError) as exc:  # raised before the response started
        if not isinstance(exc, InternalError):
            telemetry.redis_error(exc)
        log.warning("stream %s: storage unavailable before the response: %s", stream_id, exc)
        return await busy_stream(request, "redis-unavailable")
    finally:
        if not isinstance(response, EventStream):  # a started event stream gives the slots back when it ends
            request.app[GATE].release()
            claim.release()


def _admit(request: web.Request) -> Claim | tuple[str, float | None]:
    """Take the credential's place and a ``FANOUT_MAX_CONNECTIONS`` slot, or return why not.

    Returns:
        The claim (the slot is held too), or the busy reason and the delay to hint
        (``None``: ``FANOUT_BUSY_RETRY_AFTER_S``) for :func:`busy_stream`.
    """
    telemetry, shares = request.app[TELEMETRY], request.app[FAIR_SHARES]
    claim = shares.take(request, "sse")
    if claim is None:
        telemetry.refusal("too-many-requests")
        return "too-many-requests", shares.retry_after_s
    refusal = request.app[GATE].try_acquire()
    if refusal is not None:
        claim.release()
        telemetry.refusal(refusal)
        return refusal, None
    return claim


async def busy_stream(request: web.Request, reason: str, retry_after_s: float | None = None) -> web.StreamResponse:
    """Answer 200 with only a ``retry:`` hint (about ``FANOUT_BUSY_RETRY_AFTER_S``, jittered ±50 %), then end.

    Args:
        request: The SSE request turned away.
        reason: Problem slug of the transient condition (``too-many-connections``, ...).
        retry_after_s: The delay to hint instead, seconds (``FANOUT_SHARE_RETRY_AFTER_S``
            for ``too-many-requests``).
    """
    delay_s = request.app[SETTINGS].busy_retry_after_s if retry_after_s is None else retry_after_s
    retry_ms = int(delay_s * 1000 * random.uniform(0.5, 1.5))  # noqa: S311
    response = web.Response(status=200, headers=SSE_HEADERS, body=busy_body(retry_ms, reason))
    response.force_close()
    return response


async def _answer(request: web.Request, stream_id: str, scope: Scope, position: Position,
                  claim: Claim) -> web.StreamResponse:
    app = request.app
    info = await app[STORE].info(stream_id)
    app[TELEMETRY].link_submit(info.meta)
    early = early_answer(stream_id, info, position)
    if early is not None:
        app[TELEMETRY].no_content.add(1)
        return early
    snapshot = wants_snapshot(request, position.seq)
    fresh = await freshness(request, stream_id, info, "events", (scope, position.seq, snapshot),
                            vary="Authorization, Last-Event-ID", extra="no-transform")
    if fresh is not None and fresh.matches(request):
        return fresh.not_modified()
    stream = EventStream(request, claim, fresh)
    reader = Reader(stream_id, position.seq, app[SETTINGS].client_queue, stream.drop, epoch=reader_epoch(info))
    hub = app[HUB]
    try:
        await hub.join(reader)
        first, prelude, final, info = await _first_read(request, scope, info, reader, snapshot=snapshot)
        await stream.start(reader, Projection(scope), first, asked=app[STORE].first_page, known_top=info.last_seq,
                           prelude=prelude, final=final)
    except BaseException:
        hub.leave(reader)  # a started event stream leaves the hub when it ends
        raise
    return stream


async def _first_read(request: web.Request, scope: Scope, info: StreamInfo, reader: Reader, *,
                      snapshot: bool) -> tuple[list[Page], bytes, bool, StreamInfo]:
    """Read what the response starts with: ``([first page], snapshot message or b"", snapshot is final, info)``.

    A snapshot stands for the history up to its seq: the reader's cursor moves there and
    the first page is read after it; a finished stream's snapshot is all there is (no read).

    Raises:
        ProblemError: 410 as :func:`check_first_page` and :func:`publisher.api.snapshot.read_snapshot` say.
    """
    store, hub, prelude = request.app[STORE], request.app[HUB], b""
    if snapshot:
        prelude, reader.cursor, final, info = await read_snapshot(request, reader.stream_id, scope, info)
        reader.epoch = reader_epoch(info)
        if final:
            return [Page()], prelude, True, info
    first = [await store.read_after(reader.stream_id, reader.cursor, store.first_page, share=hub.share_key(reader))]
    await check_first_page(request, info, first[0], reader)
    return first, prelude, False, info  # the page list is handed on: no frame keeps the page


class EventStream(web.StreamResponse):
    """The ``200 text/event-stream`` response of one reader, its body written in :meth:`write_eof`.

    The handler prepares it (:meth:`start`: headers and the session) and returns it;
    aiohttp then calls ``prepare`` (already done) and ``write_eof``, which runs the
    :class:`~publisher.live.session.Session` (replay, live tail, end) to the end of the body.
    So while a reader is open, the handler's and the middleware's frames are gone and
    its request span has ended (it covers the handshake up to the headers, with
    ``fanout.sse.stream`` set). From :meth:`start` on, this response owns the reader's
    place in the hub, its ``FANOUT_MAX_CONNECTIONS`` slot and its credential's place, and
    gives them back when the body ends, however it ends (client gone, cancelled, error).

    A finished stream's response (``cache`` given: :mod:`publisher.api.caching`) cut short
    (a storage error, an unexpected error) is aborted, not ended, so no cache keeps a partial
    body under its tag. A ``stream.gap`` ends it as always: stored history that no longer
    follows is what every later read of that position finds too.

    Args:
        request: The SSE request.
        claim: The request's place under its credential (:mod:`publisher.api.fair_share`).
        cache: The caching headers of a finished stream's response; ``None``: ``no-store``.
    """

    __slots__ = ("_cache", "_claim", "_final", "_first", "_prelude", "_request", "_session")

    def __init__(self, request: web.Request, claim: Claim, cache: Freshness | None = None) -> None:
        super().__init__(status=200, headers=SSE_HEADERS | (cache.headers if cache is not None else {}))
        self._request = request
        self._claim = claim
        self._cache = cache
        self._session: Session | None = None
        self._first: list[Page] = []
        self._asked = 0
        self._prelude, self._final = b"", False

    def drop(self) -> None:
        """Drop the connection of a reader whose queue overflowed or whose client stopped reading, even mid-write."""
        self._request.app[TELEMETRY].overflows.add(1)
        if self._request.transport is not None:
            self._request.transport.abort()

    async def start(self, reader: Reader, projection: Projection, first: list[Page], *, asked: int,
                    known_top: int, prelude: bytes = b"", final: bool = False) -> None:
        """Send the headers and set up the session; the body follows in :meth:`write_eof`.

        Args:
            reader: The reader, joined to the hub, cursor at the client's position.
            projection: What the reader may see.
            first: ``[page]``: the first history page, checked to start at the cursor + 1.
            asked: The ``COUNT`` that page was read with: a shorter page reached the top.
            known_top: The stored top seq read before the first page.
            prelude: Sent before the first page (a ``stream.snapshot`` message).
            final: The prelude ends the stream (a finished stream's snapshot): nothing follows it.
        """
        request, app = self._request, self._request.app
        if request.version >= (1, 1):
            self.enable_chunked_encoding()
        await self.prepare(request)
        if isinstance(request.protocol, RequestHandler):
            # Cancels the connection's header-read timer (FANOUT_HEADER_TIMEOUT_S) now rather than
            # when it fires, a no-op then (it closes only a connection waiting for a request); the
            # keep-alive flag is True while a request is served, and aiohttp resets it afterwards.
            request.protocol.keep_alive(True)
        trace.get_current_span().set_attribute("fanout.sse.stream", True)
        app[TELEMETRY].open_connections.add(1)
        settings = app[SETTINGS]
        self._first, self._asked = first, asked
        self._prelude, self._final = prelude, final
        self._session = Session(response=self, reader=reader, projection=projection, store=app[STORE], hub=app[HUB],
                                telemetry=app[TELEMETRY], heartbeat_s=settings.heartbeat_s, known_top=known_top,
                                write_timeout_s=settings.write_timeout_s,
                                read_ahead_hold_s=settings.read_ahead_hold_ms / 1000, on_stall=self.drop,
                                transport=request.transport, chunked=self.chunked, budget=app[BUDGET])

    async def write_eof(self, data: bytes = b"") -> None:
        """Write the body (the whole stream), then end it; give back the hub place and the slot."""
        session, self._session = self._session, None
        if session is not None:
            app = self._request.app
            try:
                await self.write(retry_frame(app[SETTINGS].sse_retry_ms) + self._prelude)
                if not self._final:
                    await session.run(self._first, self._asked)
                await super().write_eof(data)
            except ConnectionError:
                self._abort_cached()  # the client left, or was dropped on overflow or a stalled write
            except REDIS_ERRORS as exc:  # headers are sent: end the body, the client resumes
                app[TELEMETRY].redis_error(exc)
                log.warning("stream %s: storage error mid-response: %s", session.reader.stream_id, exc)
                self._abort_cached()
            except Exception:  # headers are sent: no problem document is possible any more
                log.exception("stream %s: unexpected error mid-response", session.reader.stream_id)
                self._abort_cached()
            finally:
                app[TELEMETRY].open_connections.add(-1)
                app[HUB].leave(session.reader)
                app[GATE].release()
                self._claim.release()
        await super().write_eof(data)  # done already, or raises ConnectionError when the client is gone

    def _abort_cached(self) -> None:
        """Abort a cacheable response cut short: a body ended cleanly would look whole to a cache."""
        if self._cache is not None and self._request.transport is not None:
            self._request.transport.abort()
