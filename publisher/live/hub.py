"""The fan-out hub: one Redis subscription per stream per process; live events need no read.

Readers of a stream share a :class:`~publisher.live.topic.Topic`. The first reader subscribes
the stream's live channel (``P:{id}:live``; payload: the appended events, or only the
last seq, :mod:`publisher.live.notification`); it is unsubscribed up to :data:`UNSUBSCRIBE_DELAY_S`
after the last one left. A reader joins *before* it reads history, and :meth:`Hub.join`
returns only once Redis has confirmed the subscription (a ``PING`` sent after
``SUBSCRIBE`` on the same connection comes back after it), so nothing appended between
the history read and the live tail is missed. After its history replay a reader calls
:meth:`Hub.go_live`; from then on a notification that carries its events is offered to
every live reader straight from the listener's dispatch, and everything else (a seq-only
notification, a gap, a resubscription) asks for one read after the topic's ``fetched``
for all of them; the reads of every topic that asked are made together
(:class:`publisher.live.reads.LiveReads`).

Heartbeats of live readers come from one timer of the hub (:data:`HEARTBEAT_TICKS` per
interval), not one per response. Every half heartbeat interval the topics that heard
nothing for that long are audited (:mod:`publisher.live.audit`): a lost notification is
read, lost history closes the topic's live readers with ``gap``, and when two audits in a
row fail (Redis frozen or cut off) the live readers of the topics that heard nothing
meanwhile are closed, so their clients reconnect and resume.

All SUBSCRIBE/UNSUBSCRIBE commands go through one queue, so they reach Redis in the
order readers came and went. Follows the Redis pages of SUBSCRIBE, PING and XRANGE.

Which pub/sub (:func:`infra.live_pubsub.live_mode`, the worker decides the same way):
``classic`` (a single node, a Redis 6.2 cluster) uses ONE connection to one node with
``SUBSCRIBE``; after it is lost it reconnects (to a node of the current topology)
and subscribes every topic again (:mod:`publisher.live.classic_link`). ``sharded`` (a Redis 7 cluster, where a classic
``PUBLISH`` would be broadcast to every node) subscribes each channel with ``SSUBSCRIBE``
at the primary owning its slot, one connection per such primary, following slot moves
and failovers (:mod:`publisher.live.shard_links`). Either way a subscription confirmed again
is a resubscription, which the topic repairs with one read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from redis.exceptions import RedisError

from publisher.history.store import Store
from publisher.live.audit import audit_loop
from publisher.live.classic_link import ClassicLink
from publisher.live.notification import parse_notification
from publisher.live.reader import Reader
from publisher.live.reads import LiveReads
from publisher.live.shard_links import ShardLinks
from publisher.live.topic import Topic
from schema.errors import InternalError

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster

    from infra.live_pubsub import LiveMode

log = logging.getLogger(__name__)

HEARTBEAT_TICKS = 4
"""Ticks of the shared heartbeat timer per heartbeat interval: an idle response gets its
``: ping`` between 1 and 1.25 intervals after its last write."""
UNSUBSCRIBE_DELAY_S = 0.5
"""Channels whose last reader left are unsubscribed together, this many seconds after the
first of them left (so each stays subscribed up to this long): they cost one
``UNSUBSCRIBE``, and a reader that comes back meanwhile (a browser reconnecting) finds
its subscription still in place."""
CLOSE_TIMEOUT_S = 2.0
"""Longest wait for the hub's tasks to stop at shutdown, seconds."""


