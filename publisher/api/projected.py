"""The response loop of a stream served in another protocol (``/ui``, ``/agui``): replay from seq 1, then live.

A translated protocol needs the stream from its first event (its translator's state is
built from the whole history), so a :class:`ProjectedSession` reads every stored event
from seq 1, hands them to a :class:`ProjectedWriter` that turns them into the protocol's
bytes, and then serves live events as the hub offers them, with ``: ping`` comments when
idle, as :class:`publisher.live.session.Session` does for ``/events``. It ends after
the writer saw the terminal event, at a gap in stored history (the writer's gap message
is sent: the stream was written again, or history no longer follows), or when the reader
is dropped (shutdown, overflow, write timeout).

Follows WHATWG HTML "9.2 Server-sent events".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Protocol

from aiohttp import web

from infra.redis_client import REDIS_ERRORS
from publisher.history.entries import Entry, Page
from publisher.live.reader import Reader
from publisher.live.reader_budget import ReaderBudget, Waiting, page_bytes, reset_on_close
from publisher.state import BUDGET, HUB, SETTINGS, STORE
from publisher.wire.sse import PING

log = logging.getLogger(__name__)

_DATA = b"\ndata: "


def entry_json(entry: Entry) -> bytes:
    """Return the event JSON inside an entry's ready SSE frame (``id``, ``event``, ``data`` lines)."""
    start = entry.frame.index(_DATA) + len(_DATA)
    return entry.frame[start:-2]


def entry_id(entry: Entry) -> bytes:
    """Return the SSE ``id`` of an entry's ready frame (``<seq>.<epoch>`` or ``<seq>``)."""
    return entry.frame[4:entry.frame.index(b"\n")] if entry.frame.startswith(b"id: ") else str(entry.seq).encode()


class ProjectedWriter(Protocol):
    """Turns stored entries into one protocol's bytes for one response."""

    @property
    def finished(self) -> bool:
        """True once the terminal event was written; the response then ends."""

    def frames(self, entries: list[Entry]) -> bytes:
        """Return the bytes these entries produce (in order; possibly empty)."""

    def gap_frame(self, *, reset: bool) -> bytes:
        """Return the message that tells the client stored history no longer follows."""

    def live(self) -> bytes:
        """Return what the replay held back (sent before the live tail), possibly empty."""


def drop(request: web.Request) -> None:
    """Abort the request's connection (the client reconnects)."""
    if request.transport is not None:
        request.transport.abort()


async def serve_projected(request: web.Request, reader: Reader, writer: ProjectedWriter, page: Page,
                          known_top: int, *, headers: Mapping[str, str], cacheable: bool = False) -> web.StreamResponse:
    """Send ``page`` and what follows it through ``writer``; return the finished response.

    Args:
        request: The request being answered (its transport is aborted on a write timeout).
        reader: The hub reader, joined, at cursor 0, its first page ``page`` checked.
        writer: The protocol's writer.
        page: The first page of stored history (from seq 1).
        known_top: The stream's stored top when the request began (a shorter history is a gap).
        headers: The response headers (status 200).
        cacheable: The response carries a finished stream's ``ETag`` (:mod:`publisher.api.caching`):
            one cut short by a storage error is aborted, not ended, so no cache keeps a partial body.
    """
    response = web.StreamResponse(status=200, headers=headers)
    await response.prepare(request)
    session = ProjectedSession(request, response, reader, writer, known_top)
    try:
        if not await session.replay(page):
            if held := writer.live():
                await session.write(held)
            await session.live()
        await response.write_eof()
    except ConnectionError:
        pass  # the client left or was dropped
    except REDIS_ERRORS as exc:  # headers are sent: end the body; the client reconnects
        log.warning("%s: storage error mid-response: %s", reader.stream_id, exc)
        if cacheable:
            drop(request)
    return response


class ProjectedSession:
    """Replay from seq 1, then the live tail, through one :class:`ProjectedWriter`."""

    def __init__(self, request: web.Request, response: web.StreamResponse, reader: Reader,
                 writer: ProjectedWriter, known_top: int) -> None:
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
        """Write what ``entries`` produce; return True once the terminal's output was written."""
        data = self.writer.frames(entries)
        if data:
            await self.write(data, page_bytes(entries))
        return self.writer.finished

    async def gap(self, *, reset: bool = False) -> None:
        """Tell the client that stored history no longer follows (``reset``: another generation)."""
        log.warning("%s: history gap after seq %d (reset: %s)", self.reader.stream_id, self.reader.cursor, reset)
        await self.write(self.writer.gap_frame(reset=reset))

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
            drop(self.request)
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
        drop(self.request)
