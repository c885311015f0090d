"""One SSE reader's live position, fed by the hub without ever waiting.

The hub calls :meth:`Reader.offer` for every entry of a stream; the reader keeps only
the next seq after its cursor, so the hand-over from history replay to live reading can
neither skip nor repeat an entry, and a seq that jumps is a gap. A reader that keeps up
has a *sink* (its response's direct write, :meth:`publisher.live.session.Session.deliver`):
the entry goes to its socket right there, in the hub's dispatch, with no task wake-up.
Only when the sink declines (the socket's buffer is full, a write is in progress, the
entry needs a history read) is the entry queued, and the response's task woken to write
it. A full queue closes the reader (``overflow``) instead of slowing the hub or other
readers: its client resumes from Redis with ``Last-Event-ID``. No Redis, no aiohttp.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

from publisher.history.entries import Entry

CloseReason = Literal["overflow", "gap", "shutdown", "end"]
"""Why a reader stopped: its queue overflowed, stored history skipped seqs (or was
replaced by another generation), shutdown, or its sink wrote the terminal event."""


def same_generation(held: bytes | None, found: bytes | None) -> bool:
    """Return whether entries found in generation ``found`` may follow what a reader holds of ``held``.

    Args:
        held: The epoch of what was delivered so far; ``None`` while nothing of a
            generation was (a reader at seq 0 of a stream not yet started).
        found: The epoch of what was read or heard; ``None`` when the source does not
            say (a notification of a worker older than contract 1.1).

    ``b""`` is a generation without a name (a stream started before contract 1.1): it
    matches only itself. Contract 1.1, "Generations".
    """
    return held is None or found is None or held == found

class Shared:
    """A batch of live entries encoded once for every reader of a topic (:meth:`publisher.live.topic.Topic.flush`).

    Args:
        entries: Consecutive entries, in seq order, non-empty.
    """

    __slots__ = ("chunk", "entries", "frames", "plain", "sampled", "sent")

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.sent = [entry for entry in entries if entry.frame]
        """The entries that have a frame (an invalid stored entry has none)."""
        self.frames = b"".join([entry.frame for entry in entries])
        """Their SSE messages, joined (invalid entries have none)."""
        self.chunk = b"%x\r\n%s\r\n" % (len(self.frames), self.frames) if self.frames else b""
        """The same as one HTTP/1.1 chunk (chunked transfer coding)."""
        self.plain = all(entry.block_kind != "reasoning" for entry in entries)
        """No entry is part of a reasoning block: every projection sees every entry."""
        self.sampled = False
        """The delivery latency of this batch was recorded (once, by its first write)."""


Sink = Callable[[list[Entry], "Shared | None"], bool]
"""Writes consecutive entries to the client now (one write) and returns True, or returns
False to have them queued. The second argument, when given, is the same entries
encoded once for all readers."""


class Reader:
    """The live side of one SSE response.

    Args:
        stream_id: The stream read.
        cursor: Last seq the response has handled (``Last-Event-ID``, or 0); the next
            entry accepted is exactly ``cursor + 1``.
        limit: Most entries queued at once (``FANOUT_CLIENT_QUEUE``).
        epoch: The generation the cursor belongs to (:func:`same_generation`); ``None``
            while the stream has none yet.
        on_overflow: Called once, synchronously, when the queue overflows; the
            response uses it to drop its connection even while blocked writing.
    """

    __slots__ = ("_on_overflow", "_queue", "_wake", "beat", "closed", "cursor", "epoch", "gap", "limit", "reset",
                 "sink", "stream_id")

    def __init__(
        self,
        stream_id: str,
        cursor: int,
        limit: int,
        on_overflow: Callable[[], None] | None = None,
        epoch: bytes | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.cursor = cursor
        self.limit = limit
        self.epoch = epoch
        """The generation of what this reader delivered (:func:`same_generation`)."""
        self.reset = False
        """Closed with ``gap`` because the stream now holds another generation (``history-reset``)."""
        self.closed: CloseReason | None = None
        self.gap: tuple[int, int | None] | None = None
        """``(cursor, first seq found or None)`` when closed for a gap."""
        self.sink: Sink | None = None
        """Direct write of a live response; ``None`` while it replays history."""
        self.beat: Callable[[float], None] | None = None
        """Heartbeat of a live response, called by the hub's shared timer with the monotonic time."""
        self._on_overflow = on_overflow
        self._queue: list[Entry] = []  # a list, not a deque: 56 bytes while empty, which is nearly always
        self._wake: asyncio.Future[None] | None = None

    def offer(self, entry: Entry) -> None:
        """Take one entry from the hub (never blocks); see :meth:`offer_batch`."""
        self.offer_batch([entry])

    def offer_batch(self, entries: list[Entry], shared: Shared | None = None) -> None:
        """Take consecutive entries from the hub (never blocks).

        Entries at or below the cursor are ignored (already handled); the rest must
        start at ``cursor + 1`` (else the reader closes with ``gap``) and go to the sink
        in one write, else to the queue; a full queue closes the reader with ``overflow``.
        ``shared`` (the same entries, encoded once for every reader) is passed on to the
        sink when the reader takes all of them.
        """
        if self.closed is not None:
            return
        skip = 0
        while skip < len(entries) and entries[skip].seq <= self.cursor:
            skip += 1
        batch = entries[skip:] if skip else entries
        if not batch:
            return
        if batch[0].seq != self.cursor + 1:
            self.fail_gap(batch[0].seq)
        elif not self._queue and self.sink is not None and self.sink(batch, None if skip else shared):
            self.cursor = batch[-1].seq
            if batch[-1].terminal:
                self.close("end")
        else:
            for entry in batch:
                if not self._enqueue(entry):
                    return

    def _enqueue(self, entry: Entry) -> bool:
        if len(self._queue) >= self.limit:
            self.close("overflow")
            if self._on_overflow is not None:
                self._on_overflow()
            return False
        self._queue.append(entry)
        self.cursor = entry.seq
        self._notify()
        return True

    def fail_gap(self, found_seq: int | None, *, reset: bool = False) -> None:
        """Close with ``gap``: stored history does not continue the cursor (``found_seq``: what came instead).

        ``reset``: the stream holds another generation than the reader's (``history-reset``).
        """
        if self.closed is None:
            self.gap = (self.cursor, found_seq)
            self.reset = reset
            self.close("gap")

    def adopt(self, page: list[Entry], epoch: bytes) -> bool:
        """Check that a page read in generation ``epoch`` continues this reader's; learn the epoch if unknown.

        Returns:
            False when it belongs to another generation (close with ``gap``, ``reset``).
            An empty page proves nothing and passes.
        """
        if not page:
            return True
        if self.epoch is None:
            self.epoch = epoch
        return self.epoch == epoch

    def close(self, reason: CloseReason) -> None:
        """Stop the reader; the first reason wins. Queued entries survive only a ``gap``."""
        if self.closed is None:
            self.closed = reason
            self._notify()

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

    def poke(self) -> None:
        """Wake the response's task (a heartbeat is due and the sink could not write it)."""
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def waiter(self) -> asyncio.Future[None] | None:
        """Return the future to await for the next entry, or ``None`` when one is queued or the reader is closed.

        The future completes when an entry is queued, the reader is closed or poked, as
        :meth:`wait` without a timeout; awaiting it directly keeps no coroutine frame of
        the reader's while idle. Then :meth:`take_queued` takes what came.
        """
        if self._queue or self.closed is not None:
            return None
        if self._wake is None or self._wake.done():
            self._wake = asyncio.get_running_loop().create_future()
        return self._wake

    async def wait(self, timeout_s: float | None = None) -> None:
        """Wait until an entry is queued, the reader is closed or poked, or ``timeout_s`` passes.

        Returns at once when entries are queued or the reader is closed. Creates one
        future per wait and no timer unless ``timeout_s`` is given.
        """
        if self._queue or self.closed is not None:
            return
        self._wake = asyncio.get_running_loop().create_future()
        try:
            if timeout_s is None:
                await self._wake
            else:
                await asyncio.wait_for(asyncio.shield(self._wake), timeout_s)
        except TimeoutError:
            return
        finally:
            self._wake = None

    async def next(self, timeout_s: float | None = None) -> Entry | None:
        """Return the next queued entry, waiting at most ``timeout_s`` seconds (``None``: until woken).

        Returns:
            The entry, or ``None`` on timeout, when poked (a heartbeat is due) or once
            the reader is closed and has nothing more to deliver (check :attr:`closed`).
        """
        if not self._queue and self.closed is None:
            await self.wait(timeout_s)
        if self._queue and self.closed in (None, "gap"):
            return self._queue.pop(0)
        return None
