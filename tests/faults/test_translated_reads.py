"""/agui and /durable read by hostile and slow clients: what the breaker round on the translated routes found.

A real ``fanout publisher`` on a private Redis, clients on raw sockets (docs/faults.md,
"Translated reads"):

* a client that reads steadily, but slower than ``FANOUT_READER_BUDGET_BYTES`` per
  ``FANOUT_READER_STALL_MS``, gets a history page larger than its budget through ``/agui``
  and ``/durable?live=sse`` in one response, as it does through ``/events`` (the page is
  written in slices, each waiting on its own; a whole page written at once was one wait
  past the stall time: the client was dropped on every try and never got past that page);
* a client that stops reading is still dropped over its budget, and resumes;
* a Durable Streams offset is ASCII digits only: Unicode digits (Arabic-Indic, fullwidth)
  are a ``400``, not another spelling of a seq.
"""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import quote

import aiohttp
import pytest
import redis.asyncio as aioredis

from schema.keys import Keys
from tests.faults.conftest import StartPublisher
from tests.faults.polling import until
from tests.faults.procs import PublisherProcess, log_problems
from tests.faults.sse import GUARD_S, StallClient
from tests.faults.streams import Writer, text_script
from tests.publisher.helpers import token_for
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.faults

SID = "st_translated"
TOP, BIG_DELTAS, BIG_BYTES = 48, 40, 100_000
"""The stream: seqs 1..48, ending ``stream.done``; 40 deltas of 100 KB (4 MB) in its first page."""
SLOW = {"FANOUT_READER_BUDGET_BYTES": 1 << 20, "FANOUT_READER_STALL_MS": 2000, "FANOUT_READ_PAGE": 64}
"""A 1 MB reader budget and a 500 ms stall: the paced client below takes seconds over the 4 MB page."""
PACE_S = 0.01
"""The paced client reads what its 4 KB socket buffer holds every 10 ms: steady, a few hundred KB/s."""
PATHS = {"agui": f"/v1/streams/{SID}/agui", "durable-sse": f"/v1/streams/{SID}/durable?offset=-1&live=sse",
         "events": f"/v1/streams/{SID}/events"}
LAST = {"agui": '"RUN_FINISHED"', "durable-sse": '"streamClosed":true', "events": '"stream.done"'}
"""What the last message of a complete read holds, per path."""


class PathClient(StallClient):
    """A :class:`StallClient` of any read path of its stream (``/agui``, ``/durable?...``)."""

    def __init__(self, port: int, path: str, credential: str) -> None:
        super().__init__(port, SID, credential)
        self.path = path

    async def connect(self) -> None:
        """Open the socket (4 KB receive buffer) and send ``GET <path>`` with the credential."""
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        self._reader, self._writer = await asyncio.open_connection(sock=sock, limit=4096)
        request = f"GET {self.path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.credential}\r\n\r\n"
        self._writer.write(request.encode())
        await self._writer.drain()

    async def read_paced(self) -> None:
        """Read the response to its end (or the connection's) at a steady pace: never a pause over :data:`PACE_S`."""
        async with asyncio.timeout(GUARD_S * 4):
            while await self.read_some():  # noqa: ASYNC110  # the pause is the point: a slow client
                await asyncio.sleep(PACE_S)

    def complete(self, last: str) -> bool:
        """True when the response ended cleanly (chunked end) after a message holding ``last``."""
        data = [frame.data for frame in self.frames if frame.data is not None]
        return self.status == 200 and self.ended and bool(data) and last in data[-1]


async def stored_stream(client: aioredis.Redis, keys: Keys) -> None:
    """Store the stream (a 4 MB first page), ended."""
    script = text_script(SID, TOP, big=BIG_DELTAS, big_bytes=BIG_BYTES, terminal=True)
    await Writer(client, keys).meta(SID, epoch="e1")
    await Writer(client, keys).store(script.events)


@pytest.mark.parametrize("route", list(PATHS))
async def test_a_slow_steady_client_gets_a_page_over_its_budget_in_one_response(
        route: str, server: RedisServer, client: aioredis.Redis, keys: Keys,
        start_publisher: StartPublisher) -> None:
    publisher = await start_publisher(server.url, keys.prefix, **SLOW)
    await stored_stream(client, keys)
    reader = PathClient(publisher.port, PATHS[route], token_for(SID))
    await reader.connect()
    try:
        await reader.read_paced()
    finally:
        reader.close()
    assert reader.complete(LAST[route]), (route, reader.status, reader.frames[-1:] if reader.frames else None)
    assert log_problems(publisher.log()) == []


@pytest.mark.parametrize("route", ["agui", "durable-sse"])
async def test_a_client_that_stops_reading_is_still_dropped_over_its_budget(
        route: str, server: RedisServer, client: aioredis.Redis, keys: Keys,
        start_publisher: StartPublisher) -> None:
    publisher = await start_publisher(server.url, keys.prefix, **SLOW, metrics=True)
    await stored_stream(client, keys)
    stalled = PathClient(publisher.port, PATHS[route], token_for(SID))
    await stalled.connect()
    await until(stalled.read_some, "the first bytes")  # then it reads nothing more
    try:
        await until(lambda: _drops(publisher), "the stalled reader dropped over its budget")
    finally:
        stalled.close()
    again = PathClient(publisher.port, PATHS[route], token_for(SID))
    await again.connect()
    try:
        await again.read_paced()
    finally:
        again.close()
    assert again.complete(LAST[route])


async def _drops(publisher: PublisherProcess) -> bool:
    return await publisher.metric("fanout_sse_budget_drops_total") >= 1


UNICODE_OFFSETS = ["000000000000000\u0663", "\u0660" * 15 + "\u0665", "\uff10" * 15 + "5", "\u0663" * 16 + ".e1"]
"""Seq digits a regex's ``\\d`` and ``int()`` take but no server mints: Arabic-Indic and fullwidth."""


async def test_durable_parameters_are_ascii_and_given_once(
        server: RedisServer, client: aioredis.Redis, keys: Keys, start_publisher: StartPublisher) -> None:
    publisher = await start_publisher(server.url, keys.prefix)
    await Writer(client, keys).meta(SID, epoch="e1")
    await Writer(client, keys).store(text_script(SID, 8, terminal=True).events)
    auth, base = {"Authorization": f"Bearer {token_for(SID)}"}, f"{publisher.base}/v1/streams/{SID}/durable"
    answers = []
    async with aiohttp.ClientSession() as http:
        for offset in UNICODE_OFFSETS:
            for live in ("", "&live=long-poll", "&live=sse"):
                async with http.get(f"{base}?offset={quote(offset)}{live}", headers=auth) as resp:
                    answers.append((offset, live, resp.status, (await resp.json())["type"].rsplit("/", 1)[-1]))
        async with http.get(f"{base}?offset=-1&live=sse&live=long-poll", headers=auth) as resp:
            twice = resp.status, (await resp.json())["type"].rsplit("/", 1)[-1], resp.headers["X-Content-Type-Options"]
        async with http.get(f"{base}?offset=0000000000000000", headers=auth) as resp:
            start_cache = resp.status, resp.headers["Cache-Control"]
        async with http.get(f"{base}?offset=0000000000000002.e1", headers=auth) as resp:
            chunk_cache = resp.status, resp.headers["Cache-Control"]
    assert {answer[2:] for answer in answers} == {(400, "invalid-position")}, answers
    assert twice == (400, "invalid-field", "nosniff")
    assert start_cache == (200, "no-store")  # the stream's start, as from -1: it can be written again
    assert chunk_cache[1].startswith("private, max-age=")
    assert log_problems(publisher.log()) == []
