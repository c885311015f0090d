"""``GET /v1/streams/{stream_id}/ui``: a stream as the AI SDK's UI message stream, for ``useChat``.

Same tokens and auth as ``/events`` (:func:`publisher.api.auth.authorize_read`); the chunks
are :mod:`publisher.wire.ui_chunks`' translation of the events the token may see. Every
request replays the stream from its first event (what the SDK's resume expects: it
rebuilds the message from the start), then serves live events as they are stored, and
ends with ``data: [DONE]`` after the terminal event.

==========================================================  ======================
situation                                                   answer
==========================================================  ======================
no meta, no events, no tombstone                            404 ``not-found``
``?resume=1`` and the stream ended (or only its tombstone)  204: nothing to resume
the credential holds its open streams (fair share)          429 ``too-many-requests``
events expired (tombstone only), no ``resume``              410 ``history-expired``
history no longer starts at seq 1                           410 ``history-trimmed``
the first page read belongs to another generation          410 ``history-reset``
otherwise                                                   200 ``text/event-stream``
==========================================================  ======================

A credential holding ``FANOUT_MAX_CONNECTIONS_PER_*`` open streams (``/events`` and
``/ui`` together, :mod:`publisher.api.fair_share`) gets a 429 with ``Retry-After``, as the
other transient refusals here are problem documents (503): the SDK's transport reads
this route with ``fetch``, not EventSource, and fails a non-2xx answer visibly, where a
200 without chunks would end the message silently empty.

``?resume=1`` is the reconnect request of the SDK's transport (``reconnectToStream``,
whose convention is 204 when no stream is active). A gap found mid-response (history
vanished, or the stream was written again as another generation: contract 1.1) sends an
``error`` chunk and ends without ``[DONE]``; a reader dropped at shutdown or on overflow
ends without ``[DONE]`` too, and its client reconnects. Every request starts from seq 1,
so a reconnect after a reset rebuilds the message from the new generation.

Follows the AI SDK's "Stream Protocols" page and WHATWG HTML "9.2 Server-sent events".
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from aiohttp import web

from infra.redis_client import REDIS_ERRORS
from publisher.api.auth import authorize_read
from publisher.api.caching import Freshness, freshness
from publisher.api.limits import path_stream_id
from publisher.api.positions import check_first_page, reader_epoch
from publisher.api.problems import ProblemError
from publisher.history.entries import Entry, Page
from publisher.history.visibility import Projection, Scope
from publisher.live.reader import Reader
from publisher.live.reader_budget import ReaderBudget, Waiting, page_bytes, reset_on_close
from publisher.state import BUDGET, FAIR_SHARES, GATE, HUB, SETTINGS, STORE
from publisher.wire.sse import PING
from publisher.wire.ui_chunks import DONE_LINE, DeltaJoiner, UIMessageTranslator, chunk_frame
from schema.contract import decode_event
from schema.errors import InternalError

log = logging.getLogger(__name__)

UI_HEADERS: Final = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-store, no-transform",
    "X-Vercel-AI-UI-Message-Stream": "v1",
    "X-Accel-Buffering": "no",
}
"""The SDK's ``UI_MESSAGE_STREAM_HEADERS``, but ``no-store`` (finished streams: :mod:`publisher.api.caching`)."""

_DATA: Final = b"\ndata: "


def entry_json(entry: Entry) -> bytes:
    """Return the event JSON inside an entry's ready SSE frame (``id``, ``event``, ``data`` lines)."""
    start = entry.frame.index(_DATA) + len(_DATA)
    return entry.frame[start:-2]


async def stream_ui(request: web.Request) -> web.StreamResponse:
    """Serve one stream as a UI message stream (see the module table for every non-200 answer).

    Raises:
        ProblemError: 401, 403, 404, 410 as tabled; 429 past the credential's
            ``FANOUT_MAX_CONNECTIONS_PER_*``; 503 past ``FANOUT_MAX_CONNECTIONS``.
    """
    stream_id = path_stream_id(request)
    scope = authorize_read(request, stream_id)
    resume = request.query.get("resume", "") in ("1", "true")
    claim = request.app[FAIR_SHARES].claim(request, "sse")
    gate = request.app[GATE]
    refusal = gate.try_acquire()
    if refusal is not None:
        claim.release()
        raise ProblemError(refusal, "the publisher cannot open another stream now; retry shortly",
                           headers={"Retry-After": str(request.app[SETTINGS].busy_retry_after_s)})
    try:
        return await _answer(request, stream_id, scope, resume=resume)
    except InternalError as exc:  # the live subscription was not confirmed: nothing was sent yet
        raise ProblemError("redis-unavailable", "the live channel is not available now; retry shortly",
                           headers={"Retry-After": str(request.app[SETTINGS].busy_retry_after_s)}) from exc
    finally:
        gate.release()
        claim.release()