class Hub:
    """Process-wide fan-out of stored events to readers.

    Args:
        redis: Classic mode: client whose pool gives the one pub/sub connection. Sharded
            mode: the cluster client whose slot map routes each channel.
        store: Reads of stored entries (shared with the handlers).
        channel_of: Live channel name of a stream id (``Keys.live``).
        subscribe_timeout_s: How long :meth:`join` waits for Redis to confirm.
        heartbeat_s: The heartbeat interval; topics silent for half of it are audited.
        live_batch_s: Pause after each read of the subscriber connection (``FANOUT_LIVE_BATCH_MS``).
        live_read_s: One batched live read per this many seconds on average (``FANOUT_LIVE_READ_MS``).
        redis_timeout_s: The client's wait for one command (``FANOUT_REDIS_TIMEOUT_S``): an
            audit fails only past the larger of this and its interval, so a Redis that answers
            within it (slow, not frozen) never counts as failing.
        reconnect: Returns a client of a node of the current topology
            (:func:`infra.redis_client.node_client`); after the subscriber connection fails,
            the hub reconnects to that node and subscribes every topic again (after a
            failover the old node may be gone for good). ``None``: retry the same node.
            Classic mode only.
        mode: ``classic`` or ``sharded`` (:func:`infra.live_pubsub.live_mode`).
    """

    def __init__(
        self,
        redis: aioredis.Redis | RedisCluster,
        store: Store,
        channel_of: Callable[[str], str],
        subscribe_timeout_s: float,
        *,
        heartbeat_s: float = 15.0,
        live_batch_s: float = 0.0,
        live_read_s: float = 0.0,
        redis_timeout_s: float = 0.0,
        reconnect: Callable[[], Awaitable[Any]] | None = None,
        mode: LiveMode = "classic",
    ) -> None:
        self._store = store
        self._reads = LiveReads(store, live_read_s)
        self._staged: list[Topic] = []
        self._asked = False
        """A notification of the current socket read asked for a stored-stream read."""
        self._carrying: set[Topic] = set()
        """Topics whose last notification carried its events (or that heard none yet): they need no
        read, so no hold."""
        self._channel_of = channel_of
        self._timeout_s = subscribe_timeout_s
        self._audit_s = heartbeat_s / 2
        self._audit_bound_s = max(self._audit_s, redis_timeout_s)
        self._beat_s = heartbeat_s / HEARTBEAT_TICKS
        self._topics: dict[str, Topic] = {}
        self._by_channel: dict[bytes, Topic] = {}
        self._leaving: set[bytes] = set()
        """Channels whose last reader left, unsubscribed after :data:`UNSUBSCRIBE_DELAY_S`."""
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self._subs: ClassicLink | ShardLinks = (
            ClassicLink(redis, held=self._topics.values, reconnect=reconnect, topic_of=self._by_channel.get,
                        on_message=self._notified, on_subscribed=self._subscribed, batch_s=live_batch_s,
                        on_read=self._flush_staged, hold=self._hold_s) if mode == "classic"
            else ShardLinks(cast("RedisCluster", redis), topic_of=self._by_channel.get, on_message=self._notified,
                            on_subscribed=self._subscribed, batch_s=live_batch_s, on_read=self._flush_staged,
                            hold=self._hold_s))

    async def start(self) -> None:
        """Start the pub/sub connection (sharded: read the slot map), the audit and the heartbeat timer."""
        await self._subs.start()
        audits = audit_loop(self._store, lambda: list(self._topics.values()), self._audit_s, self._audit_bound_s,
                            running=lambda: not self._closing)
        self._tasks = [asyncio.create_task(audits), asyncio.create_task(self._beat_loop()), self._reads.start()]

    async def close(self) -> None:
        """Stop every task and close the pub/sub connection (the wait is bounded by :data:`CLOSE_TIMEOUT_S`)."""
        self._closing = True
        for reader in self.readers():
            reader.close("shutdown")
        tasks = [*self._tasks, *self._subs.close()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)

    def readers(self) -> list[Reader]:
        """Return every joined reader (for shutdown)."""
        return [reader for topic in self._topics.values() for reader in topic.readers]

    def joined(self, reader: Reader) -> bool:
        """Return True while ``reader`` is registered (:meth:`join`, not yet :meth:`leave`)."""
        topic = self._topics.get(reader.stream_id)
        return topic is not None and reader in topic.readers

    def reader_count(self, stream_id: str) -> int:
        """Return how many readers of ``stream_id`` are joined."""
        topic = self._topics.get(stream_id)
        return len(topic.readers) if topic else 0

    def topic_count(self) -> int:
        """Return how many streams this process is subscribed to."""
        return len(self._topics)

    async def join(self, reader: Reader) -> None:
        """Register ``reader`` and wait until its stream's live channel is subscribed.

        The caller must call :meth:`leave` afterwards (``try``/``finally``), also when
        this raises. A plain pair instead of a context manager: an idle reader then holds
        no generator frame.

        Raises:
            InternalError: Redis did not confirm the subscription in time or failed; no
                response has started, so the caller answers 200 with a ``retry:`` hint.
        """
        topic = self._topics.get(reader.stream_id) or self._open(reader.stream_id)
        topic.readers.add(reader)
        try:
            async with asyncio.timeout(self._timeout_s):
                await asyncio.shield(topic.ready)
        except (TimeoutError, RedisError) as exc:
            raise InternalError("live subscription not confirmed by Redis") from exc

    def leave(self, reader: Reader) -> None:
        """Unregister a reader registered by :meth:`join`; the last one out unsubscribes."""
        topic = self._topics.get(reader.stream_id)
        if topic is not None and reader in topic.readers:
            self._leave(topic, reader)

    def share_key(self, reader: Reader) -> object | None:
        """Return the key under which ``reader``'s history reads may be shared (``Store.read_after``).

        It is the reader's live subscription (its topic): reads made after that
        subscription was confirmed are all covered by its notifications, so sharing one
        cannot hide an entry from the live tail. ``None`` before :meth:`join`.
        """
        return self._topics.get(reader.stream_id)

    def go_live(self, reader: Reader) -> bool:
        """Move a reader from history replay to the live tail, if it has caught up.

        Returns:
            True when the reader now receives entries through :meth:`Reader.offer`.
            False when the topic already offered entries past ``reader.cursor``: the
            caller must read history further and call again.
        """
        return self._topics[reader.stream_id].go_live(reader)

    def _open(self, stream_id: str) -> Topic:
        channel = self._channel_of(stream_id).encode()
        topic = Topic(stream_id, channel, self._reads.want)
        self._topics[stream_id], self._by_channel[channel] = topic, topic
        self._carrying.add(topic)  # until its first notification shows otherwise (workers send events)
        self._queue("sub", channel)
        return topic

    def _leave(self, topic: Topic, reader: Reader) -> None:
        topic.readers.discard(reader)
        topic.live.discard(reader)
        if topic.readers or self._topics.get(topic.stream_id) is not topic:
            return
        del self._topics[topic.stream_id]
        del self._by_channel[topic.channel]
        self._carrying.discard(topic)
        if not self._leaving:
            asyncio.get_running_loop().call_later(UNSUBSCRIBE_DELAY_S, self._unsubscribe_left)
        self._leaving.add(topic.channel)

    def _unsubscribe_left(self) -> None:
        """Unsubscribe, in one command, the channels left for :data:`UNSUBSCRIBE_DELAY_S` and not joined again."""
        leaving, self._leaving = self._leaving, set()
        for channel in sorted(leaving):
            if channel not in self._by_channel and not self._closing:
                self._queue("unsub", channel)

    def _queue(self, op: str, channel: bytes) -> None:
        """Queue one (un)subscription; everything queued in one loop turn is sent together."""
        self._subs.queue(op, channel)

    def _flush_staged(self) -> None:
        """After one read of the subscriber connection: fan out what it staged, one write per reader."""
        staged, self._staged = self._staged, []
        for topic in staged:
            topic.flush()

    def _notified(self, channel: bytes, payload: bytes) -> None:
        """Apply one live notification (either pub/sub); stage its topic when its events were accepted."""
        topic = self._by_channel.get(channel)
        if topic is None:
            return
        note = parse_notification(payload)
        if note is not None and note.events is not None:
            self._carrying.add(topic)
        else:
            self._carrying.discard(topic)
        outcome = topic.notified(note)
        if outcome == "delivered":
            self._staged.append(topic)
        elif outcome == "read":
            self._asked = True

    def _hold_s(self) -> float:
        """After one socket read: how much longer its connection may rest (``PubSubLink`` ``hold``).

        Only a read whose notifications asked for a stored-stream read rests until that
        read's token (:meth:`LiveReads.hold_s`), and only while no live topic's
        notifications carry their events (a rest would delay those, which need no read)
        and no subscription awaits its confirmation (a joining reader would wait).
        """
        asked, self._asked = self._asked, False
        if not asked or self._carrying or self._subs.confirming():
            return 0.0
        return self._reads.hold_s()

    def _subscribed(self, channel: bytes) -> None:
        topic = self._by_channel.get(channel)
        if topic is not None:
            topic.resubscribed()

    async def _beat_loop(self) -> None:
        """Offer every live reader a heartbeat each tick: the one heartbeat timer of the process."""
        while not self._closing:
            await asyncio.sleep(self._beat_s)
            now = time.monotonic()
            for topic in list(self._topics.values()):
                for reader in list(topic.live):
                    if reader.beat is not None:
                        reader.beat(now)
