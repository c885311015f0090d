"""The fan-out hub: one Redis subscription per stream per process, one read per notification.

Readers of a stream share a :class:`Topic`. The first reader subscribes the stream's
live channel (``P:{id}:live``, payload: last stored seq); the last one to leave
unsubscribes. A reader joins *before* it reads history, and :meth:`Hub.join` returns
only once Redis has confirmed the subscription (a ``PING`` sent after ``SUBSCRIBE`` on
the same connection comes back after it), so nothing appended between the history read
and the live tail is missed. After its history replay a reader calls :meth:`Hub.go_live`;
from then on the topic's pump reads ``XRANGE (0-<fetched> +`` once per notification for
all live readers and offers each entry to each of them (:meth:`Reader.offer`).

All SUBSCRIBE/UNSUBSCRIBE commands go through one queue, so they reach Redis in the
order readers came and went. Follows the Redis pages of SUBSCRIBE, PING and XRANGE.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

from redis.exceptions import RedisError

from publisher.reader import Reader
from publisher.store import Store
from schema.errors import InternalError

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger(__name__)

RETRY_S = 0.5
"""Pause before the listener or a pump retries after a Redis error, seconds."""
CLOSE_TIMEOUT_S = 2.0
"""Longest wait for the hub's tasks to stop at shutdown, seconds."""


class Topic:
    """Readers of one stream and the shared live read position."""

    def __init__(self, stream_id: str, channel: bytes) -> None:
        self.stream_id = stream_id
        self.channel = channel
        self.readers: set[Reader] = set()
        self.live: set[Reader] = set()
        self.fetched = 0
        """Last seq offered to the live readers; every live reader's cursor is >= it."""
        self.pending = False
        """A notification (or a new live reader) asks for a read."""
        self.wake = asyncio.Event()
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ready.add_done_callback(_consume)
        self.pump: asyncio.Task[None] | None = None

    def kick(self) -> None:
        """Ask the pump for a read."""
        self.pending = True
        self.wake.set()


def _consume(future: asyncio.Future[None]) -> None:
    """Mark a failed subscription as seen even when no reader waited for it."""
    if not future.cancelled():
        future.exception()


