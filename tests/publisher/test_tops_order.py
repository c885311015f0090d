"""``Store.tops`` reads a stream's state before its top, so a stream ending mid-pipeline never reads as unterminated.

A pipeline is not atomic: Redis runs other clients' commands between two of its commands
when they arrive in separate socket reads. A loopback proxy between the publisher's client
and a real Redis splits one pipeline after its first command, and the worker's real append
script stores the terminal event in that gap.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

import redis.asyncio as aioredis

from publisher.history.store import Store
from schema.contract import StreamDone, StreamStart, Usage
from schema.keys import Keys
from tests.publisher.helpers import GUARD_S
from worker.appender import Appender
from worker.lease import Leases

SID = "st_topsorder"


def command_length(buffer: bytes) -> int | None:
    """Return the byte length of the first complete RESP2 command (array of bulk strings) in ``buffer``."""
    end = buffer.find(b"\r\n")
    if not buffer.startswith(b"*") or end < 0:
        return None
    at, parts = end + 2, int(buffer[1:end])
    for _ in range(parts):
        end = buffer.find(b"\r\n", at)
        if end < 0:
            return None
        at = end + 2 + int(buffer[at + 1:end]) + 2
        if at > len(buffer):
            return None
    return at


class SplittingProxy:
    """Forwards 127.0.0.1:<port> to Redis (TCP or unix); once armed, holds a request after its first command.

    :meth:`arm` makes the proxy forward only the first command of the next bytes the client
    sends, set :attr:`holding`, and forward the rest after :attr:`release` is set.
    """

    def __init__(self, redis_url: str) -> None:
        self.target = urlsplit(redis_url)
        self.port = 0
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self._armed = False
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> SplittingProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for writer in self._writers:
            writer.transport.abort()
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), GUARD_S)

    def arm(self) -> None:
        self._armed = True

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.target.scheme == "unix":
            up_r, up_w = await asyncio.open_unix_connection(self.target.path)
        else:
            up_r, up_w = await asyncio.open_connection(self.target.hostname, self.target.port)
        self._writers += [client_w, up_w]

        async def upstream() -> None:
            buffer = b""
            while data := await client_r.read(65536):
                if not self._armed:
                    up_w.write(data)
                    continue
                buffer += data
                first = command_length(buffer)
                if first is None or first == len(buffer):
                    continue  # wait for the first command and what follows it
                self._armed = False
                up_w.write(buffer[:first])
                await up_w.drain()
                self.holding.set()
                await self.release.wait()
                up_w.write(buffer[first:])
                buffer = b""

        async def downstream() -> None:
            while data := await up_r.read(65536):
                client_w.write(data)

        with contextlib.suppress(ConnectionError, OSError):
            await asyncio.gather(upstream(), downstream())


def test_command_length_counts_one_resp_command() -> None:
    one = b"*2\r\n$4\r\nHGET\r\n$1\r\nk\r\n"
    assert command_length(one + b"*1\r\n$4\r\nPING\r\n") == len(one)
    assert command_length(one[:-1]) is None
    assert command_length(b"") is None


async def test_a_stream_ending_between_the_pipelined_reads_never_reads_as_done_below_its_terminal(
        redis_client: aioredis.Redis, keys: Keys, single_redis_url: str) -> None:
    claim = await Leases(redis_client, keys, consumer="c1", lease_s=30).claim(
        stream_id=SID, provider="openai_chat", model="m", entry_id="1-0", now_ms=1_000)
    writer = Appender(redis_client, keys).writer(SID, token=claim.token, last_seq=claim.last_seq)
    await writer.append([StreamStart(stream_id=SID, seq=1, ts=1_000, provider="openai_chat", model="m", metadata={})])
    async with SplittingProxy(single_redis_url) as proxy:
        client = aioredis.Redis(host="127.0.0.1", port=proxy.port)
        try:
            await client.ping()  # the connection and its handshake, before the split
            store = Store(client, keys, page=10)
            proxy.arm()
            async with asyncio.timeout(GUARD_S):
                read = asyncio.create_task(store.tops([SID]))
                await proxy.holding.wait()  # Redis has run the pipeline's first command only
                await writer.append([StreamDone(stream_id=SID, seq=2, ts=2_000, status="completed",
                                                finish_reason="stop", provider_finish_reason="stop",
                                                usage=Usage(input_tokens=1, output_tokens=1), response_id="r",
                                                model="m")])
                proxy.release.set()
                (found,) = await read
            assert not isinstance(found, Exception)
            top, state, terminal, epoch = found
            # state first: it still read "running", and the top read after it holds the terminal event
            assert (top, state, terminal, epoch) == (2, "running", True, None)
            assert await store.tops([SID]) == [(2, "done", True, None)]
        finally:
            await client.aclose()
