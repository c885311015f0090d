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
first entry after the position is not position + 1         410 ``history-trimmed``
events gone although meta says more exist                   410 ``history-expired``
the first page read belongs to another generation           410 ``history-reset``
otherwise (queued, running, or ended with events to send)   200 ``text/event-stream``
==========================================================  ======================

The position is ``Last-Event-ID``, else the ``last_event_id`` query parameter, else 0
(an empty value counts as absent, as EventSource never sends one): ``<seq>`` (no
generation check, as before contract 1.1) or ``<seq>.<epoch>``, the SSE ``id`` of the
event the client holds. Every ``id:`` sent is ``<seq>.<epoch>`` once the stream has an
epoch. The live subscription is taken before the first history read (B18).

Follows WHATWG HTML "9.2 Server-sent events" and RFC 9457.
"""

from __future__ import annotations

import logging
import random
from typing import NamedTuple

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from opentelemetry import trace

from infra.redis_client import REDIS_ERRORS
from publisher.api.auth import authorize_read
from publisher.api.caching import Freshness, freshness
from publisher.api.fair_share import Claim
from publisher.api.limits import path_stream_id
from publisher.api.problems import ProblemError
from publisher.api.snapshot import read_snapshot, wants_snapshot
from publisher.history.entries import Page
from publisher.history.store import StreamInfo
from publisher.history.visibility import Projection, Scope
from publisher.live.reader import Reader
from publisher.live.session import Session
from publisher.state import BUDGET, FAIR_SHARES, GATE, HUB, SETTINGS, STORE, TELEMETRY
from publisher.wire.sse import SSE_HEADERS, busy_body, retry_frame
from schema.contract import parse_event_id
from schema.errors import InternalError

log = logging.getLogger(__name__)

class Position(NamedTuple):
    """Where a client is: the last seq it holds and, when its ``id`` named one, that event's epoch."""

    seq: int
    """The last seq held (0: nothing)."""
    epoch: str | None
    """The generation of that seq; ``None`` for a bare seq (not checked)."""


def parse_position(request: web.Request) -> Position:
    """Return the client's position: ``Last-Event-ID``, else ``last_event_id``, else seq 0.

    Raises:
        ProblemError: ``invalid-position`` (400) for anything but ``<seq>`` or
            ``<seq>.<epoch>`` (:func:`schema.contract.parse_event_id`), or a
            ``last_event_id`` parameter given more than once (as a repeated header is).
    """
    if len(request.query.getall("last_event_id", ())) > 1:
        raise ProblemError("invalid-position", "the last_event_id parameter is given more than once; give it once")
    raw = request.headers.get("Last-Event-ID", "").strip() or request.query.get("last_event_id", "").strip()
    if not raw:
        return Position(0, None)
    try:
        seq, epoch = parse_event_id(raw)
    except ValueError:
        raise ProblemError("invalid-position", "Last-Event-ID / last_event_id must be the id of an event held: "
                                               "<seq> or <seq>.<epoch>") from None
    return Position(seq, epoch if seq else None)


def check_epoch(info: StreamInfo, position: Position) -> None:
    """Refuse a position in another generation than the stream's current one (contract 1.1).

    Raises:
        ProblemError: ``history-reset`` (410), with the stream's ``epoch`` (null when it has
            none yet) and ``last_seq``: the events the client holds are not this stream's
            history any more; it must start again from the beginning (no ``Last-Event-ID``).
    """
    current = info.epoch
    if position.epoch is not None and position.epoch != current:
        raise ProblemError("history-reset", "the stream was written again as another generation; the events "
                                            "held are not its history any more: read it again from the start",
                           extensions={"epoch": current or None,
                                       "last_seq": info.last_seq if info.known else info.tomb_last_seq})


def early_answer(stream_id: str, info: StreamInfo, position: Position) -> web.Response | None:
    """Return the 204 owed before any read, or ``None`` to go on; raise the 404/410 owed.

    Raises:
        ProblemError: ``not-found``, ``history-reset``, ``history-expired`` or ``position-ahead``.
    """
    if not info.known and not info.tomb:
        raise ProblemError("not-found", f"no stream {stream_id}")
    check_epoch(info, position)
    return _early_by_seq(info, position.seq)


