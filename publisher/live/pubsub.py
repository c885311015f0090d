"""One RESP2 pub/sub connection that hands every pushed message to the hub as it is parsed.

redis-py's ``PubSub.get_message`` costs one await chain (retry wrapper, parser,
observability hooks) per message. The live channel is the publisher's hot path, so the
hub's subscriber connection is a plain asyncio protocol instead: each socket read is fed
to hiredis, and every complete reply is passed, synchronously and in order, to the
``on_push`` callback, with no task wake-up per message. Commands (``SUBSCRIBE``,
``UNSUBSCRIBE``, ``PING``) are written without waiting; their confirmations arrive as
pushes too. The connection is opened from the command client's own settings (host and
port or unix socket, username, password, TLS, client name), so it shows in
``CLIENT LIST`` under the publisher's name.

Follows the Redis pages "Redis serialization protocol specification" (RESP2),
"Pub/Sub", AUTH (the two-argument ACL form, Redis 6+), CLIENT SETNAME and PING.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import Any, Final, cast

import hiredis
import msgspec
from redis.exceptions import ConnectionError as RedisConnectionError

CONNECT_TIMEOUT_S: Final = 5.0
"""Longest wait to open the connection and finish its handshake, seconds."""


class Endpoint(msgspec.Struct, frozen=True, kw_only=True):
    """Where and how to connect, taken from a redis-py client's pool."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None
    """Unix socket path (``unix://`` URLs); host and port are unused then."""
    username: str | None = None
    password: str | None = None
    tls: bool = False
    client_name: str | None = None


def endpoint_of(client: Any) -> Endpoint:
    """Return the :class:`Endpoint` of a redis-py asyncio client (its pool's connection settings)."""
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    return Endpoint(host=kwargs.get("host", "127.0.0.1"), port=int(kwargs.get("port", 6379)), path=kwargs.get("path"),
                    username=kwargs.get("username"), password=kwargs.get("password"),
                    tls="SSL" in pool.connection_class.__name__, client_name=kwargs.get("client_name"))


def pack(*parts: bytes | str) -> bytes:
    """Encode one command as a RESP2 array of bulk strings."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class _Protocol(asyncio.Protocol):
    def __init__(self, on_push: Callable[[Any], None], on_lost: Callable[[Exception | None], None],
                 batch_s: float, on_read: Callable[[], None], hold: Callable[[], float]) -> None:
        self.reader = hiredis.Reader()
        self.on_push, self.on_lost, self.on_read, self.hold = on_push, on_lost, on_read, hold
        self.transport: asyncio.Transport | None = None
        self.batch_s = batch_s
        self.loop = asyncio.get_running_loop()  # looked up once: Python 3.11 asks the kernel its pid each time
        self.resting: asyncio.TimerHandle | None = None
        """The timer that resumes reading while the socket rests."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        started = time.monotonic()
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            self.on_push(reply)
        self.on_read()
        if self.batch_s > 0 and self.transport is not None:  # let the next messages gather: one read for several
            # at most half the time spent fanning out; no sooner than a read these messages asked for could start
            rest_s = max(self.batch_s, time.monotonic() - started, self.hold())
            self.transport.pause_reading()
            self.resting = self.loop.call_later(rest_s, self._resume)

    def hurry(self) -> None:
        """Cut a rest longer than ``batch_s`` to ``batch_s`` from now: a command's reply is awaited."""
        resting = self.resting
        if resting is not None and resting.when() > self.loop.time() + self.batch_s:
            resting.cancel()
            self.resting = self.loop.call_later(self.batch_s, self._resume)

    def _resume(self) -> None:
        self.resting = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.on_lost(exc)


