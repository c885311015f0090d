"""Sharded pub/sub for the hub on a Redis 7 cluster: one subscriber connection per primary owning subscribed channels.

A sharded message (``SPUBLISH``) is delivered only by the shard that owns the channel's
slot, so each live channel ``P:{id}:live`` is subscribed (``SSUBSCRIBE``) at its owner,
found in the cluster client's slot map (redis-py's ``keyslot`` and nodes manager). A
:class:`PubSubLink` is opened per primary that holds subscribed channels and closed when
its last channel leaves. Commands are batched per loop turn and per node; a
multi-channel ``SSUBSCRIBE``/``SUNSUBSCRIBE`` names channels of one slot only (Redis
refuses others with ``CROSSSLOT``), and every subscribing batch is followed by a
``PING <token>``: its reply, after the subscriptions', confirms them (each link keeps its
own barrier; a channel whose ``SSUBSCRIBE`` failed is not confirmed by it).

What each link tracks is what Redis told it (``ssubscribe``/``sunsubscribe`` pushes name
the channel), so topology changes are handled from state, not from guesses about which
reply answers which command:

* an error reply (``-MOVED``: the slot has another owner; ``-CROSSSLOT``) or an
  ``sunsubscribe`` nobody asked for (Redis 7 sends one to every subscriber of a shard
  channel when its slot moves away or its node becomes a replica) heals the link: the
  slot map is read again and each of its channels is routed to its owner now; a channel
  that moved, or that this node no longer holds, is subscribed there. A map that still
  names the node that dropped a channel is stale (gossip is not instant; a replica would
  even accept the subscription): it is read again, up to :data:`STALE_MAP_HEALS` times;
* a lost link (node killed, failover) fails its unconfirmed subscriptions (those
  readers answer 503 and retry), waits :data:`RETRY_S`, reads the slot map, moves its
  channels to their current owners and reconnects for those still routed to it.

A channel subscribed again reaches the hub's ``on_subscribed`` a second time, which the
topic treats as a possible gap (one ``XRANGE`` repairs it), so a move loses nothing.
Follows the Redis pages "Pub/Sub" (sharded Pub/Sub), SSUBSCRIBE, SUNSUBSCRIBE, PING,
"Cluster specification" (MOVED, hash slots) and redis-py's cluster client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

import hiredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from infra.redis_client import REDIS_ERRORS
from publisher.live.shard import Shard, runs
from publisher.live.topic import Topic

log = logging.getLogger(__name__)

RETRY_S: Final = 0.5
"""Pause after a lost link before it is rerouted and reconnected, and least time between
two heals of one link, seconds."""
STALE_MAP_HEALS: Final = 10
"""Heals (one per :data:`RETRY_S`) during which a slot map that still names the node that
dropped a channel is taken as stale: the channel waits for a map naming its new owner
(after a failover, the old master, now a replica, would still accept it). Past them the
map is believed and the channel subscribed there again."""


class ShardLinks:
    """Sharded subscriptions of the hub's topics, one link per owning primary (module docstring).

    Args:
        cluster: The publisher's cluster client: its slot map routes channels, and is read
            again (``nodes_manager.initialize``) after a move or a failover.
        topic_of: The hub's topic of a channel (its ``ready`` future is confirmed here).
        on_message: Called with ``(channel, payload)`` of each ``smessage``, synchronously.
        on_subscribed: Called with the channel of each confirmed ``SSUBSCRIBE`` at its owner.
        batch_s: Each link's read pause (:class:`PubSubLink` ``batch_s``).
        on_read: Called after the pushes of one socket read of any link.
        hold: Each link's extra rest after a read (:class:`PubSubLink` ``hold``).
    """

    def __init__(self, cluster: RedisCluster, *, topic_of: Callable[[bytes], Topic | None],
                 on_message: Callable[[bytes, bytes], None], on_subscribed: Callable[[bytes], None],
                 batch_s: float = 0.0, on_read: Callable[[], None] = lambda: None,
                 hold: Callable[[], float] = lambda: 0.0) -> None:
        self._cluster = cluster
        self._topic_of, self._on_message, self._on_subscribed = topic_of, on_message, on_subscribed
        self._batch_s, self._on_read, self._hold = batch_s, on_read, hold
        self._shards: dict[str, Shard] = {}
        self._route: dict[bytes, Shard] = {}
        self._flush_due = False
        self._closing = False

    async def start(self) -> None:
        """Read the slot map (the first subscription is routed by it).

        Raises:
            redis.exceptions.RedisError: The cluster's slot map could not be read.
        """
        await self._cluster.initialize()

    def close(self) -> list[asyncio.Task[None]]:
        """Close every link; return the tasks still to wait for."""
        self._closing = True
        tasks = []
        for shard in list(self._shards.values()):
            tasks += [t for t in (shard.task, shard.heal) if t is not None]
            self._retire(shard)
        return tasks

    def queue(self, op: str, channel: bytes) -> None:
        """Queue ``sub`` or ``unsub`` of one channel; everything queued in one loop turn is sent together."""
        if op == "sub":
            self._place(channel, self._owner(channel))
        else:
            shard = self._route.pop(channel, None)
            if shard is None:
                return
            shard.channels.discard(channel)
            shard.pending.append(("unsub", channel))
        self._schedule()

    # -- routing -----------------------------------------------------------------------------------

    def _owner(self, channel: bytes) -> ClusterNode | None:
        """Return the primary owning ``channel``'s slot in the client's slot map (``None``: slot not covered)."""
        try:
            return self._cluster.get_node_from_key(channel.decode())
        except REDIS_ERRORS:
            return None

    def _place(self, channel: bytes, node: ClusterNode | None) -> None:
        """Route ``channel`` to ``node`` (unknown: any primary; a ``MOVED`` corrects it) and queue its subscribe."""
        if node is None:
            primaries = self._cluster.get_primaries()
            if not primaries:
                log.warning("sharded pub/sub: no primary known for %r", channel)
                return
            node = primaries[0]
        shard = self._shards.get(node.name)
        if shard is None:
            shard = self._shards[node.name] = Shard(node, self._push, self._batch_s, self._on_read, self._hold)
            shard.task = asyncio.create_task(self._run(shard))
        self._route[channel] = shard
        shard.channels.add(channel)
        shard.pending.append(("sub", channel))

    def confirming(self) -> bool:
        """Return True while a subscription sent to any primary awaits its confirmation."""
        return any(shard.barriers for shard in self._shards.values())

    def _schedule(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Send each link's queued commands in order; a link left without channels is closed.

        A link not connected sends nothing: its (re)connect subscribes every channel routed to it.
        """
        self._flush_due = False
        for shard in list(self._shards.values()):
            if not shard.channels:
                self._retire(shard)
                continue
            if not shard.pending or not shard.link.connected:
                continue
            batch, shard.pending = shard.pending, []
            for op, run in runs(batch):
                if op == "sub":
                    shard.subscribe(self._by_slot(run), self._topic_of)
                else:
                    shard.unsubscribe(self._by_slot(run))

    def _by_slot(self, channels: Iterable[bytes]) -> list[list[bytes]]:
        runs: dict[int, list[bytes]] = {}
        for channel in channels:
            runs.setdefault(self._cluster.keyslot(channel), []).append(channel)
        return list(runs.values())

    # -- one link's life ---------------------------------------------------------------------------

    async def _run(self, shard: Shard) -> None:
        """Keep the link open while channels are routed to it; after each (re)connect, subscribe them all."""
        while not self._closing and not shard.retired:
            try:
                await shard.link.connect()
            except RedisError as exc:
                log.warning("sharded pub/sub: connection to %s failed (%s); rerouting in %ss", shard.name, exc,
                            RETRY_S)
                shard.fail(self._topic_of, exc)
                await asyncio.sleep(RETRY_S)
                await self._reroute(shard)
                continue
            if shard.retired:
                shard.link.close()
                return
            shard.reset()
            if shard.channels:
                shard.subscribe(self._by_slot(list(shard.channels)), self._topic_of)
            await shard.lost.wait()
            if self._closing or shard.retired:
                return
            log.warning("sharded pub/sub: connection to %s lost; rerouting its %d channels in %ss", shard.name,
                        len(shard.channels), RETRY_S)
            shard.fail(self._topic_of, RedisConnectionError(f"sharded pub/sub connection to {shard.name} lost"))
            await asyncio.sleep(RETRY_S)
            await self._reroute(shard)

    def _retire(self, shard: Shard) -> None:
        shard.retired = True
        if self._shards.get(shard.name) is shard:
            del self._shards[shard.name]
        shard.link.close()
        shard.lost.set()
        if shard.heal is not None and shard.heal is not asyncio.current_task():
            shard.heal.cancel()

    async def _refresh(self) -> None:
        """Read the slot map again (redis-py serializes concurrent reads); keep the old one on failure."""
        try:
            await self._cluster.nodes_manager.initialize()
        except (*REDIS_ERRORS, OSError) as exc:
            log.warning("sharded pub/sub: slot map not refreshed (%s)", exc)

    async def _reroute(self, shard: Shard) -> None:
        """Refresh the slot map; move ``shard``'s channels to their owners; resubscribe those it lost."""
        await self._refresh()
        if shard.retired:
            return
        stale = False
        for channel in list(shard.channels):
            owner = self._owner(channel)
            if owner is not None and owner.name != shard.name:
                log.info("sharded pub/sub: %r moves from %s to %s", channel, shard.name, owner.name)
                shard.channels.discard(channel)
                shard.dropped.pop(channel, None)
                self._place(channel, owner)
            elif channel in shard.dropped and shard.dropped[channel] < STALE_MAP_HEALS:
                shard.dropped[channel] += 1  # the map still names the node that dropped it: ask again
                stale = True
            elif channel not in shard.subscribed and shard.link.connected:
                shard.dropped.pop(channel, None)
                shard.pending.append(("sub", channel))
        if not shard.channels:
            self._retire(shard)
        elif stale:
            self._heal_soon(shard)
        self._schedule()

    def _heal_soon(self, shard: Shard) -> None:
        """Reroute a connected link after a refusal or a lost subscription (at most once per :data:`RETRY_S`)."""
        if shard.heal is None and not shard.retired:
            shard.heal = asyncio.create_task(self._heal(shard))

    async def _heal(self, shard: Shard) -> None:
        wait_s = shard.healed_s + RETRY_S - time.monotonic()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        shard.healed_s = time.monotonic()
        shard.heal = None
        await self._reroute(shard)

    def _push(self, shard: Shard, reply: Any) -> None:
        """Handle one reply of a link: RESP2 ``[kind, channel, data]`` pushes, ``PING`` replies, errors."""
        if isinstance(reply, list) and len(reply) >= 2:
            kind, channel = reply[0], reply[1]
            if kind == b"smessage" and len(reply) >= 3:
                self._on_message(channel, reply[2])
            elif kind == b"ssubscribe":
                self._confirmed(shard, channel)
            elif kind == b"sunsubscribe":
                self._dropped(shard, channel)
            elif kind == b"pong":
                shard.confirm(channel)
            else:
                log.warning("sharded pub/sub: unexpected push %r from %s", kind, shard.name)
        elif isinstance(reply, bytes):  # PING answered outside subscribed mode (every SSUBSCRIBE failed)
            shard.confirm(reply)
        elif isinstance(reply, hiredis.ReplyError) and str(reply).startswith("NOPERM"):
            shard.refuse(reply)  # an ACL without these channels: a new slot map would not help
        elif isinstance(reply, hiredis.ReplyError):
            log.info("sharded pub/sub: %s refused a command (%s); reading the slot map again", shard.name, reply)
            self._heal_soon(shard)
        else:
            log.warning("sharded pub/sub: unexpected reply %r from %s", reply, shard.name)

    def _confirmed(self, shard: Shard, channel: bytes) -> None:
        shard.subscribed.add(channel)
        shard.dropped.pop(channel, None)
        if self._route.get(channel) is shard:
            self._on_subscribed(channel)
        else:  # routed elsewhere meanwhile (or left): do not keep a second subscription here
            shard.unsubscribe(self._by_slot([channel]))

    def _dropped(self, shard: Shard, channel: bytes) -> None:
        if shard.unsubscribed(channel):
            return
        if self._route.get(channel) is shard:  # Redis dropped it: its slot moved, or the node became a replica
            log.info("sharded pub/sub: %s dropped %r; reading the slot map again", shard.name, channel)
            shard.dropped[channel] = 0
            self._heal_soon(shard)