async def _answer(request: web.Request, stream_id: str, scope: Scope, *, resume: bool) -> web.StreamResponse:
    """Answer 204, 404 or 410 from the stored state, else serve from seq 1 (the slot is held by the caller)."""
    info = await request.app[STORE].info(stream_id)
    if not info.known and not info.tomb:
        raise ProblemError("not-found", f"no stream {stream_id}")
    if resume and (info.terminal or not info.known):
        return web.Response(status=204)
    if not info.known:
        raise ProblemError("history-expired", "the stream ended and its events expired",
                           extensions={"last_seq": info.tomb_last_seq})
    fresh = await freshness(request, stream_id, info, "ui", (scope,), extra="no-transform")
    if fresh is not None and fresh.matches(request):
        return fresh.not_modified()
    reader = Reader(stream_id, 0, request.app[SETTINGS].client_queue, lambda: _drop(request),
                    epoch=reader_epoch(info))
    hub = request.app[HUB]
    try:
        await hub.join(reader)
        page = await request.app[STORE].read_after(stream_id, 0)
        await check_first_page(request, info, page, reader)
        writer = UIWriter(Projection(scope), request.app[SETTINGS].ui_join_max_chars)
        return await _serve(request, reader, writer, page, info.last_seq, cache=fresh)
    finally:
        hub.leave(reader)


