"""One open SSE response: replay history after the exact position, then the live tail.

The cursor is always a concrete seq: the client's position at the start, afterwards the
last seq handled. History is read with ``XRANGE (0-<cursor> +`` page by page; every
entry must be ``cursor + 1`` (a jump is a gap: one ``stream.gap`` frame without an
``id:`` line, then the response ends, so the client's ``Last-Event-ID`` stays on a real
seq and its reconnect gets the 410). A short page that ends below the stored top
known at the request's start (meta ``last_seq``; appends move meta and entries together)
is a gap too: those entries were trimmed or expired. Otherwise, when a short page shows
the top was reached, the reader goes live (:meth:`publisher.live.hub.Hub.go_live`), and
entries then come through its bounded queue. While a full page is written the next one
is read (:class:`publisher.live.read_ahead.ReadAhead`), held only while that write completes
within ``FANOUT_READ_AHEAD_HOLD_MS``; past it that page is let go and read again after
the write, so a client that stopped reading holds one page, not two. The response ends
after the terminal event, at an idle heartbeat that finds the stream ended without one
(storage refused it), on a gap, on queue overflow, at shutdown, and when the client takes no
:data:`WRITE_SLICE_BYTES` within ``write_timeout_s`` (it stopped reading: its connection
is dropped, as on overflow).

Once live, the session gives its reader a sink (:meth:`Session.deliver`): an entry the
client may see is written to the socket right in the hub's dispatch, framed for the
response's transfer coding, when nothing else is being written and the socket's write
buffer holds at most :data:`DIRECT_BUFFER_BYTES`; otherwise it is queued and this task
writes it, with the write timeout.

The writes themselves (sliced, direct, under the memory budgets) are
:class:`publisher.live.writer.ResponseWriter`, which this class extends. Follows WHATWG
HTML "9.2 Server-sent events" for the wire format.
"""

from __future__ import annotations

import time

from publisher.history.entries import Entry, Page
from publisher.live.read_ahead import ReadAhead
from publisher.live.writer import DIRECT_BUFFER_BYTES, WRITE_SLICE_BYTES, ResponseWriter
from publisher.wire.sse import PING

__all__ = ["DIRECT_BUFFER_BYTES", "WRITE_SLICE_BYTES", "Session"]


class Session(ResponseWriter):
    """Writes one stream to one prepared SSE response: history replay, then the live tail.

    Takes the arguments of :class:`~publisher.live.writer.ResponseWriter` (keywords only).
    """

    __slots__ = ()

    async def run(self, first: list[Page], asked: int) -> None:
        """Serve the stream from the first page on.

        Once live, this one frame sends queued entries (heartbeats come from the hub's
        shared timer, :meth:`beat`); while idle it waits on the reader's future
        (:meth:`Reader.waiter`): no timer and no further frame of its own.

        Args:
            first: ``[page]``: the first history page, taken out of the list (so no
                frame keeps it); checked to start at cursor + 1.
            asked: The ``COUNT`` that page was read with: a shorter page reached the top.
        """
        if await self._replay(first.pop(), asked):
            return
        reader = self.reader
        reader.sink, reader.beat = self.deliver, self.beat
        try:
            while True:
                wake = reader.waiter()
                if wake is not None:
                    await wake
                entries = reader.take_queued()
                if entries:
                    if await self._send(entries, "live"):
                        return
                elif reader.closed == "gap":
                    after, found = reader.gap or (reader.cursor, None)
                    await self._gap(after, found, reset=reader.reset)
                    return
                elif reader.closed is not None:
                    return
                elif time.monotonic() - self.last_write >= self.heartbeat_s:  # poked: the socket was busy
                    await self._write(PING)
        finally:
            reader.sink = reader.beat = None

    async def _replay(self, page: Page, asked: int) -> bool:
        """Send history until the reader is live; return True when the response must end.

        While one full page is written, the next is already being read (one read ahead,
        let go when the write outlasts ``read_ahead_hold_s``, then read after it);
        every page after the first is ``store.page`` entries.
        """
        stale = False
        self.ahead = ahead = ReadAhead(self.store, self.telemetry, self.read_ahead_hold_s)
        try:
            while True:
                entries, gap_seq = self._continuing(page)
                full = len(page) >= asked
                asked = self.store.page
                if await self._write_page(ahead, entries, gap_seq, full=full, asked=asked):
                    return True
                if not full:
                    ended = await self._at_top(stale=stale, empty=not page)
                    if ended is not None:
                        return ended
                    stale = not page
                # after a refused go_live, read afresh: a shared read could predate what live readers got
                share = self.hub.share_key(self.reader) if full else None
                pending = ahead.take() or self.store.read_after(self.reader.stream_id, self.reader.cursor, asked,
                                                                share=share)
                del page, entries  # the page written is let go while the next one is read
                page = await pending
                if not self.reader.adopt(page, page.epoch):  # the stream was written again meanwhile
                    await self._gap(self.reader.cursor, None, reset=True)
                    return True
        finally:
            ahead.let_go()  # the response ends: a read-ahead still held is not awaited

    async def _write_page(self, ahead: ReadAhead, entries: list[Entry], gap_seq: int | None, *, full: bool,
                          asked: int) -> bool:
        """Write one history page's continuing entries (reading the next ahead); True: the response ends."""
        if gap_seq is None and full:
            ahead.start(self.reader.stream_id, self.reader.cursor, asked, self.hub.share_key(self.reader))
        try:
            if await self._send(entries, "replay"):
                return True
        finally:
            ahead.written()
        if gap_seq is not None:
            await self._gap(self.reader.cursor, gap_seq)
            return True
        return self.reader.closed is not None

    async def _at_top(self, *, stale: bool, empty: bool) -> bool | None:
        """After a short page: end on a gap (True), go live (False), or read again (None).

        ``stale``: the page before was empty too after a refused :meth:`Hub.go_live`;
        ``empty``: this page is.
        """
        if self.reader.cursor < self.known_top:  # stored before this request, gone now
            await self._gap(self.reader.cursor, None)
            return True
        if self.hub.go_live(self.reader):
            return False
        if stale and empty:  # live readers got entries that a later read cannot find
            await self._gap(self.reader.cursor, None)
            return True
        return None

    def _continuing(self, page: list[Entry]) -> tuple[list[Entry], int | None]:
        """Split off the entries that continue the cursor exactly (advancing it) from a gap's seq.

        Seqs of a page strictly increase, so one that starts at ``cursor + 1`` and spans
        exactly its length is whole without a look at each entry.
        """
        if page and page[0].seq == self.reader.cursor + 1 and page[-1].seq - page[0].seq + 1 == len(page):
            self.reader.cursor = page[-1].seq
            return page, None
        for position, entry in enumerate(page):
            if entry.seq != self.reader.cursor + 1:
                return page[:position], entry.seq
            self.reader.cursor = entry.seq
        return page, None
