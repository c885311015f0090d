"""The live audit: what a topic that heard nothing for a while learns from the stored top.

Every half heartbeat interval the hub audits its live topics that received no
notification for that long: one pipelined ``HMGET <meta> state epoch`` and
``XREVRANGE <events> <top of ours> - COUNT 1`` each, in that order
(:meth:`publisher.history.store.Store.tops`). A top above
``fetched`` is a lost notification: the topic reads. No events at all, or a top below
``fetched`` (Redis lost data), closes the topic's live readers with ``gap``, so each learns
within one heartbeat interval; so does a meta ``epoch`` other than the one the live readers
hold (the stream was written again as a new generation: ``history-reset``). A stream
marked ``done`` with no terminal event (storage
refused it: its top is not one) ends the readers that hold its top and have written
everything queued (a reader of a stream whose top is its terminal event ends by writing
it, also while that write waits for a slow client); so does
one marked ``done`` with no event of ours at all while nothing was sent (refused at its
first append), whose readers wait at position 0. A
topic that received entries while its top was being read is left for the next audit,
and one stream's failing keys skip only that stream. An audit not answered within its
interval (or within ``FANOUT_REDIS_TIMEOUT_S``, when that is longer) has failed; after two
failures in a row the live readers of the topics that heard nothing meanwhile are closed
(:func:`audit_loop`). Follows the Redis pages of XREVRANGE and HMGET.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from infra.redis_client import REDIS_ERRORS
from publisher.history.store import Store
from publisher.live.topic import Topic

log = logging.getLogger("publisher.live.hub")


async def audit_loop(store: Store, topics: Callable[[], list[Topic]], interval_s: float, bound_s: float, *,
                     running: Callable[[], bool]) -> None:
    """Audit ``topics()`` every ``interval_s`` seconds while ``running()``: the hub's audit task.

    Args:
        store: Reads of stored entries.
        topics: Returns the hub's topics now.
        interval_s: Half the heartbeat interval: the pause between audits, and how long a
            topic must have heard nothing to be audited.
        bound_s: Longest wait for one audit (the larger of ``interval_s`` and the client's
            ``FANOUT_REDIS_TIMEOUT_S``: a Redis that answers within it is slow, not frozen).
        running: False once the hub closes.
    """
    failing_since: float | None = None
    while running():
        await asyncio.sleep(interval_s)
        began = time.monotonic()
        try:
            # bounded by its interval: the client's timeout bounds each attempt, not its retries and
            # reconnects; but never below that timeout, within which a slow Redis still answers
            async with asyncio.timeout(bound_s):
                await audit(store, topics(), interval_s)
        except (*REDIS_ERRORS, TimeoutError) as exc:  # a cluster client raises RedisClusterException too
            log.warning("live audit failed: %s", str(exc) or f"no answer within {bound_s:g}s")
            if failing_since is None:
                failing_since = began
            else:
                _end_unheard(topics(), failing_since)
        else:
            failing_since = None


def _end_unheard(topics: list[Topic], since: float) -> None:
    """Close the live readers of every topic that heard nothing since ``since``, two audits having failed.

    Redis answers neither the audit nor (it seems) the subscription: a partition, a
    frozen server. Their responses end, so each client reconnects with ``Last-Event-ID``
    (to another publisher, or here once Redis answers) instead of getting only
    heartbeats while the stream may go on without them.
    """
    unheard = [topic for topic in topics if topic.live and topic.heard_s <= since]
    if unheard:
        log.warning("Redis has not answered two live audits: closing the live readers of %d stream(s) "
                    "that heard nothing meanwhile; they reconnect and resume", len(unheard))
    for topic in unheard:
        topic.end_live("shutdown")


async def audit(store: Store, topics: list[Topic], quiet_s: float) -> None:
    """Check the stored top of every live topic that heard nothing for ``quiet_s`` seconds.

    Raises:
        redis.exceptions.RedisError, redis.exceptions.RedisClusterException: The
            pipelined read failed as a whole (the caller logs it and audits again later).
    """
    quiet_since = time.monotonic() - quiet_s
    topics = [t for t in topics if t.live and t.heard_s <= quiet_since and not t.pending and not t.reading]
    if not topics:
        return
    sent = [t.fetched for t in topics]
    tops = await store.tops([t.stream_id for t in topics])
    for topic, fetched, found in zip(topics, sent, tops, strict=True):
        if not topic.live or topic.pending or topic.reading or topic.fetched != fetched:
            continue  # entries came meanwhile: the top read may predate them (the next audit looks again)
        if isinstance(found, RedisError):  # this stream's keys only (another type, say)
            log.warning("live audit of stream %s failed: %s", topic.stream_id, found)
            continue
        top, state, terminal, epoch = found
        if state is not None and not topic.check_generation(epoch or b""):  # another generation: readers closed
            continue
        if (top is None and (topic.fetched > 0 or state is None)) or (top is not None and top < topic.fetched):
            log.warning("stream %s: stored history gone under live readers (top %s, sent %s)",
                        topic.stream_id, top, topic.fetched)
            topic.end_live("gap")
        elif top is not None and top > topic.fetched:
            topic.kick()
        elif state == "done" and not terminal:  # top == fetched, or no event of ours and none sent (marked at once)
            _end_unterminated(topic, top or 0)


def _end_unterminated(topic: Topic, top: int) -> None:
    """End the readers of a stream that ended with no terminal event (storage refused it).

    The worker then marks meta ``state=done`` with the status instead
    (``worker.salvage``); a reader holding the top is closed, so its response ends and
    its reconnect gets the 204 while the status route shows the status.

    A reader with entries still queued is left alone: its cursor counts what was queued,
    not what its client got, and closing it would drop them (the stream's terminal event
    among them when a slow client holds it queued: that stream did end with one). It
    ends at its terminal event, or a later audit closes it once its queue is written.
    """
    done = [reader for reader in topic.live if reader.cursor >= top and not reader.queued()]
    if done:
        log.warning("stream %s ended at seq %s without a terminal event (storage refused it)", topic.stream_id, top)
    for reader in done:
        reader.close("end")
        topic.live.discard(reader)
