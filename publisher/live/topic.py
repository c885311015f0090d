"""One stream's readers and its live read position: where notifications become deliveries.

A :class:`Topic` holds the readers of one stream, the live ones among them, and
``fetched``, the last seq offered to every live reader. A notification that carries its
events and continues ``fetched`` exactly is offered right away (:meth:`Topic.notified`
returns ``"delivered"``: no Redis read). Anything else asks for a read after ``fetched``
(:class:`publisher.live.reads.LiveReads`, which reads many topics at once): a seq-only
notification, a seq it did not expect (a lost or reordered message), or a
resubscription. While that read is in flight, notifications that carry events wait in a
small backlog and are applied after it, so ordering stays exactly that of the stored
stream.

Generations (contract 1.1): the topic holds the epoch of what its live readers were
given (:attr:`Topic.epoch`). A notification, a read or an audit that finds another one
means the stream was written again from seq 1 (Redis restored from an older snapshot
re-ran the job): the live readers are closed with a ``stream.gap`` (``history-reset``),
never handed the new generation's seqs as if they continued the old one. No Redis, no aiohttp.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final, Literal

from publisher.history.entries import Entry, entry_of
from publisher.history.pages import value_entries
from publisher.live.notification import Notification
from publisher.live.reader import CloseReason, Reader, Shared, same_generation

log = logging.getLogger("publisher.live.hub")

BACKLOG_MAX: Final = 64
"""Notifications kept while a repair read is in flight; past it they are dropped (the
topic reads again, so nothing is lost)."""
UNKNOWN_TOP: Final = 1 << 62
"""``seen`` after a resubscription: notifications may have been lost, read before trusting."""

Outcome = Literal["ignored", "delivered", "read"]


class Topic:
    """Readers of one stream and the shared live read position.

    Args:
        stream_id: The stream.
        channel: Its live channel name, as bytes (what pub/sub messages carry).
        want_read: Called with the topic each time it asks for a read after ``fetched``.
    """

    def __init__(self, stream_id: str, channel: bytes, want_read: Callable[[Topic], None]) -> None:
        self.stream_id = stream_id
        self.channel = channel
        self.readers: set[Reader] = set()
        self.live: set[Reader] = set()
        self.fetched = 0
        """Last seq offered to the live readers; every live reader's cursor is >= it."""
        self.seen = 0
        """Highest last seq any notification announced since the subscription (or
        :data:`UNKNOWN_TOP` after a resubscription)."""
        self.subscribed = False
        """The first subscribe confirmation arrived; any later one is a resubscription."""
        self.pending = False
        """A read is owed: a notification could not be applied directly."""
        self.reading = False
        """A read after ``fetched`` is in flight (or waits to be retried)."""
        self.backlog: list[Notification] = []
        self.staged: list[Entry] = []
        """Entries accepted from notifications of the current read, offered by :meth:`flush`."""
        self.heard_s = time.monotonic()
        """Monotonic time of the last notification (for the idle-topic audit)."""
        self.epoch: bytes | None = None
        """The generation of what the live readers were given; ``None`` until one is known."""
        self._want_read = want_read
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ready.add_done_callback(_consume)

    def kick(self) -> None:
        """Ask for a read after ``fetched``."""
        self.pending = True
        self._want_read(self)

    def go_live(self, reader: Reader) -> bool:
        """Add a reader that replayed history to ``cursor``; False when it must read further.

        A reader whose generation is not the live readers' is closed with a ``history-reset``
        gap instead (True), and the topic reads to learn which of the two is stale.
        """
        if self.live and not same_generation(self.epoch, reader.epoch):
            reader.fail_gap(None, reset=True)
            self.kick()
            return True
        if self.live and reader.cursor < self.fetched:
            return False
        if not self.live:
            self.epoch = reader.epoch
            self.fetched = reader.cursor
            self.backlog.clear()
            self.staged.clear()
            self.pending = False  # a read owed after the old live set's position is not owed after this one
            if self.seen > reader.cursor:  # announced, maybe after this reader's last read
                self.kick()
        elif self.epoch is None:
            self.epoch = reader.epoch
        self.live.add(reader)
        return True

    def end_live(self, reason: CloseReason, *, reset: bool = False) -> None:
        """Close every live reader (``gap``: each sends ``stream.gap``, then its response ends); no read is owed.

        ``reset``: the gap is another generation (``history-reset``).
        """
        for reader in list(self.live):
            if reason == "gap":
                reader.fail_gap(None, reset=reset)
            else:
                reader.close(reason)
        self.live.clear()
        self.pending = False

    def check_generation(self, found: bytes | None, *, proven: bool = True) -> bool:
        """Take the epoch a notification, read or audit found; False (live readers closed) when it is another.

        Args:
            found: The epoch found (``None``: the source does not say).
            proven: ``found`` comes with entries of the stream (or from meta): an unknown
                topic epoch learns it. A seq-only notification of an unknown topic
                proves nothing about its live readers' entries and is only compared.
        """
        if same_generation(self.epoch, found):
            if self.epoch is None and proven and found:  # b"" (no epoch: an old writer's stream) names none
                self.epoch = found
            return True
        log.warning("stream %s: stored history is another generation (epoch %r, live readers hold %r)",
                    self.stream_id, found, self.epoch)
        self.end_live("gap", reset=True)
        return False

    def resubscribed(self) -> None:
        """Handle a subscribe confirmation; after the first, notifications may have been lost."""
        if not self.subscribed:
            self.subscribed = True
            return
        self.seen = UNKNOWN_TOP
        if self.live:
            self.kick()

    def notified(self, note: Notification | None) -> Outcome:
        """Apply one notification (``None``: unparseable, so read).

        Returns:
            ``delivered`` when its events were staged (the caller calls :meth:`flush`
            once its read is handled), ``read`` when a read was asked for (or the events
            wait for its read), ``ignored`` when nothing is new.
        """
        self.heard_s = time.monotonic()
        top = note.last_seq if note is not None else UNKNOWN_TOP
        self.seen = max(self.seen, top)
        if not self.live:
            return "ignored"
        if note is not None and not self.check_generation(note.epoch, proven=note.events is not None):
            return "ignored"
        if top <= self.fetched:
            return "ignored"
        if self.reading or self.pending:
            if note is not None and note.events is not None and len(self.backlog) < BACKLOG_MAX:
                self.backlog.append(note)
            else:
                self.kick()
            return "read"
        if note is not None and note.events is not None and note.first_seq <= self.fetched + 1:
            self.stage(self._entries(note))
            return "delivered"
        self.kick()
        return "read"

    def after_read(self) -> None:
        """Apply the notifications that arrived during a read, in order; read again on a gap."""
        backlog, self.backlog = self.backlog, []
        for note in backlog:
            if note.last_seq <= self.fetched:
                continue
            if self.pending or note.first_seq > self.fetched + 1:
                self.kick()
                return
            self.offer(self._entries(note))

    def stage(self, entries: list[Entry]) -> None:
        """Accept entries (seq order, continuing ``fetched``) for the next :meth:`flush`."""
        if entries:
            self.staged.extend(entries)
            self.fetched = entries[-1].seq

    def flush(self) -> None:
        """Offer the staged entries to every live reader at once (one write each); drop closed readers.

        Entries after a terminal one (no worker of ours stores any) are not offered.
        """
        if not self.staged:
            return
        entries, self.staged = self.staged, []
        end = next((index for index, entry in enumerate(entries) if entry.terminal), len(entries) - 1)
        if end < len(entries) - 1:  # nothing after a terminal is served, as in replay (a foreign writer's)
            entries = entries[:end + 1]
        live = list(self.live)
        shared = Shared(entries)  # encoded once: a reader that keeps up gets these very bytes
        for reader in live:
            reader.offer_batch(entries, shared)
        if any(reader.closed is not None for reader in live):
            self.live = {reader for reader in live if reader.closed is None}

    def offer(self, entries: list[Entry]) -> None:
        """Stage entries and flush now (after any staged before them)."""
        self.stage(entries)
        self.flush()

    def _entries(self, note: Notification) -> list[Entry]:
        assert note.events is not None
        skip = max(0, self.fetched + 1 - note.first_seq)
        first, epoch = note.first_seq + skip, self.epoch or b""
        if note.compact:
            return [entry for index, raw in enumerate(note.events[skip:])
                    for entry in value_entries(self.stream_id, first + index, raw, epoch)]
        return [entry_of(first + index, raw, epoch) for index, raw in enumerate(note.events[skip:])]


def _consume(future: asyncio.Future[None]) -> None:
    """Mark a failed subscription as seen even when no reader waited for it."""
    if not future.cancelled():
        future.exception()
