"""The read-ahead of a history replay: the next page, read while the current one is written.

A response that replays history reads page n+1 while it writes page n, so a client that
keeps up never waits for Redis between pages. That page is held only while the write it
overlaps completes within the hold (``FANOUT_READ_AHEAD_HOLD_MS``): past it the read is let
go (cancelled while in flight, dropped once landed) and the response reads that page again
when the write is done. So a client that stopped reading holds the page being written, not
that page and the next; a client that keeps up gets today's pipelining (one read per page,
made during the write). A read shared with other responses (``Store.read_after(share=...)``)
is shielded there: letting go of it stops only this response's wait, the others get their
page. Imports no aiohttp.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from publisher.history.entries import Page
    from publisher.history.store import Store
    from publisher.telemetry import Telemetry


class ReadAhead:
    """At most one history page read ahead for one response.

    Args:
        store: Stored-entry reads.
        telemetry: Counts the read-aheads started (``read_ahead_started``), held
            (``read_ahead_pages``) and let go (``read_ahead_dropped``).
        hold_s: How long the write a read-ahead overlaps may take before the read-ahead
            is let go, seconds; 0: no read-ahead (each page is read after the write
            before it).
    """

    __slots__ = ("_hold_s", "_page", "_store", "_telemetry", "_timer")

    def __init__(self, store: Store, telemetry: Telemetry, hold_s: float) -> None:
        self._store = store
        self._telemetry = telemetry
        self._hold_s = hold_s
        self._page: asyncio.Future[Page] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self, stream_id: str, after_seq: int, count: int, share: object | None) -> None:
        """Start reading up to ``count`` entries after ``after_seq``, and the hold; call before the write.

        Args:
            stream_id: The stream.
            after_seq: The cursor once the page being written is handled.
            count: ``COUNT`` of the read (``FANOUT_READ_PAGE``).
            share: Key of a shared read (:meth:`publisher.live.hub.Hub.share_key`).

        Does nothing when ``hold_s`` is 0.
        """
        if self._hold_s <= 0:
            return
        page = asyncio.ensure_future(self._store.read_after(stream_id, after_seq, count, share=share))
        page.add_done_callback(_retrieve)
        self._page = page
        self._telemetry.read_ahead_started += 1
        self._telemetry.read_ahead_pages += 1
        self._timer = asyncio.get_running_loop().call_later(self._hold_s, self._hold_passed)

    def written(self) -> None:
        """End the hold: the write it covered completed or failed. The read-ahead stays (if not let go)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def take(self) -> asyncio.Future[Page] | None:
        """Return the read-ahead (in flight or done) and forget it.

        Returns:
            The read to await for the next page; ``None`` when there is none (none was
            started, or it was let go): the caller reads the page itself.
        """
        page, self._page = self._page, None
        if page is not None:
            self._telemetry.read_ahead_pages -= 1
        return page

    def holding(self) -> bool:
        """Return True while a page read ahead is held (in flight or landed, not yet taken or let go)."""
        return self._page is not None

    def let_go(self) -> bool:
        """Forget the read-ahead, cancelling it while in flight; return True when there was one.

        A done read's page goes with its future; a shared read in flight goes on for the
        other responses awaiting it (only this response's wait is cancelled).
        """
        self.written()
        page = self.take()
        if page is None:
            return False
        page.cancel()  # no-op once done
        return True

    def _hold_passed(self) -> None:
        """Let the read-ahead go, counted: the write it overlaps has not completed within the hold."""
        self._timer = None
        if self.let_go():
            self._telemetry.read_ahead_dropped += 1


def _retrieve(task: asyncio.Future[Page]) -> None:
    """Mark a read-ahead's failure as seen when it was never awaited (the response ended, or let it go)."""
    if not task.cancelled():
        task.exception()
