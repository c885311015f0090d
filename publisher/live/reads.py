"""The live reads of every topic of a process: one batched read, at most one per interval.

A topic needs a read of the stored stream when a notification could not be applied
straight away (:meth:`publisher.live.topic.Topic.notified`): a seq-only notification (a batch
past ``FANOUT_LIVE_MAX_NOTIFY_BYTES``, or a writer that sends only seqs), a seq it did
not expect (a lost or reordered message), a resubscription, or the audit's finding. With
one read per topic per notification, a process tailing many streams would spend a Redis
round trip per delivery, which is what the live channel exists to avoid. So every topic
that asked is read together:

- On a single node, one ``XREAD COUNT <page> STREAMS <events...> <0-fetched...>``
  returns a page after each topic's ``fetched`` (XREAD's ids are exclusive, as
  ``XRANGE (0-<fetched>`` is). A lone topic is read with ``XRANGE``.
- On a cluster, the streams of one read live in different slots, which a multi-key
  command cannot span: each is read with its own ``XRANGE``, concurrently.

Each page comes with its stream's meta ``epoch``, read right after it; a page of another
generation than the topic's closes its live readers with a ``history-reset`` gap
(:meth:`publisher.live.topic.Topic.check_generation`).

Reads are paced by a token bucket: one token per ``interval_s`` (``FANOUT_LIVE_READ_MS``),
at most :data:`BURST` saved, one spent per read, and only one read in flight. Under load
a read therefore serves every topic that asked since the last one, and the reads per
second stay at ``1 / interval_s`` however many streams are live; below that rate (one
busy stream, a notification every 10 ms) every read starts at once, its jitter absorbed by
the saved tokens. Follows the Redis pages of XREAD and XRANGE.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from redis.exceptions import ResponseError

from infra.storage import error_code
from publisher.history.entries import Page
from publisher.history.store import Store
from publisher.live.topic import Topic

log = logging.getLogger(__name__)

BATCH_MAX: Final = 256
"""Most topics in one read; the others are read right after it."""
BURST: Final = 3.0
"""Most read tokens saved while reads are rarer than one per interval."""
RETRY_S: Final = 0.5
"""Pause after a failed read before its topics are read again, seconds."""
HOLD_MAX_S: Final = 0.025
"""Longest :meth:`LiveReads.hold_s`, seconds: a notification that carries its events and
arrives while the subscriber connection rests for a read token waits at most this long."""


class LiveReads:
    """Batched reads for the topics that asked (:meth:`want`), in the order they asked.

    Args:
        store: The stream reads (:meth:`publisher.history.store.Store.read_many`).
        interval_s: One read per this many seconds on average, in bursts of at most
            :data:`BURST` (0: no pacing).
    """

    def __init__(self, store: Store, interval_s: float) -> None:
        self._store = store
        self._interval_s = interval_s
        self._wanted: dict[Topic, None] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._tokens, self._filled = BURST, time.monotonic()

    def start(self) -> asyncio.Task[None]:
        """Start the read loop; cancel the returned task to stop it."""
        self._task = asyncio.create_task(self._loop())
        return self._task

    def want(self, topic: Topic) -> None:
        """Queue ``topic`` for the next read (a topic queued twice is read once)."""
        self._wanted[topic] = None
        self._wake.set()

    def hold_s(self) -> float:
        """Return how long a read asked for from now on would wait for its token, seconds.

        The topics queued already take the next token; a notification that needs a read
        and arrives before the token after it cannot be served sooner, so the subscriber
        connection may rest this long (:class:`publisher.live.pubsub.PubSubLink` ``hold``) and
        hand those notifications over in one socket read instead of several. 0 while
        tokens are saved, and without pacing; at most :data:`HOLD_MAX_S`.
        """
        if self._interval_s <= 0:
            return 0.0
        tokens = min(BURST, self._tokens + (time.monotonic() - self._filled) / self._interval_s)
        if self._wanted:
            tokens -= 1
        return min(HOLD_MAX_S, max(0.0, (1 - tokens) * self._interval_s))

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._interval_s > 0:
                now = time.monotonic()
                self._tokens = min(BURST, self._tokens + (now - self._filled) / self._interval_s)
                self._filled = now
                if self._tokens < 1:
                    await asyncio.sleep((1 - self._tokens) * self._interval_s)
                    self._tokens, self._filled = 1.0, time.monotonic()
            batch = self._take()
            if not batch:
                continue
            self._tokens -= 1
            try:
                await self._read(batch)
            except Exception:  # a bug: log it, keep serving the other topics, retry these
                log.exception("live read of %d stream(s) failed", len(batch))
                for topic in batch:
                    topic.reading = False
                    topic.pending = True
                    self.want(topic)
                await asyncio.sleep(RETRY_S)

    def _take(self) -> list[Topic]:
        """Remove and return up to :data:`BATCH_MAX` queued topics that still owe a read to live readers."""
        batch: list[Topic] = []
        for topic in list(self._wanted):
            if len(batch) == BATCH_MAX:
                self._wake.set()
                break
            del self._wanted[topic]
            if topic.pending and topic.live and not topic.reading:
                batch.append(topic)
        return batch

    async def _read(self, batch: list[Topic]) -> None:
        starts = [topic.fetched for topic in batch]
        for topic in batch:
            topic.pending, topic.reading = False, True
        try:
            positions = [(topic.stream_id, start) for topic, start in zip(batch, starts, strict=True)]
            pages = await self._store.read_many(positions)
        finally:
            for topic in batch:
                topic.reading = False
        self._retry_failed([(topic, page) for topic, page in zip(batch, pages, strict=True)
                            if isinstance(page, BaseException) and not _history_gone(page)])
        for topic, start, page in zip(batch, starts, pages, strict=True):
            self._deliver(topic, start, page)

    def _retry_failed(self, failed: list[tuple[Topic, Page | BaseException]]) -> None:
        """Read the topics whose read failed again after :data:`RETRY_S` (one warning for them all)."""
        if not failed:
            return
        log.warning("live read of %d stream(s) failed (%s: %s); retrying in %ss",
                    len(failed), failed[0][0].stream_id, failed[0][1], RETRY_S)
        loop = asyncio.get_running_loop()
        for topic, _ in failed:
            topic.pending, topic.reading = True, True  # notifications wait in its backlog meanwhile
            loop.call_later(RETRY_S, self._retry, topic)

    def _deliver(self, topic: Topic, start: int, page: Page | BaseException) -> None:
        """Offer one topic the page read after ``start`` (a read that failed for good closes it with a gap)."""
        if isinstance(page, BaseException):
            if _history_gone(page):
                log.warning("stream %s: its events key holds another type (%s); closing its %d live reader(s)"
                            " with stream.gap", topic.stream_id, page, len(topic.live))
                topic.end_live("gap")
            return
        try:
            if topic.fetched != start:  # its live set emptied and restarted meanwhile
                topic.pending = True
            elif topic.check_generation(page.epoch if page else None):  # another one closes its readers
                topic.offer(page)
                if len(page) >= self._store.page:  # more stored after this page
                    topic.pending = True
            self._settle(topic)
        except Exception:  # a bug: this stream's readers reconnect and resume; the others go on
            log.exception("live delivery of stream %s failed", topic.stream_id)
            topic.end_live("shutdown")  # its readers reconnect and resume

    def _retry(self, topic: Topic) -> None:
        topic.reading = False
        self._settle(topic)

    def _settle(self, topic: Topic) -> None:
        """Apply what arrived during the topic's read; queue it again when it still owes one."""
        topic.after_read()
        if topic.pending and topic.live:
            self.want(topic)


def _history_gone(error: BaseException) -> bool:
    """Return True for a read refused because the events key now holds another type (its history is gone)."""
    return isinstance(error, ResponseError) and error_code(error) == "WRONGTYPE"
