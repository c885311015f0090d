"""One primary's subscriber connection in sharded pub/sub, and what Redis told it about its channels.

:class:`publisher.live.shard_links.ShardLinks` opens one :class:`Shard` per primary that owns
subscribed channels; a shard holds that :class:`PubSubLink`, the channels routed to it,
those Redis confirmed (``ssubscribe`` minus ``sunsubscribe`` pushes), the ``SUNSUBSCRIBE``
still unanswered, and the ``PING`` barriers that confirm its subscriptions. Routing and
healing stay in :mod:`publisher.live.shard_links`. Follows the Redis pages "Pub/Sub"
(sharded Pub/Sub), SSUBSCRIBE, SUNSUBSCRIBE and PING.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

import hiredis
from redis.asyncio.cluster import ClusterNode
from redis.exceptions import RedisError

from publisher.live.pubsub import Endpoint, PubSubLink
from publisher.live.topic import Topic

log = logging.getLogger("publisher.live.shard_links")  # the lines keep the logger they had


def node_endpoint(node: ClusterNode) -> Endpoint:
    """Return the :class:`Endpoint` of a cluster node (its host, port and the client's credentials and name)."""
    kwargs = node.connection_kwargs
    return Endpoint(host=node.host, port=int(node.port), username=kwargs.get("username"),
                    password=kwargs.get("password"), tls="SSL" in node.connection_class.__name__,
                    client_name=kwargs.get("client_name"))


REFUSED_LOG_S: Final = 60.0
"""While a node keeps refusing subscriptions (``NOPERM``), one warning per this many seconds per node."""


class Shard:
    """One primary's subscriber connection and the channels routed to it.

    Args:
        node: The primary (its endpoint; the client's credentials and name).
        on_push: Called with ``(this shard, reply)`` for each reply of the connection.
        batch_s: The read pause (:class:`PubSubLink` ``batch_s``).
        on_read: Called after the pushes of one socket read.
        hold: The extra rest after a read (:class:`PubSubLink` ``hold``).
    """

    def __init__(self, node: ClusterNode, on_push: Callable[[Shard, Any], None], batch_s: float,
                 on_read: Callable[[], None], hold: Callable[[], float]) -> None:
        self.name = node.name
        self.link = PubSubLink(node_endpoint(node), lambda reply: on_push(self, reply), lambda exc: self.lost.set(),
                               batch_s, on_read, hold=hold)
        self.channels: set[bytes] = set()
        """Channels routed here (subscribed, or to be)."""
        self.subscribed: set[bytes] = set()
        """Channels Redis confirmed on this connection (``ssubscribe`` minus ``sunsubscribe`` pushes)."""
        self.unsubs: collections.Counter[bytes] = collections.Counter()
        """``SUNSUBSCRIBE`` sent and not answered yet, per channel (their pushes are expected)."""
        self.dropped: dict[bytes, int] = {}
        """Channels this node dropped on its own, and how many heals since found it still named owner."""
        self.barriers: dict[bytes, list[tuple[bytes, asyncio.Future[None]]]] = {}
        self.pending: list[tuple[str, bytes]] = []
        self.lost = asyncio.Event()
        self.retired = False
        self.task: asyncio.Task[None] | None = None
        self.heal: asyncio.Task[None] | None = None
        self.healed_s = 0.0
        self.refused: hiredis.ReplyError | None = None
        """A ``NOPERM`` since the last ``PING`` reply: that barrier fails what it did not confirm."""
        self.refused_logged_s = float("-inf")

    def reset(self) -> None:
        """Forget the state of a previous connection."""
        self.dropped.clear()
        self.lost.clear()
        self.pending.clear()
        self.subscribed.clear()
        self.unsubs.clear()
        self.barriers.clear()
        self.refused = None

    def subscribe(self, by_slot: list[list[bytes]], topic_of: Callable[[bytes], Topic | None]) -> None:
        """``SSUBSCRIBE`` each run of one slot's channels, then one ``PING`` whose reply confirms them all."""
        barrier = []
        for run in by_slot:
            self.link.send("SSUBSCRIBE", *run)
            for channel in run:
                topic = topic_of(channel)
                if topic is not None and not topic.ready.done():
                    barrier.append((channel, topic.ready))
        token = uuid.uuid4().hex.encode()
        self.barriers[token] = barrier
        self.link.send("PING", token)

    def unsubscribe(self, by_slot: list[list[bytes]]) -> None:
        """``SUNSUBSCRIBE`` each run of one slot's channels (their pushes are then expected)."""
        for run in by_slot:
            self.unsubs.update(run)
            self.link.send("SUNSUBSCRIBE", *run)

    def fail(self, topic_of: Callable[[bytes], Topic | None], exc: RedisError) -> None:
        """Fail the link's unconfirmed subscriptions: their confirmation may never come (those readers retry)."""
        self.barriers.clear()
        for channel in self.channels:
            topic = topic_of(channel)
            if topic is not None and not topic.ready.done():
                topic.ready.set_exception(exc)

    def refuse(self, reply: hiredis.ReplyError) -> None:
        """Note a ``NOPERM`` (the next barrier fails what it did not confirm); warn once per :data:`REFUSED_LOG_S`."""
        self.refused = reply
        now = time.monotonic()
        if now - self.refused_logged_s >= REFUSED_LOG_S:
            self.refused_logged_s = now
            log.warning("sharded pub/sub: %s refused an SSUBSCRIBE (%s); its readers are told to retry",
                        self.name, reply)

    def unsubscribed(self, channel: bytes) -> bool:
        """Apply an ``sunsubscribe`` push; return True when it answers our own ``SUNSUBSCRIBE``."""
        self.subscribed.discard(channel)
        if self.unsubs[channel] > 0:
            self.unsubs[channel] -= 1
            return True
        return False

    def confirm(self, token: bytes) -> None:
        """Confirm the subscriptions sent before ``PING <token>`` that Redis accepted.

        The others heal (a slot moved meanwhile), unless Redis refused them (``NOPERM``):
        those fail at once, so their readers get the ``retry:`` answer now instead of after
        ``FANOUT_SUBSCRIBE_TIMEOUT_S``.
        """
        refused, self.refused = self.refused, None
        for channel, future in self.barriers.pop(token, []):
            if future.done():
                continue
            if channel in self.subscribed:
                future.set_result(None)
            elif refused is not None:
                future.set_exception(RedisError(f"Redis refused the subscription: {refused}"))


def runs(batch: list[tuple[str, bytes]]) -> list[tuple[str, list[bytes]]]:
    """Group consecutive commands of one kind, keeping their order."""
    runs: list[tuple[str, list[bytes]]] = []
    for op, channel in batch:
        if runs and runs[-1][0] == op:
            runs[-1][1].append(channel)
        else:
            runs.append((op, [channel]))
    return runs
