"""Writing to one open SSE response: sliced under a write timeout, or directly from the hub's dispatch.

:class:`ResponseWriter` holds what a response's writes need (the response and its socket,
the reader and its projection, the memory budgets) and writes: history pages and queued
entries slice by slice (:data:`WRITE_SLICE_BYTES`, each within ``write_timeout_s``, or the
client that stopped reading is dropped); live entries and heartbeats straight to the
socket when nothing else is being written and its buffer holds at most
:data:`DIRECT_BUFFER_BYTES` (:meth:`ResponseWriter.deliver`, the reader's sink); the
``stream.gap`` frame. What to send when (history replay, then the live tail) is
:class:`publisher.live.session.Session`, its subclass.

Follows WHATWG HTML "9.2 Server-sent events" for the wire format.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final

import msgspec
from aiohttp import web

from publisher.history.entries import Entry, Page
from publisher.history.store import Store
from publisher.history.visibility import Projection
from publisher.live.hub import Hub
from publisher.live.read_ahead import ReadAhead
from publisher.live.reader import Reader, Shared
from publisher.live.reader_budget import ENTRY_BYTES, ReaderBudget, Waiting, reset_on_close
from publisher.telemetry import Telemetry
from publisher.wire.sse import GAP_EVENT, PING, error_frame, gap_data
from schema.contract import TERMINAL_TYPES

log = logging.getLogger("publisher.live.session")  # the lines keep the logger they had

WRITE_SLICE_BYTES: Final = 64 * 1024
"""Bytes written per step of a large write; the client must take each within ``write_timeout_s``."""
DIRECT_BUFFER_BYTES: Final = 64 * 1024
"""Most bytes a socket's write buffer may hold for the hub to write to it directly; past
it entries are queued and written by the response's task, which waits for the client."""