def _drop(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()


class UIWriter:
    """Turns stored entries into UI chunk bytes for one response.

    While the history is replayed, the deltas of a run are joined per block
    (:class:`~publisher.wire.ui_chunks.DeltaJoiner`): a reconnecting ``useChat`` gets
    each block's text so far in one delta, not one chunk per stored delta. Live events
    after :meth:`live` are sent one chunk each.

    Args:
        projection: What the reader may see (internal reasoning left out of public tokens).
        join_max_chars: Most replayed text held for joining (``FANOUT_UI_JOIN_MAX_CHARS``).
    """

    def __init__(self, projection: Projection, join_max_chars: int) -> None:
        self.projection = projection
        self.translator = UIMessageTranslator()
        self.joiner: DeltaJoiner | None = DeltaJoiner(join_max_chars)

    def live(self) -> bytes:
        """Return the deltas held from the replay, joined; from now on every delta is sent as it comes."""
        chunks, self.joiner = self.joiner.flush() if self.joiner is not None else [], None
        return b"".join(chunk_frame(chunk) for chunk in chunks)

    def frames(self, entries: list[Entry]) -> bytes:
        """Return the SSE bytes of the chunks these entries produce (``[DONE]`` after a terminal)."""
        out: list[bytes] = []
        for entry in entries:
            if not entry.frame or not self.projection.visible(entry):
                continue
            event = decode_event(entry_json(entry))
            if event is None:
                continue
            chunks = self.translator.feed(event)
            if self.joiner is not None:
                chunks = self.joiner.feed(chunks)
            out += [chunk_frame(chunk) for chunk in chunks]
            if self.translator.finished:
                out.append(DONE_LINE)
                break
        return b"".join(out)


async def _serve(request: web.Request, reader: Reader, writer: UIWriter, page: Page,
                 known_top: int, *, cache: Freshness | None) -> web.StreamResponse:
    """Write the response; one of a finished stream (``cache``) cut short by a storage error is aborted."""
    response = web.StreamResponse(status=200, headers=UI_HEADERS | (cache.headers if cache is not None else {}))
    await response.prepare(request)
    session = _UISession(request, response, reader, writer, known_top)
    try:
        if not await session.replay(page):
            if held := writer.live():
                await session.write(held)
            await session.live()
        await response.write_eof()
    except ConnectionError:
        pass  # the client left or was dropped
    except REDIS_ERRORS as exc:  # headers are sent: end the body; the client reconnects
        log.warning("ui stream %s: storage error mid-response: %s", reader.stream_id, exc)
        if cache is not None:
            _drop(request)
    return response


class _UISession:
    """Replay from seq 1, then the live tail, as :class:`publisher.live.session.Session` does for ``/events``."""

    def __init__(self, request: web.Request, response: web.StreamResponse, reader: Reader, writer: UIWriter,
                 known_top: int) -> None:
        self.app, self.request, self.response = request.app, request, response
        self.reader, self.writer, self.known_top = reader, writer, known_top
        self.settings = request.app[SETTINGS]
        self.budget: ReaderBudget = request.app[BUDGET]
        self.last_write = time.monotonic()

    async def replay(self, page: Page) -> bool:
        """Send history until the reader is live; return True when the response must end."""
        store, stale = self.app[STORE], False
        while True:
            if not self.reader.adopt(page, page.epoch):  # the stream was written again meanwhile
                await self.gap(reset=True)
                return True
            for entry in page:
                if entry.seq != self.reader.cursor + 1:
                    await self.gap()
                    return True
                self.reader.cursor = entry.seq
            if await self.send(page):
                return True
            if len(page) < store.page:
                if self.reader.cursor < self.known_top:
                    await self.gap()
                    return True
                if self.app[HUB].go_live(self.reader):
                    return False
                if stale and not page:
                    await self.gap()
                    return True
                stale = not page
            pending = store.read_after(self.reader.stream_id, self.reader.cursor)
            del page  # the page written is let go while the next one is read
            page = await pending

    async def live(self) -> None:
        """Send entries as the hub offers them, with a ``: ping`` comment when idle."""
        heartbeat_s = self.settings.heartbeat_s
        while True:
            entry = await self.reader.next(max(0.0, heartbeat_s - (time.monotonic() - self.last_write)))
            if entry is not None:
                if await self.send([entry, *self.reader.take_queued()]):
                    return
            elif self.reader.closed == "gap":
                await self.gap(reset=self.reader.reset)
                return
            elif self.reader.closed is not None:
                return
            elif time.monotonic() - self.last_write >= heartbeat_s:
                await self.write(PING)

    async def send(self, entries: list[Entry]) -> bool:
        """Write the chunks of ``entries``; return True once the terminal's were written."""
        data = self.writer.frames(entries)
        if data:
            await self.write(data, page_bytes(entries))
        return self.writer.translator.finished

    async def gap(self, *, reset: bool = False) -> None:
        """Tell the client that stored history no longer follows (an ``error`` chunk, no ``[DONE]``).

        ``reset``: the stream was written again as another generation (contract 1.1).
        """
        log.warning("ui stream %s: history gap after seq %d (reset: %s)", self.reader.stream_id, self.reader.cursor,
                    reset)
        text = ("stream.gap: history-reset: the stream was written again as another generation; reconnect to "
                "read it from the start" if reset else
                "stream.gap: stored history no longer follows this stream; reconnect to get the cause")
        await self.write(chunk_frame({"type": "error", "errorText": text}))

    async def write(self, data: bytes, held: int = 0) -> None:
        """Write ``data``; drop a client that takes nothing for ``FANOUT_WRITE_TIMEOUT_S``.

        While it waits, ``data`` and ``held`` bytes more (the entries it came from) count
        against the readers' memory budgets (:mod:`publisher.live.reader_budget`).

        Raises:
            ConnectionResetError: The client stopped reading, or was dropped over a budget.
        """
        waiting = self._waiting(data, held)
        try:
            async with asyncio.timeout(self.settings.write_timeout_s):
                await self.response.write(data)
        except TimeoutError:
            _drop(self.request)
            raise ConnectionResetError("the client stopped reading") from None
        finally:
            self.budget.end(waiting)
        self.last_write = time.monotonic()

    def _waiting(self, data: bytes, held: int) -> Waiting:
        transport = self.request.transport
        own = (transport.get_write_buffer_size() if transport is not None else 0) + len(data) + held
        return self.budget.begin(self._reset, data, 0, own)

    def _reset(self) -> None:
        reset_on_close(self.request.transport)
        _drop(self.request)
