"""redis-py's connection classes made safe against a peer's reset while a connection sits in the pool.

One job: :class:`ResetSafe` and its three concrete classes (``redis://``, ``rediss://``,
``unix://``), and :func:`reset_safe` / :func:`reset_safe_pool`, which
:mod:`infra.redis_client` applies to every client and cluster node it builds. Why: on
uvloop, the write to a connection the peer reset (TCP RST) while it was pooled raises a
``RuntimeError`` that redis-py's retry does not cover (see :class:`ResetSafe`).

Must not import :mod:`worker`, :mod:`publisher` or :mod:`tools` (as all of :mod:`infra`).
"""

from __future__ import annotations

from typing import Any, Final, TypeVar, cast

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection, Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError

_C = TypeVar("_C", bound=AbstractConnection)


class ResetSafe(AbstractConnection):
    """A connection whose write to a transport already closed by a peer's reset is a ``ConnectionError``.

    When the peer resets (TCP RST) a connection idle in the pool, uvloop closes its
    transport, redis-py's pool check does not notice (the stream reader holds the error,
    not an end of file), and the next write raises ``RuntimeError`` ("unable to perform
    operation on <TCPTransport closed=True ...>; the handler is closed"), which the retry
    does not cover: the command failed, and an SSE request got a ``500``. asyncio's own loop
    drops such a write and fails the read with ``ConnectionError``. As a ``ConnectionError``
    it is retried on a new connection (redis-py has already closed this one).
    """

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """Send as redis-py does; a write refused by a transport the peer reset raises ``ConnectionError``."""
        writer = self._writer
        try:
            await super().send_packed_command(command, check_health)
        except RuntimeError as exc:
            if writer is None or not writer.transport.is_closing():
                raise
            raise RedisConnectionError(f"connection reset by the peer before the write: {exc}") from exc


class _TCPConnection(ResetSafe, Connection):
    """``redis://`` (:class:`ResetSafe`)."""


class _SSLConnection(ResetSafe, SSLConnection):
    """``rediss://`` (:class:`ResetSafe`)."""


class _UnixConnection(ResetSafe, UnixDomainSocketConnection):
    """``unix://`` (:class:`ResetSafe`)."""


_RESET_SAFE: Final[dict[type[AbstractConnection], type[AbstractConnection]]] = {
    Connection: _TCPConnection, SSLConnection: _SSLConnection, UnixDomainSocketConnection: _UnixConnection}
"""redis-py's connection class for a URL scheme -> the same made :class:`ResetSafe`."""


def reset_safe(cls: type[_C]) -> type[_C]:
    """Return the :class:`ResetSafe` subclass of redis-py's ``cls`` (``cls`` itself when it is none of the three)."""
    return cast("type[_C]", _RESET_SAFE.get(cls, cls))


def reset_safe_pool(client: aioredis.Redis) -> aioredis.Redis:
    """Make the connections ``client``'s pool opens from now on :class:`ResetSafe`; return ``client``."""
    pool = client.connection_pool
    pool.connection_class = reset_safe(pool.connection_class)
    return client