class PubSubLink:
    """A subscriber connection; open it with :meth:`connect`, again after each loss.

    Args:
        endpoint: Where to connect.
        on_push: Called with every reply after the handshake (a list such as
            ``[b"message", channel, data]``), synchronously, in order.
        on_lost: Called once when an open connection closes (``None``: closed by us).
        batch_s: After each read, the socket is left unread this long, or as long as
            handling the read took when that was longer, so messages arriving meanwhile
            come in one read and fan out in one write per reader (fewer wake-ups and
            writes under load; adds at most that much latency). 0 reads at once.
        on_read: Called after the replies of one socket read were pushed.
        hold: Called after ``on_read`` when ``batch_s`` > 0: the socket rests at least
            this many seconds more (the wait of a stored-stream read the pushed
            messages asked for, :meth:`publisher.live.reads.LiveReads.hold_s`: messages
            arriving before it could start gather in one read instead of several). A
            command sent meanwhile (:meth:`send`) cuts such a rest back to ``batch_s``:
            its reply (a subscription's confirmation) is awaited.
    """

    def __init__(self, endpoint: Endpoint, on_push: Callable[[Any], None],
                 on_lost: Callable[[Exception | None], None], batch_s: float = 0.0,
                 on_read: Callable[[], None] = lambda: None, *, hold: Callable[[], float] = lambda: 0.0) -> None:
        self.endpoint = endpoint
        self.batch_s = batch_s
        self._on_read = on_read
        self._hold = hold
        self._on_push, self._on_lost = on_push, on_lost
        self._protocol: _Protocol | None = None
        self._handshake: asyncio.Queue[Any] | None = None

    @property
    def connected(self) -> bool:
        """True while the connection is open and its handshake done."""
        return self._protocol is not None and self._protocol.transport is not None and self._handshake is None

    async def connect(self) -> None:
        """Open the connection and authenticate and name it.

        Raises:
            redis.exceptions.ConnectionError: Unreachable, refused, timed out, or the
                server refused AUTH/CLIENT SETNAME. Call again later.
        """
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await self._open()
        except (OSError, TimeoutError) as exc:
            self.close()
            raise RedisConnectionError(f"pub/sub connection failed: {exc}") from exc

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        self._handshake = queue = asyncio.Queue[Any]()
        point = self.endpoint
        factory = lambda: _Protocol(self._push, self._lost, self.batch_s, self._read_done, self._hold)  # noqa: E731
        context = ssl.create_default_context() if point.tls else None
        if point.path is not None:
            _, protocol = await loop.create_unix_connection(factory, point.path)
        else:
            _, protocol = await loop.create_connection(factory, point.host, point.port, ssl=context)
        self._protocol = protocol
        commands = []
        if point.password is not None:
            # the ACL form, as redis-py's own connections send it (HELLO ... AUTH default <password>): a
            # password in REDIS_URL for a server without one is accepted the same way on both connections
            commands.append(("AUTH", point.username or "default", point.password))
        if point.client_name:
            commands.append(("CLIENT", "SETNAME", point.client_name))
        for command in commands:
            self.send(*(part for part in command if part is not None))
            reply = await queue.get()
            if isinstance(reply, hiredis.ReplyError):
                raise OSError(f"{command[0]} refused: {reply}")
        self._handshake = None

    def send(self, *parts: bytes | str) -> bool:
        """Write one command now; return False when not connected (the caller resends after connecting).

        A socket resting for a hold reads again within ``batch_s``, so the reply is not held.
        """
        protocol = self._protocol
        if protocol is None or protocol.transport is None:
            return False
        protocol.transport.write(pack(*parts))
        protocol.hurry()
        return True

    def close(self) -> None:
        """Close the connection (``on_lost`` is then called with ``None``)."""
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()

    def _push(self, reply: Any) -> None:
        if self._handshake is not None:
            self._handshake.put_nowait(reply)
        else:
            self._on_push(reply)

    def _read_done(self) -> None:
        if self._handshake is None:
            self._on_read()

    def _lost(self, exc: Exception | None) -> None:
        self._protocol = None
        if self._handshake is not None:
            self._handshake.put_nowait(hiredis.ReplyError("connection lost during the handshake"))
            return
        self._on_lost(exc)
