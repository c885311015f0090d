"""One SSE reader's live position and bounded queue, fed by the hub without ever waiting.

The hub calls :meth:`Reader.offer` for every entry it reads for a stream; the reader
keeps only the next seq after its cursor, so the hand-over from history replay to live
reading can neither skip nor repeat an entry, and a seq that jumps is a gap. A full queue
closes the reader (``overflow``) instead of slowing the hub or other readers: its client
resumes from Redis with ``Last-Event-ID``. No Redis, no aiohttp.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Literal

from publisher.store import Entry

CloseReason = Literal["overflow", "gap", "shutdown"]
"""Why a reader stopped: its queue overflowed, stored history skipped seqs, or shutdown."""


class Reader:
    """The live side of one SSE response.

    Args:
        stream_id: The stream read.
        cursor: Last seq the response has handled (``Last-Event-ID``, or 0); the next
            entry accepted is exactly ``cursor + 1``.
        limit: Most entries queued at once (``FANOUT_CLIENT_QUEUE``).
        on_overflow: Called once, synchronously, when the queue overflows; the
            response uses it to drop its connection even while blocked writing.
    """

    def __init__(
        self,
        stream_id: str,
        cursor: int,
        limit: int,
        on_overflow: Callable[[], None] | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.cursor = cursor
        self.limit = limit
        self.closed: CloseReason | None = None
        self.gap: tuple[int, int] | None = None
        """``(cursor, first seq found)`` when closed for a gap."""
        self._on_overflow = on_overflow
        self._queue: deque[Entry] = deque()
        self._wake = asyncio.Event()

    def offer(self, entry: Entry) -> None:
        """Take one entry read by the hub (never blocks).

        Entries at or below the cursor are ignored (already handled); ``cursor + 1`` is
        queued; anything higher closes the reader with ``gap``; a full queue closes it
        with ``overflow``.
        """
        if self.closed is not None or entry.seq <= self.cursor:
            return
        if entry.seq != self.cursor + 1:
            self.gap = (self.cursor, entry.seq)
            self.close("gap")
        elif len(self._queue) >= self.limit:
            self.close("overflow")
            if self._on_overflow is not None:
                self._on_overflow()
        else:
            self._queue.append(entry)
            self.cursor = entry.seq
            self._wake.set()

    def close(self, reason: CloseReason) -> None:
        """Stop the reader; the first reason wins. Queued entries survive only a ``gap``."""
        if self.closed is None:
            self.closed = reason
            self._wake.set()

    def take_queued(self) -> list[Entry]:
        """Return (and remove) every entry queued now, without waiting; empty once closed but for a gap."""
        if self.closed not in (None, "gap"):
            return []
        taken = list(self._queue)
        self._queue.clear()
        return taken

    def queued(self) -> int:
        """Return how many entries wait in the queue."""
        return len(self._queue)

    async def next(self, timeout_s: float) -> Entry | None:
        """Return the next queued entry, waiting at most ``timeout_s`` seconds.

        Returns:
            The entry, or ``None`` on timeout (send a heartbeat) or once the reader is
            closed and has nothing more to deliver (check :attr:`closed`).
        """
        while True:
            if self._queue and self.closed in (None, "gap"):
                return self._queue.popleft()
            if self.closed is not None:
                return None
            self._wake.clear()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._wake.wait()
            except TimeoutError:
                return None