class Hub:
    """Process-wide fan-out of stored events to readers.

    Args:
        redis: Client whose pool gives the one pub/sub connection.
        store: Reads of stored entries (shared with the handlers).
        channel_of: Live channel name of a stream id (``Keys.live``).
        subscribe_timeout_s: How long :meth:`join` waits for Redis to confirm.
        reconnect: Returns a new client for the pub/sub connection after it failed (a
            node of the current topology: :func:`worker.redis_client.node_client`); the
            hub then subscribes every topic again on it. ``None``: keep retrying ``redis``.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        store: Store,
        channel_of: Callable[[str], str],
        subscribe_timeout_s: float,
        reconnect: Callable[[], Awaitable[aioredis.Redis]] | None = None,
    ) -> None:
        self._pubsub = redis.pubsub()
        self._reconnect = reconnect
        self._clients: list[aioredis.Redis] = []
        """Clients made by ``reconnect``, closed with the hub."""
        self._store = store
        self._channel_of = channel_of
        self._timeout_s = subscribe_timeout_s
        self._topics: dict[str, Topic] = {}
        self._by_channel: dict[bytes, Topic] = {}
        self._barriers: dict[bytes, asyncio.Future[None]] = {}
        self._commands: asyncio.Queue[tuple[Literal["sub", "unsub", "stop"], bytes, bytes]] = asyncio.Queue()
        self._closing = False
        self._connected = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Start the pub/sub listener and the command writer."""
        self._tasks = [asyncio.create_task(self._listen()), asyncio.create_task(self._command_loop())]

    async def close(self) -> None:
        """Stop every task and close the pub/sub connection.

        A task may be inside a redis-py call when cancelled, and redis-py does not always
        let the cancellation through; the loops also stop on :attr:`_closing` and a stop
        command, and the wait is bounded by :data:`CLOSE_TIMEOUT_S`.
        """
        self._closing = True
        for reader in self.readers():
            reader.close("shutdown")
        self._commands.put_nowait(("stop", b"", b""))
        tasks = [*self._tasks, *(t.pump for t in self._topics.values() if t.pump is not None)]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]
        for client in self._clients:
            await client.aclose()

    def readers(self) -> list[Reader]:
        """Return every joined reader (for shutdown)."""
        return [reader for topic in self._topics.values() for reader in topic.readers]

    def reader_count(self, stream_id: str) -> int:
        """Return how many readers of ``stream_id`` are joined."""
        topic = self._topics.get(stream_id)
        return len(topic.readers) if topic else 0

    def topic_count(self) -> int:
        """Return how many streams this process is subscribed to."""
        return len(self._topics)

    @contextlib.asynccontextmanager
    async def join(self, reader: Reader) -> AsyncIterator[Reader]:
        """Register ``reader`` and wait until its stream's live channel is subscribed.

        Raises:
            InternalError: Redis did not confirm the subscription in time or failed; no
                response has started, so the caller answers 503.
        """
        topic = self._topics.get(reader.stream_id) or self._open(reader.stream_id)
        topic.readers.add(reader)
        try:
            try:
                async with asyncio.timeout(self._timeout_s):
                    await asyncio.shield(topic.ready)
            except (TimeoutError, RedisError) as exc:
                raise InternalError("live subscription not confirmed by Redis") from exc
            yield reader
        finally:
            self._leave(topic, reader)

    def go_live(self, reader: Reader) -> bool:
        """Move a reader from history replay to the live tail, if it has caught up.

        Returns:
            True when the reader now receives entries through :meth:`Reader.offer`.
            False when the topic already offered entries past ``reader.cursor``: the
            caller must read history further and call again.
        """
        topic = self._topics[reader.stream_id]
        if topic.live and reader.cursor < topic.fetched:
            return False
        if not topic.live:
            topic.fetched = reader.cursor
        topic.live.add(reader)
        topic.kick()
        return True

    def _open(self, stream_id: str) -> Topic:
        channel = self._channel_of(stream_id).encode()
        topic = Topic(stream_id, channel)
        self._topics[stream_id], self._by_channel[channel] = topic, topic
        token = uuid.uuid4().hex.encode()
        self._barriers[token] = topic.ready
        self._commands.put_nowait(("sub", channel, token))
        topic.pump = asyncio.create_task(self._pump(topic))
        return topic

    def _leave(self, topic: Topic, reader: Reader) -> None:
        topic.readers.discard(reader)
        topic.live.discard(reader)
        if topic.readers or self._topics.get(topic.stream_id) is not topic:
            return
        del self._topics[topic.stream_id]
        del self._by_channel[topic.channel]
        if topic.pump is not None:
            topic.pump.cancel()
        self._commands.put_nowait(("unsub", topic.channel, b""))

    async def _command_loop(self) -> None:
        while not self._closing:
            op, channel, token = await self._commands.get()
            try:
                if op == "stop":
                    return
                if op == "sub":
                    await self._pubsub.subscribe(channel)
                    self._connected.set()
                    await self._pubsub.ping(token)
                else:
                    await self._pubsub.unsubscribe(channel)
            except RedisError as exc:
                log.warning("pub/sub %s of %r failed: %s", op, channel, exc)
                self._fail_barriers(exc)

    def _fail_barriers(self, exc: RedisError) -> None:
        """Fail every unconfirmed subscription: its confirmation may never come.

        Its waiting readers answer 503; the topic is dropped when they leave, so the
        next reader subscribes afresh.
        """
        for barrier in self._barriers.values():
            if not barrier.done():
                barrier.set_exception(exc)
        self._barriers.clear()

    async def _listen(self) -> None:
        while not self._closing:
            await self._connected.wait()
            try:
                message = await self._pubsub.get_message(timeout=None)
            except RedisError as exc:
                if self._closing:
                    return
                log.warning("pub/sub connection lost (%s); reconnecting", exc)
                self._fail_barriers(exc)
                await asyncio.sleep(RETRY_S)
                await self._repoint()
                continue
            if message is not None:
                self._dispatch(message)

    async def _repoint(self) -> None:
        """Move the pub/sub connection to a node of the current topology and subscribe every topic again.

        After a failover the old node may be gone for good; redis-py would retry its
        address forever. Without ``reconnect`` nothing changes. A topic's ``subscribe``
        confirmation kicks its pump (:meth:`_dispatch`), so live readers catch up on
        what was appended meanwhile.
        """
        if self._reconnect is None:
            return
        try:
            client = await self._reconnect()
        except RedisError as exc:
            log.warning("pub/sub: no node to reconnect to yet (%s)", exc)
            return
        self._clients.append(client)
        old, self._pubsub = self._pubsub, client.pubsub()
        self._connected.clear()
        with contextlib.suppress(RedisError, OSError):
            await old.aclose()  # type: ignore[no-untyped-call]
        for topic in self._topics.values():
            self._commands.put_nowait(("sub", topic.channel, b""))

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind, data = message["type"], message["data"]
        if kind == "pong":
            barrier = self._barriers.pop(bytes(data or b""), None)
            if barrier is not None and not barrier.done():
                barrier.set_result(None)
            return
        topic = self._by_channel.get(message["channel"])
        if topic is None:
            return
        if kind == "message":
            self._notify(topic, data)
        elif kind == "subscribe" and topic.live:
            topic.kick()  # (re)subscribed, maybe after a reconnect: notifications may be lost

    @staticmethod
    def _notify(topic: Topic, data: bytes) -> None:
        try:
            top = int(data)
        except ValueError:
            top = topic.fetched + 1
        if top > topic.fetched and topic.live:
            topic.kick()
        elif top > topic.fetched:
            topic.pending = True

    async def _pump(self, topic: Topic) -> None:
        while not self._closing:
            await topic.wake.wait()
            topic.wake.clear()
            while topic.pending and topic.live:
                topic.pending = False
                try:
                    await self._fetch(topic)
                except RedisError as exc:
                    log.warning("live read of %s failed: %s", topic.stream_id, exc)
                    topic.pending = True
                    await asyncio.sleep(RETRY_S)

    async def _fetch(self, topic: Topic) -> None:
        start = topic.fetched
        page = await self._store.read_after(topic.stream_id, start)
        if topic.fetched != start:  # the live set emptied and restarted meanwhile
            topic.pending = True
            return
        for entry in page:
            for reader in list(topic.live):
                reader.offer(entry)
        topic.live = {reader for reader in topic.live if reader.closed is None}
        if page:
            topic.fetched = page[-1].seq
        if len(page) >= self._store.page:
            topic.pending = True
