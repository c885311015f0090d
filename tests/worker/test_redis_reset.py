"""A Redis connection the peer reset (TCP RST) while it sat in the pool: the next command reconnects.

The publisher runs on uvloop by default. When the peer resets an idle pooled connection,
uvloop closes its transport, and a later write to it raises ``RuntimeError("unable to
perform operation on <TCPTransport closed=True ...>; the handler is closed")`` instead of
failing the read as asyncio's loop does; redis-py retries only its own ``ConnectionError``,
so the command failed with that ``RuntimeError`` (an SSE request then got a ``500``, which
makes EventSource give up). The reset here is real: a loopback proxy before a private
``redis-server`` aborts both sides of every connection with ``SO_LINGER`` 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from infra.redis_client import RedisOptions, connect, primary_clients
from infra.redis_connections import ResetSafe
from tests.worker.redis_proc import private_redis

uvloop = pytest.importorskip("uvloop")

GUARD_S = 10.0
"""Hang guard only; never a performance limit."""


class ResettingProxy:
    """Forwards 127.0.0.1:<port> to a Redis port; :meth:`reset` resets every connection (RST both ways)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self.reset()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def reset(self) -> None:
        writers, self._writers = self._writers, []
        for writer in writers:
            sock = writer.get_extra_info("socket")
            if sock is not None:  # None once closed
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [client_w, up_w]

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            writer.transport.abort()

        await asyncio.gather(pump(client_r, up_w), pump(up_r, client_w))


def _pooled(client: Any) -> list[Any]:
    pool = client.connection_pool
    return [*pool._available_connections, *pool._in_use_connections]


async def _until_reset_seen(client: Any) -> None:
    """Wait until every pooled connection's transport is closed: the client has seen the RST."""
    async with asyncio.timeout(GUARD_S):
        while True:
            if all(conn._writer is None or conn._writer.transport.is_closing() for conn in _pooled(client)):
                return
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("pool_timeout_s", [None, 5.0], ids=["pool", "blocking-pool"])
def test_a_command_on_a_pooled_connection_the_peer_reset_reconnects_and_succeeds_on_uvloop(pool_timeout_s):
    async def scenario() -> list[Any]:
        proxy = ResettingProxy(server.port)
        await proxy.start()
        client = connect(f"redis://127.0.0.1:{proxy.port}/0", RedisOptions(pool_timeout_s=pool_timeout_s))
        try:
            await client.set("k", "v")
            results = []
            for _ in range(2):  # each round: every pooled connection reset, then a command and a pipeline
                proxy.reset()
                await _until_reset_seen(client)
                results.append(await client.get("k"))
                proxy.reset()
                await _until_reset_seen(client)
                async with client.pipeline(transaction=False) as pipe:
                    pipe.get("k")
                    pipe.exists("k")
                    results.append(await pipe.execute())
            return results
        finally:
            await client.aclose()
            await proxy.close()

    with private_redis() as server:
        assert uvloop.run(scenario()) == [b"v", [b"v", 1], b"v", [b"v", 1]]


async def test_every_connection_a_cluster_client_and_its_node_clients_open_is_reset_safe(cluster_redis_url):
    """The cluster client builds its connections itself: those of every node, found at start or later, and of
    the per-node clients (:func:`primary_clients`) get the same handling of a reset."""
    client = connect(cluster_redis_url, RedisOptions(cluster=True))
    try:
        await client.execute_command("PING", target_nodes=RedisCluster.ALL_NODES)
        opened = [conn for node in client.get_nodes() for conn in node._connections]
        assert len(client.get_nodes()) >= 3
        assert opened
        assert all(isinstance(conn, ResetSafe) for conn in opened)
        for node_client in await primary_clients(client):
            try:
                await node_client.ping()
                assert all(isinstance(conn, ResetSafe) for conn in _pooled(node_client))
                assert _pooled(node_client)
            finally:
                await node_client.aclose()
    finally:
        await client.aclose()
