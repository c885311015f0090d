"""Durable Streams live reads of a stream: long-poll (``live=long-poll``) and SSE (``live=sse``).

Both hold a connection, so both take a place under the credential (``FANOUT_MAX_CONNECTIONS_PER_*``,
429) and in ``FANOUT_MAX_CONNECTIONS`` (503), with ``Retry-After``; the protocol's client
retries both. Both join the hub before their first history read (as ``/events`` does), then
take what follows the client's offset from history and, once caught up, from the live tail
(:class:`Tail`).

A long-poll read answers as soon as it has events for its client (``200``, at most a page),
or ``204`` after ``FANOUT_DURABLE_LONG_POLL_S``; at an ended stream's last seq it answers
``204`` with ``Stream-Closed`` at once. An SSE read sends each batch as a ``data`` event and
a ``control`` event, a ``control`` with ``upToDate`` once caught up, ``: ping`` comments
while idle (``FANOUT_HEARTBEAT_S``), and ends after the terminal event (``streamClosed``),
after ``FANOUT_DURABLE_SSE_MAX_S`` (its client reconnects from the last offset), or when
stored history stops following its position (the reconnect then gets the 410).

Follows the Durable Streams Protocol, sections 5.7, 5.8 and 10.
"""

from __future__ import annotations

import logging
import random
import time

from aiohttp import web

from infra.redis_client import REDIS_ERRORS
from publisher.api.durable_read import Query, Start, contiguous, messages, resolve
from publisher.api.durable_write import BudgetedWriter, drop, send_answer
from publisher.api.positions import check_first_page, reader_epoch
from publisher.api.problems import ProblemError
from publisher.history.entries import Entry, Page
from publisher.history.visibility import Projection, Scope
from publisher.live.reader import Reader
from publisher.state import FAIR_SHARES, GATE, HUB, SETTINGS, STORE
from publisher.wire.durable import (
    MAX_JITTER_S,
    NO_STORE,
    SSE_HEADERS,
    ReadState,
    control_event,
    data_event,
    entity_tag,
    format_offset,
    json_array,
    read_headers,
    response_cursor,
)
from publisher.wire.sse import PING
from schema.errors import InternalError

log = logging.getLogger(__name__)


class TailEndedError(Exception):
    """The reader cannot go on: stored history stopped following it (``gap``), or it was closed (overflow, shutdown)."""


class _StopAfterError(TailEndedError):
    """History stops following after these entries: hand them out, then end."""

    def __init__(self, entries: list[Entry]) -> None:
        super().__init__("gap")
        self.entries = entries


class Tail:
    """The entries after a reader's cursor: stored pages first, then the hub's live tail.

    Args:
        request: The read request.
        reader: The reader, joined to the hub; its cursor is the client's position.
        first: The first history page, already checked (:func:`check_first_page`).
        known_top: The stored top seq read before ``first``.
    """

    def __init__(self, request: web.Request, reader: Reader, first: Page, known_top: int) -> None:
        self.app, self.reader, self.known_top = request.app, reader, known_top
        self.live = False
        self._page: Page | None = first
        self._stale = False

    @property
    def up_to_date(self) -> bool:
        """Everything stored so far was handed out."""
        return self.live and self.reader.queued() == 0

    async def next(self, timeout_s: float) -> list[Entry]:
        """Return the next entries (the cursor moves past them), or ``[]`` on timeout or on going live.

        Raises:
            TailEndedError: History no longer follows the cursor, or the reader was closed.
        """
        while not self.live:
            page = self._page if self._page is not None else await self._read()
            self._page = None
            entries = self._take(page)
            if entries or self.live:
                return entries
        entry = await self.reader.next(max(0.0, timeout_s))
        if entry is not None:
            return [entry, *self.reader.take_queued()]
        if self.reader.closed is not None:
            raise TailEndedError(self.reader.closed)
        return []

    async def _read(self) -> Page:
        return await self.app[STORE].read_after(self.reader.stream_id, self.reader.cursor)

    def _take(self, page: Page) -> list[Entry]:
        """Check one history page, move the cursor over it, go live once it reached the top."""
        if not self.reader.adopt(page, page.epoch):
            raise TailEndedError("history-reset")
        entries = contiguous(self.reader, list(page))
        if len(entries) < len(page):
            raise TailEndedError("gap") if not entries else _StopAfterError(entries)
        if len(page) < self.app[STORE].page:
            if self.reader.cursor < self.known_top:
                raise TailEndedError("gap") if not entries else _StopAfterError(entries)
            self.live = self.app[HUB].go_live(self.reader)
            if not self.live and not page:
                if self._stale:
                    raise TailEndedError("gap")
                self._stale = True
        return entries