class ResponseWriter:
    """The writes of one prepared SSE response (module docstring); :class:`Session` adds what to write when.

    Args:
        response: The prepared ``text/event-stream`` response.
        reader: The reader, already joined to the hub, cursor at the client's position.
        projection: What this reader may see.
        store: Stored-entry reads.
        hub: The fan-out hub.
        telemetry: Instruments.
        heartbeat_s: Idle time before a ``: ping`` comment, seconds.
        known_top: The stored top seq read before the first page (``StreamInfo.last_seq``).
        write_timeout_s: Longest wait for the client to take one slice of a write, seconds.
        read_ahead_hold_s: Longest a history page's write may take while the next page,
            read ahead, is held; past it that page is let go and read after the write,
            seconds (0: no read-ahead).
        on_stall: Drops the connection of a client that stopped reading.
        transport: The response's socket, for direct writes (``None``: never direct).
        chunked: The response uses chunked transfer coding (HTTP/1.1), so direct writes
            are framed as chunks.
        budget: Memory budgets of readers waiting on their clients (``None``: none); a
            reader past one is dropped with ``on_stall``.
    """

    __slots__ = ("ahead", "budget", "chunked", "heartbeat_s", "hub", "known_top", "last_write", "on_stall",
                 "projection", "read_ahead_hold_s", "reader", "response", "store", "telemetry", "transport",
                 "write_timeout_s", "writing")

    def __init__(
        self,
        *,
        response: web.StreamResponse,
        reader: Reader,
        projection: Projection,
        store: Store,
        hub: Hub,
        telemetry: Telemetry,
        heartbeat_s: float,
        known_top: int,
        write_timeout_s: float,
        read_ahead_hold_s: float,
        on_stall: Callable[[], None],
        transport: asyncio.Transport | None = None,
        chunked: bool = False,
        budget: ReaderBudget | None = None,
    ) -> None:
        self.response = response
        self.reader = reader
        self.projection = projection
        self.store = store
        self.hub = hub
        self.telemetry = telemetry
        self.heartbeat_s = heartbeat_s
        self.known_top = known_top
        self.write_timeout_s = write_timeout_s
        self.read_ahead_hold_s = read_ahead_hold_s
        self.on_stall = on_stall
        self.last_write = time.monotonic()
        self.transport = transport
        self.chunked = chunked
        self.writing = False
        self.budget = budget
        self.ahead: ReadAhead | None = None

    def beat(self, now_s: float) -> None:
        """Send ``: ping`` when nothing was written for ``heartbeat_s``: directly, or by waking this task.

        Args:
            now_s: ``time.monotonic()`` of the hub's timer tick.
        """
        if now_s - self.last_write < self.heartbeat_s:
            return
        if self._writable():
            self._write_now(PING)
        else:
            self.reader.poke()  # the task writes it, with the write timeout (a stalled client is dropped)

    def _writable(self) -> bool:
        transport = self.transport
        return not (self.writing or transport is None or transport.is_closing()
                    or transport.get_write_buffer_size() > DIRECT_BUFFER_BYTES)

    def _write_now(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)
        self.last_write = time.monotonic()

    def deliver(self, entries: list[Entry], shared: Shared | None = None) -> bool:
        """Write consecutive live entries to the socket now, in one write, if that cannot block (the sink).

        Args:
            entries: The entries, continuing this reader's cursor.
            shared: The same entries encoded once for every reader of the topic; when
                none of them is part of a reasoning block (so every projection sees them
                all), its bytes are written as they are.

        Returns:
            True when the entries are handled (written, or hidden by the projection);
            False when they must be queued: a write is in progress, the socket buffer is
            over :data:`DIRECT_BUFFER_BYTES`, or the projection needs a history read first.
        """
        if not self._writable():
            return False
        if shared is not None and shared.plain:
            if shared.sent:
                assert self.transport is not None
                self.transport.write(shared.chunk if self.chunked else shared.frames)
                self.last_write = time.monotonic()
                self.telemetry.record_write(shared.sent, "live", sample=not shared.sampled)
                shared.sampled = True
            return True
        if any(self.projection.needs_history(entry) for entry in entries):
            return False
        sent = [entry for entry in entries if entry.frame and self.projection.visible(entry)]
        if sent:
            self._write_now(sent[0].frame if len(sent) == 1 else b"".join([entry.frame for entry in sent]))
            self.telemetry.record_write(sent, "live")
        return True

    async def _send(self, entries: list[Entry], phase: str) -> bool:
        """Write the entries this reader may see in one write; return True when one ends the stream."""
        sent: list[Entry] = []
        if self.projection.public:
            for entry in entries:
                if self.projection.needs_history(entry):
                    assert entry.block_index is not None
                    found = await self.store.find_block_start(self.reader.stream_id, entry.seq, entry.block_index)
                    self.projection.learn_start(entry.block_index, found)
                if entry.frame and self.projection.visible(entry):
                    sent.append(entry)
                if entry.terminal:
                    break
        elif entries and isinstance(entries, Page) and (frames := entries.frames()) is not None:
            await self._write(frames, len(entries))  # a whole page, as other readers send it: one shared bytes
            self.telemetry.record_write(entries, phase)
            return entries[-1].terminal
        else:  # the internal projection sees every entry: only invalid ones and what follows a terminal are left out
            end = next((index for index, entry in enumerate(entries) if entry.type in TERMINAL_TYPES), None)
            sent = [entry for entry in (entries if end is None else entries[:end + 1]) if entry.frame]
        if sent:
            await self._write(b"".join([entry.frame for entry in sent]), len(entries))
            self.telemetry.record_write(sent, phase)
        return bool(sent) and sent[-1].terminal

    async def _gap(self, after_seq: int, found_seq: int | None, *, reset: bool = False) -> None:
        """Send the documented ``stream.gap`` error frame (no ``id:``); the response then ends.

        ``reset``: the stream now holds another generation (contract 1.1): the frame says so
        (``reason: history-reset``), and the reconnect gets the ``410 history-reset``.
        """
        log.warning("stream %s: history gap after seq %s (next: %s, reset: %s)", self.reader.stream_id, after_seq,
                    found_seq, reset)
        data = msgspec.json.encode(gap_data(self.reader.stream_id, after_seq, found_seq, reset=reset))
        self.telemetry.gaps.add(1)
        await self._write(error_frame(GAP_EVENT, data))

    async def _write(self, frame: bytes, count: int = 0) -> None:
        """Write ``frame`` slice by slice; drop the connection when a slice waits too long.

        While a slice waits for the client, what the response holds is registered with the
        memory budgets (:meth:`_waiting`), which may drop the connection sooner.

        Args:
            frame: The bytes to write.
            count: How many stored entries ``frame`` holds (their memory is held with it).

        Raises:
            ConnectionResetError: The client took no slice within ``write_timeout_s``, or
                the connection was dropped over a memory budget.
        """
        view = memoryview(frame)
        self.writing = True
        try:
            for start in range(0, len(view), WRITE_SLICE_BYTES):
                waiting = self._waiting(frame, count)
                try:
                    async with asyncio.timeout(self.write_timeout_s):
                        await self.response.write(view[start:start + WRITE_SLICE_BYTES])
                except TimeoutError:
                    log.info("stream %s: client stopped reading; connection dropped", self.reader.stream_id)
                    self.on_stall()
                    raise ConnectionResetError("the client stopped reading") from None
                finally:
                    if waiting is not None and self.budget is not None:
                        self.budget.end(waiting)
        finally:
            self.writing = False
        self.last_write = time.monotonic()

    def _waiting(self, frame: bytes, count: int) -> Waiting | None:
        """Register a slice of ``frame`` with the budgets (its page shared; read-ahead, queue, buffer own)."""
        if self.budget is None:
            return None
        held = 2 * len(frame) + ENTRY_BYTES * count  # the entries' frames, joined once more
        own = self.transport.get_write_buffer_size() if self.transport is not None else 0
        own += held if self.ahead is not None and self.ahead.holding() else 0
        own += self.reader.queued() * ENTRY_BYTES
        return self.budget.begin(self._reset, frame, held, own)

    def _reset(self) -> None:
        """Drop the connection of a reader past a memory budget, with a reset (nothing left in the kernel)."""
        reset_on_close(self.transport)
        self.on_stall()

