"""Classic pub/sub for the hub: ONE subscriber connection (``SUBSCRIBE``) to one node, kept open.

Used on a single node and on a Redis 6.2 cluster (:func:`infra.live_pubsub.live_mode`
``classic``); a Redis 7 cluster uses :mod:`publisher.live.shard_links` instead, which
offers the hub the same small interface (``start``, ``close``, ``queue``, ``confirming``).

Every (un)subscription queued in one loop turn is sent together, in order, each run of
one kind as one command; a subscribing run is followed by ``PING <token>`` on the same
connection, whose reply (after the ``subscribe`` pushes) confirms the topics' ``ready``
futures. A ``SUBSCRIBE`` Redis refuses (``NOPERM``) fails its batch at that ``PING``.
After the connection is lost (or cannot be opened) every unconfirmed subscription
fails (its readers answer with a ``retry:`` hint), the link waits :data:`RETRY_S`,
points itself at a node of the current topology (``reconnect``) and, once connected,
subscribes every topic the hub holds again. Follows the Redis pages SUBSCRIBE,
UNSUBSCRIBE and PING.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from infra.redis_client import REDIS_ERRORS
from publisher.live.pubsub import PubSubLink, endpoint_of
from publisher.live.topic import Topic

log = logging.getLogger("publisher.live.hub")  # the hub's pub/sub: its lines keep the logger they had

RETRY_S = 0.5
"""Pause before the link retries after a Redis error, seconds."""
FAILURE_LOG_EVERY = 120
"""While Redis stays unreachable, one warning per this many failed connection attempts
(once a minute at :data:`RETRY_S`), after the first."""


class ClassicLink:
    """The hub's subscriptions on one classic pub/sub connection (module docstring).

    Args:
        redis: Client whose pool gives the connection's endpoint and credentials.
        held: Returns the hub's topics now (subscribed again after a reconnect).
        topic_of: The hub's topic of a channel (its ``ready`` future is confirmed here).
        on_message: Called with ``(channel, payload)`` of each ``message``, synchronously.
        on_subscribed: Called with the channel of each ``subscribe`` push.
        batch_s: The read pause (:class:`PubSubLink` ``batch_s``).
        on_read: Called after the pushes of one socket read.
        hold: The extra rest after a read (:class:`PubSubLink` ``hold``).
        reconnect: Returns a client of a node of the current topology; ``None``: retry the same node.
    """

    def __init__(self, redis: Any, *, held: Callable[[], Iterable[Topic]],
                 topic_of: Callable[[bytes], Topic | None], on_message: Callable[[bytes, bytes], None],
                 on_subscribed: Callable[[bytes], None], batch_s: float = 0.0,
                 on_read: Callable[[], None] = lambda: None, hold: Callable[[], float] = lambda: 0.0,
                 reconnect: Callable[[], Awaitable[Any]] | None = None) -> None:
        self._held, self._topic_of = held, topic_of
        self._on_message, self._on_subscribed = on_message, on_subscribed
        self._reconnect = reconnect
        self._link = PubSubLink(endpoint_of(redis), self._dispatch, lambda exc: self._lost.set(), batch_s, on_read,
                                hold=hold)
        self._pending: list[tuple[str, bytes, Topic | None]] = []
        self._flush_due = False
        self._barriers: dict[bytes, list[asyncio.Future[None]]] = {}
        self._refused: hiredis.ReplyError | None = None
        """An error reply since the last ``subscribe`` push: the next ``PING`` reply fails its batch."""
        self._lost = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the task that keeps the connection open."""
        self._task = asyncio.create_task(self._run())

    def close(self) -> list[asyncio.Task[None]]:
        """Close the connection; return the task still to wait for."""
        self._closing = True
        self._link.close()
        self._lost.set()
        return [self._task] if self._task is not None else []

    def confirming(self) -> bool:
        """Return True while a subscription sent awaits its confirmation."""
        return bool(self._barriers)

    def queue(self, op: str, channel: bytes) -> None:
        """Queue ``sub`` or ``unsub`` of one channel; everything queued in one loop turn is sent together."""
        self._pending.append((op, channel, self._topic_of(channel) if op == "sub" else None))
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Send the queued commands in order, each run of one kind as one command.

        A burst of new topics (a reconnect storm) becomes one ``SUBSCRIBE`` of every
        channel and one ``PING`` that confirms them all. While disconnected nothing is
        sent: the reconnect subscribes every topic held then.
        """
        self._flush_due = False
        if not self._link.connected:
            return
        batch, self._pending = self._pending, []
        for op, run in _runs(batch):
            self._send_run(op, run)

    def _send_run(self, op: str, run: Sequence[tuple[bytes, Topic | None]]) -> None:
        channels = [channel for channel, _ in run]
        if op == "unsub":
            self._link.send("UNSUBSCRIBE", *channels)
            return
        token = uuid.uuid4().hex.encode()
        self._barriers[token] = [topic.ready for _, topic in run if topic is not None]
        self._link.send("SUBSCRIBE", *channels)
        self._link.send("PING", token)

    async def _run(self) -> None:
        """Keep the subscriber connection open; after each (re)connect, subscribe every topic held."""
        failures = 0
        while not self._closing:
            try:
                await self._link.connect()
            except RedisError as exc:
                failures += 1
                if failures == 1 or failures % FAILURE_LOG_EVERY == 0:  # one line at first, then now and then
                    log.warning("pub/sub connection failed (%s, %d attempts so far); retrying every %ss",
                                exc, failures, RETRY_S)
                await self._retry(exc)
                continue
            if failures:
                log.warning("pub/sub connection open again after %d failed attempts", failures)
                failures = 0
            await self._serve()
            if self._closing:
                return
            log.warning("pub/sub connection lost; reconnecting")
            await self._retry(RedisConnectionError("pub/sub connection lost"))

    async def _serve(self) -> None:
        """On a fresh connection: subscribe every topic held, then wait until the connection is lost."""
        self._lost.clear()
        self._refused = None
        self._pending.clear()
        held = [(topic.channel, topic) for topic in self._held()]
        if held:
            self._send_run("sub", held)
        await self._lost.wait()

    async def _retry(self, exc: RedisError) -> None:
        """Fail the unconfirmed subscriptions, pause :data:`RETRY_S`, then repoint the connection."""
        self._fail_barriers(exc)
        await asyncio.sleep(RETRY_S)
        await self._repoint()

    async def _repoint(self) -> None:
        """Point the subscriber connection at a node of the current topology (no-op without ``reconnect``)."""
        if self._reconnect is None:
            return
        try:
            client = await self._reconnect()
        except (*REDIS_ERRORS, OSError) as exc:  # the cluster client's own RedisClusterException too
            log.warning("pub/sub: no node to reconnect to yet (%s)", exc)
            return
        try:
            self._link.endpoint = endpoint_of(client)
        finally:
            await client.aclose()

    def _fail_barriers(self, exc: RedisError) -> None:
        """Fail every unconfirmed subscription: its confirmation may never come.

        Its waiting readers answer 503; the topic is dropped when they leave, so the
        next reader subscribes afresh.
        """
        for barriers in self._barriers.values():
            for barrier in barriers:
                if not barrier.done():
                    barrier.set_exception(exc)
        self._barriers.clear()
        for topic in self._held():  # queued, not sent: no confirmation is coming either
            if not topic.ready.done():
                topic.ready.set_exception(exc)

    def _dispatch(self, reply: Any) -> None:
        """Handle one pushed reply: ``[kind, channel or token, data]`` (RESP2 pub/sub).

        A ``SUBSCRIBE`` Redis refuses (``NOPERM``: an ACL user without that channel) answers
        one error instead of its ``subscribe`` pushes; the ``PING`` sent after it then fails
        that batch's readers at once (a plain bulk reply when the connection holds no
        subscription) instead of confirming channels that are not subscribed.
        """
        if isinstance(reply, hiredis.ReplyError):
            log.warning("pub/sub: Redis refused a SUBSCRIBE (%s); its readers are told to retry", reply)
            self._refused = reply
            return
        if isinstance(reply, bytes):  # PING's reply outside subscribed mode
            self._pong(reply)
            return
        if not isinstance(reply, list) or len(reply) < 2:
            log.warning("pub/sub: unexpected reply %r", reply)
            return
        kind = reply[0]
        if kind == b"message":
            self._on_message(reply[1], reply[2])
        elif kind == b"pong":
            self._pong(reply[1])
        elif kind == b"subscribe":
            self._refused = None
            self._on_subscribed(reply[1])

    def _pong(self, token: bytes) -> None:
        """Confirm the subscriptions sent before ``PING <token>``, or fail them when Redis refused them."""
        refused, self._refused = self._refused, None
        for barrier in self._barriers.pop(token, []):
            if barrier.done():
                continue
            if refused is None:
                barrier.set_result(None)
            else:
                barrier.set_exception(RedisError(f"SUBSCRIBE refused: {refused}"))


def _runs(batch: Sequence[tuple[str, bytes, Topic | None]]) -> list[tuple[str, list[tuple[bytes, Topic | None]]]]:
    """Group consecutive commands of one kind, keeping their order: ``[(op, [(channel, topic)])]``."""
    runs: list[tuple[str, list[tuple[bytes, Topic | None]]]] = []
    for op, channel, topic in batch:
        if runs and runs[-1][0] == op:
            runs[-1][1].append((channel, topic))
        else:
            runs.append((op, [(channel, topic)]))
    return runs