async def serve_live(request: web.Request, stream_id: str, scope: Scope, query: Query) -> web.StreamResponse:
    """Serve a long-poll or SSE read (see the module docstring).

    Raises:
        ProblemError: 404/410 (:func:`resolve`, :func:`check_first_page`), 429 past the
            credential's share, 503 past ``FANOUT_MAX_CONNECTIONS`` or without Redis.
    """
    app = request.app
    info = await app[STORE].info(stream_id)
    start = resolve(stream_id, info, query.offset)
    if start.closed:
        state = ReadState(start.offset, up_to_date=True, closed=True)
        if query.live == "sse":
            return web.Response(body=control_event(start.offset, cursor=None, up_to_date=True, closed=True),
                                headers=SSE_HEADERS)
        return web.Response(status=204, headers=read_headers(state, cache_control=NO_STORE))
    claim = app[FAIR_SHARES].claim(request, "sse")
    gate = app[GATE]
    refusal = gate.try_acquire()
    if refusal is not None:
        claim.release()
        raise ProblemError(refusal, "the publisher cannot hold another live read now; retry shortly",
                           headers={"Retry-After": str(app[SETTINGS].busy_retry_after_s)})
    reader = Reader(stream_id, start.seq, app[SETTINGS].client_queue, lambda: drop(request), epoch=reader_epoch(info))
    try:
        await app[HUB].join(reader)
        first = await app[STORE].read_after(stream_id, start.seq, share=app[HUB].share_key(reader))
        await check_first_page(request, info, first, reader)
        tail = Tail(request, reader, first, info.last_seq)
        live = LiveRead(request, tail, Projection(scope), start, query.cursor)
        return await (live.long_poll() if query.live == "long-poll" else live.sse())
    except InternalError as exc:  # the live subscription was not confirmed: nothing was sent yet
        raise ProblemError("redis-unavailable", "the live channel is not available now; retry shortly",
                           headers={"Retry-After": str(app[SETTINGS].busy_retry_after_s)}) from exc
    finally:
        app[HUB].leave(reader)
        gate.release()
        claim.release()


class LiveRead:
    """One live answer: what was handed out so far and where that leaves the client."""

    def __init__(self, request: web.Request, tail: Tail, projection: Projection, start: Start,
                 cursor: str | None) -> None:
        self.request, self.tail, self.projection = request, tail, projection
        self.settings = request.app[SETTINGS]
        self.epoch, self.start = start.epoch, start.offset
        self.seq = start.seq
        """The last seq handed out (the reader's cursor may be ahead: entries queued meanwhile)."""
        self.closed = False
        self.cursor = response_cursor(cursor, time.time(), random.randint(1, MAX_JITTER_S))  # noqa: S311

    @property
    def offset(self) -> str:
        """The offset after everything handed out."""
        return format_offset(self.seq, self.epoch)

    async def batch(self, timeout_s: float) -> tuple[list[bytes], bool, bool]:
        """Take the next entries.

        Returns:
            Their messages (maybe none: internal reasoning for a public reader), whether
            the cursor moved, and whether the answer must end after them.
        """
        try:
            entries, end = await self.tail.next(timeout_s), False
        except _StopAfterError as stop:
            entries, end = stop.entries, True
        if entries:
            self.epoch = entries[-1].epoch.decode() or self.epoch  # heard live, a first reader learns it here
            self.seq, self.closed = entries[-1].seq, entries[-1].terminal
        found = await messages(self.request, self.projection, self.tail.reader.stream_id, entries)
        return found, bool(entries), end or self.closed

    async def long_poll(self) -> web.StreamResponse:
        """Answer 200 with the first events that come (or are stored), else 204 at the deadline."""
        deadline = time.monotonic() + self.settings.durable_long_poll_s
        found: list[bytes] = []
        try:
            while not found and not self.closed and time.monotonic() < deadline:
                found, _, end = await self.batch(deadline - time.monotonic())
                if end:
                    break
        except TailEndedError as exc:  # nothing handed out yet: the client asks again and gets the cause
            log.info("durable long-poll %s ended: %s", self.tail.reader.stream_id, exc)
        state = ReadState(self.offset, up_to_date=self.tail.up_to_date, closed=self.closed)
        if not found:
            return web.Response(status=204, headers=read_headers(state, cache_control=NO_STORE, cursor=self.cursor))
        tag = entity_tag("public" if self.projection.public else "internal", self.start, state)
        headers = read_headers(state, cache_control=NO_STORE, cursor=self.cursor, etag=tag)
        self.request.app[HUB].leave(self.tail.reader)  # nothing more is taken: no live event queues while it is sent
        return await send_answer(self.request, json_array(found), headers)

    async def sse(self) -> web.StreamResponse:
        """Stream batches as ``data`` + ``control`` events until the end, the time limit or a gap."""
        response = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await response.prepare(self.request)
        writer = BudgetedWriter(self.request, response)
        deadline = time.monotonic() + self.settings.durable_sse_max_s
        announced = False
        try:
            while (left := deadline - time.monotonic()) > 0:
                found, moved, end = await self.batch(min(left, self.settings.heartbeat_s))
                if found:
                    await writer.write(data_event(found))
                if moved or end or (self.tail.up_to_date and not announced):
                    await writer.write(self.control())
                    announced = self.tail.up_to_date
                elif writer.idle_s() >= self.settings.heartbeat_s:
                    await writer.write(PING)
                if end:
                    break
            await response.write_eof()
        except TailEndedError as exc:
            log.info("durable sse %s ended: %s", self.tail.reader.stream_id, exc)
        except ConnectionError:
            pass  # the client left, or was dropped
        except REDIS_ERRORS as exc:  # headers are sent: end the body; the client reconnects
            log.warning("durable sse %s: storage error mid-response: %s", self.tail.reader.stream_id, exc)
        return response

    def control(self) -> bytes:
        """Return the ``control`` event for where the client is now."""
        return control_event(self.offset, cursor=self.cursor, up_to_date=self.tail.up_to_date, closed=self.closed)
