"""The read-ahead of a history replay: held while the write it overlaps completes in time, let go after.

Real publisher, real sockets, real Redis. A client that stops reading is an aiohttp client
on a socket with a 4 KB receive buffer whose body is not read (aiohttp stops reading the
socket once its buffer is full), so a 12 MB page cannot be written; when it reads again,
it reads every event. Pages are small (``read_first_page=2``, ``read_page=256``) so
the stream's layout puts the stalled write and the pages around it in known places.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import pytest

from publisher.state import HUB, TELEMETRY
from schema.contract import encode_event
from tests.publisher.helpers import (
    API_KEY,
    HookedRedis,
    SSEClient,
    StreamWriter,
    bearer,
    block_start,
    delta,
    done,
    eventually,
    ids,
    make_settings,
    recording_redis,
    start,
    text_stream,
)

FIRST_PAGE, PAGE = 2, 256
BIG = 240
"""Deltas of 48 KB at seqs 3..242, inside the second page (3..258): 11.5 MB, more than the
kernel takes for a stalled socket (about 4 MB on loopback)."""
TOP = 700
"""Seqs stored before the readers come: a running stream (no terminal)."""
AHEAD = f"(0-{FIRST_PAGE + PAGE}"
"""The read ahead while the second page is written: ``XRANGE (0-258 + COUNT 256``."""
SETTINGS = {"read_first_page": FIRST_PAGE, "read_page": PAGE, "read_ahead_hold_ms": 300.0,
            "reader_budget_bytes": 1 << 30}
"""The stalled reader holds a 12 MB page: past the default FANOUT_READER_BUDGET_BYTES it would be dropped
after FANOUT_READER_STALL_MS (tests/publisher/test_reader_budget.py), and these tests follow it to the end."""


def _small_buffer_socket(addr_info: Any) -> socket.socket:
    family, kind, proto, _, _ = addr_info
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return sock


async def _store(ctx: Any) -> None:
    """Store seqs 1..TOP (the big deltas first) and meta, in one pipeline."""
    events = [start(ctx.sid), block_start(ctx.sid, 2, 0)]
    events += [delta(ctx.sid, seq, 0, "y" * 48_000 if seq < 3 + BIG else f"t{seq} ") for seq in range(3, TOP + 1)]
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).meta(last_seq=TOP)
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for event in events:
            pipe.xadd(ctx.keys.events(ctx.sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
        await pipe.execute()


async def _read_to(client: SSEClient, last: int) -> list[int]:
    got: list[int] = []
    while not got or got[-1] < last:
        message = await client.next_event()
        assert message is not None, f"the response ended after {got[-1:]}"
        got.append(int(message["id"]))
    return got


class _GatedRedis(HookedRedis):
    """Records XRANGEs of the events key and holds the first one from ``AHEAD`` until ``release`` is set."""

    def __init__(self, inner: Any, key: str) -> None:
        async def nothing() -> None:
            return None

        super().__init__(inner, key, lambda result: False, nothing)
        self.entered, self.release = asyncio.Event(), asyncio.Event()

    async def xrange(self, name, min="-", max="+", count=None):
        if name == self._key and min == AHEAD and not self.entered.is_set():
            self.entered.set()
            await self.release.wait()
        return await super().xrange(name, min, max, count)


async def test_a_reader_that_stops_reading_mid_replay_lets_its_read_ahead_go_then_gets_every_event_once_and_goes_live(
        ctx):
    wrap, hooked = recording_redis(ctx.keys.events(ctx.sid))
    server = await ctx.start_app(make_settings(**SETTINGS), wrap_redis=wrap)
    telemetry = server.app[TELEMETRY]
    await _store(ctx)
    connector = aiohttp.TCPConnector(socket_factory=_small_buffer_socket)
    async with aiohttp.ClientSession(connector=connector) as http, \
            http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        assert resp.status == 200
        await eventually(lambda: telemetry.read_ahead_dropped == 1)  # the second page's write outlasted the hold
        assert telemetry.read_ahead_pages == 0  # no response holds a page read ahead
        client = SSEClient(resp)
        assert await _read_to(client, TOP) == list(range(1, TOP + 1))
        topic = server.app[HUB]._topics[ctx.sid]
        await eventually(lambda: len(topic.live) == 1)
        writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
        await writer.append(delta(ctx.sid, TOP + 1, 0), done(ctx.sid, TOP + 2), full=True)
        assert ids(await client.events()) == [TOP + 1, TOP + 2]
    assert telemetry.delivered["live"] == 2
    calls = hooked[0].xrange_calls
    assert calls.count(AHEAD) == 2  # read ahead and let go, then read again once the write completed
    assert len(calls) == len(set(calls)) + 1  # every other page read once
    assert telemetry.read_ahead_dropped == 1
    assert telemetry.read_ahead_pages == 0


async def test_letting_go_of_a_shared_read_ahead_leaves_it_to_the_reader_still_awaiting_it(ctx):
    gated: list[_GatedRedis] = []

    def wrap(client: Any) -> _GatedRedis:
        gated.append(_GatedRedis(client, ctx.keys.events(ctx.sid)))
        return gated[0]

    server = await ctx.start_app(make_settings(**SETTINGS), wrap_redis=wrap)
    telemetry, gate = server.app[TELEMETRY], gated
    await _store(ctx)
    url = server.url(f"/v1/streams/{ctx.sid}/events")
    connector = aiohttp.TCPConnector(socket_factory=_small_buffer_socket)
    async with aiohttp.ClientSession(connector=connector) as stalled_http, \
            stalled_http.get(url, headers=bearer(API_KEY)) as stalled:
        await gate[0].entered.wait()  # the stalled reader's read ahead of seqs 259.. is in flight
        # this reader's first page is 257..258, so it reads ahead from 258 too: the same shared read
        async with ctx.http.get(url, headers={**bearer(API_KEY), "Last-Event-ID": str(PAGE)}) as fast:
            client = SSEClient(fast)
            assert await _read_to(client, FIRST_PAGE + PAGE) == [PAGE + 1, PAGE + 2]
            await eventually(lambda: telemetry.read_ahead_dropped == 1)  # the stalled one let go
            gate[0].release.set()
            assert await _read_to(client, TOP) == list(range(FIRST_PAGE + PAGE + 1, TOP + 1))
        assert await _read_to(SSEClient(stalled), TOP) == list(range(1, TOP + 1))
    assert gate[0].xrange_calls.count(AHEAD) == 2  # once shared by both, once again by the reader that let go
    assert telemetry.read_ahead_dropped == 1
    await eventually(lambda: telemetry.read_ahead_pages == 0)


async def _replay_recorded(ctx: Any, **settings: Any) -> tuple[list[str], Any]:
    """Replay a 5004-event stream from the start with the default pages; return its reads and telemetry."""
    wrap, hooked = recording_redis(ctx.keys.events(ctx.sid))
    server = await ctx.start_app(make_settings(**settings), wrap_redis=wrap)
    events = text_stream(ctx.sid, 5000)  # 5004 events: pages of 256, 2048, 2048, then 652 with the terminal
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).meta(last_seq=events[-1].seq)
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for event in events:
            pipe.xadd(ctx.keys.events(ctx.sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
        await pipe.execute()
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        assert ids(await SSEClient(resp).events()) == list(range(1, events[-1].seq + 1))
    return hooked[0].xrange_calls, server.app[TELEMETRY]


async def test_a_reader_that_keeps_up_reads_every_page_once_and_ahead(ctx):
    calls, telemetry = await _replay_recorded(ctx)  # the default hold
    assert calls == ["(0-0", "(0-256", "(0-2304", "(0-4352"]  # one read per page, as before the hold existed
    assert telemetry.read_ahead_started == 3  # each page after the first was read ahead
    assert telemetry.read_ahead_dropped == 0
    assert telemetry.read_ahead_pages == 0


async def test_a_hold_of_zero_reads_each_page_after_the_write_before_it(ctx):
    calls, telemetry = await _replay_recorded(ctx, read_ahead_hold_ms=0)
    assert calls == ["(0-0", "(0-256", "(0-2304", "(0-4352"]  # the same reads
    assert telemetry.read_ahead_started == 0  # none of them ahead


@pytest.mark.parametrize("hold_ms", [0.0, 300.0])
async def test_a_gap_after_a_page_read_ahead_or_not_is_a_gap_frame(ctx, hold_ms):
    server = await ctx.start_app(make_settings(read_first_page=2, read_page=4, read_ahead_hold_ms=hold_ms))
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta(last_seq=12)
    async with ctx.redis.pipeline(transaction=False) as pipe:  # seq 7 is missing: trimmed, say
        for event in [start(ctx.sid), block_start(ctx.sid, 2, 0), *(delta(ctx.sid, s, 0) for s in range(3, 13))]:
            if event.seq != 7:
                pipe.xadd(ctx.keys.events(ctx.sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
        await pipe.execute()
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        client = SSEClient(resp)
        messages = []
        while (message := await client.message()) is not None:
            messages.append(message)
    assert [int(m["id"]) for m in messages if "id" in m] == [1, 2, 3, 4, 5, 6]
    assert messages[-1]["event"] == "stream.gap"