def _early_by_seq(info: StreamInfo, position: int) -> web.Response | None:
    if not info.known:
        last_seq = info.tomb_last_seq
        if position == last_seq:
            return web.Response(status=204)
        raise ProblemError("history-expired", "the stream ended and its events expired",
                           extensions={"last_seq": last_seq, "stream_status": info.tomb.get("status")})
    if position > info.last_seq:
        raise ProblemError("position-ahead", f"position {position} is past the stored top {info.last_seq}",
                           extensions={"last_seq": info.last_seq})
    if info.terminal and position == info.last_seq:
        return web.Response(status=204)
    return None


async def check_first_page(request: web.Request, info: StreamInfo, page: Page, reader: Reader) -> None:
    """Refuse a reader's position that stored history no longer follows (B20), or a page of another generation.

    ``reader.cursor`` is the position (nothing was sent yet).

    Raises:
        ProblemError: ``history-reset`` (the page was read in another generation than
            the one the reader holds: the stream was written again since ``info``),
            ``history-trimmed`` (entries remain, but not ``position + 1``; carries
            ``first_seq``) or ``history-expired`` (the events are gone).
    """
    if not reader.adopt(page, page.epoch):
        raise ProblemError("history-reset", "the stream was written again as another generation while it was read",
                           extensions={"epoch": page.epoch.decode() or None, "last_seq": None})
    stream_id, position = reader.stream_id, reader.cursor
    if page and page[0].seq != position + 1:
        raise ProblemError("history-trimmed", f"seq {position + 1} is no longer stored",
                           extensions={"first_seq": page[0].seq, "last_seq": info.last_seq})
    if not page and info.last_seq > position:
        if await request.app[STORE].events_exist(stream_id):
            raise ProblemError("history-trimmed", f"seq {position + 1} is no longer stored",
                               extensions={"first_seq": None, "last_seq": info.last_seq})
        raise ProblemError("history-expired", "the stream's events expired", extensions={"last_seq": info.last_seq})


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
    shares = request.app[FAIR_SHARES]
    claim = shares.take(request, "sse")
    if claim is None:
        telemetry.refusal("too-many-requests")
        return await busy_stream(request, "too-many-requests", shares.retry_after_s)
    gate = request.app[GATE]
    refusal = gate.try_acquire()
    if refusal is not None:
        claim.release()
        telemetry.refusal(refusal)
        return await busy_stream(request, refusal)
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
            gate.release()
            claim.release()


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
        prelude, final = b"", False
        if snapshot:  # stands for the history up to its seq: the reader goes on from there
            prelude, reader.cursor, final, info = await read_snapshot(request, stream_id, scope, info)
            reader.epoch = reader_epoch(info)
        asked = app[STORE].first_page
        first = [await app[STORE].read_after(stream_id, reader.cursor, asked, share=hub.share_key(reader))]  # handed on
        await check_first_page(request, info, first[0], reader)
        await stream.start(reader, Projection(scope), first, asked=asked, known_top=info.last_seq, prelude=prelude,
                           final=final)
    except BaseException:
        hub.leave(reader)  # a started event stream leaves the hub when it ends
        raise
    return stream


def reader_epoch(info: StreamInfo) -> bytes | None:
    """Return the generation a new reader starts in.

    Meta ``epoch`` (``b""``: none, a stream older than contract 1.1), or ``None`` while
    nothing is stored (the first page read tells).
    """
    return info.epoch.encode() if info.last_seq > 0 else None


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

    __slots__ = ("_cache", "_claim", "_final", "_first", "_prelude", "_request", "_session", "_top")

    def __init__(self, request: web.Request, claim: Claim, cache: Freshness | None = None) -> None:
        super().__init__(status=200, headers=SSE_HEADERS | (cache.headers if cache is not None else {}))
        self._request = request
        self._claim = claim
        self._cache = cache
        self._session: Session | None = None
        self._first: list[Page] = []
        self._asked = 0
        self._prelude, self._final, self._top = b"", False, 0

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
        self._prelude, self._final, self._top = prelude, final, known_top
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
