"""Live reads are batched across streams: one XREAD for every stream that asked, at most one per interval."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from infra.live_pubsub import live_mode
from publisher.history.entries import Page
from publisher.history.store import Store
from publisher.live.reads import BURST
from publisher.live.topic import Topic
from publisher.state import HUB
from schema.contract import encode_event
from tests.publisher.helpers import (
    API_KEY,
    GUARD_S,
    SSEClient,
    StreamWriter,
    bearer,
    block_start,
    delta,
    eventually,
    make_settings,
    start,
)


class CountingRedis:
    """Forwards to the real client; counts the live reads (``XREAD``) and the ``XRANGE`` of the chosen keys."""

    def __init__(self, inner: Any, keys: set[str]) -> None:
        self._inner, self._keys = inner, keys
        self.xreads: list[int] = []
        """Streams named by each XREAD."""
        self.xranges = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if args and args[0] == "XREAD":
            self.xreads.append((len(args) - 4) // 2)
        return await self._inner.execute_command(*args, **options)

    async def xrange(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name in self._keys:
            self.xranges += 1
        return await self._inner.xrange(name, *args, **kwargs)


async def _readers(ctx, server, sids: list[str]) -> tuple[list[Any], list[SSEClient]]:
    responses = [await ctx.http.get(server.url(f"/v1/streams/{sid}/events"), headers=bearer(API_KEY)) for sid in sids]
    clients = [SSEClient(resp) for resp in responses]
    for client in clients:
        assert (await client.next_event())["id"] == "1"
    return responses, clients


async def _append_all(ctx, sids: list[str], seq: int) -> None:
    """Store seq ``seq`` of every stream, then publish every seq-only notification in one pipeline."""
    mode = await live_mode(ctx.redis)
    for sid in sids:
        await ctx.redis.xadd(ctx.keys.events(sid), {"e": encode_event(delta(sid, seq, 0))}, id=f"0-{seq}")
        await ctx.redis.hset(ctx.keys.meta(sid), "last_seq", seq)
    await _notify_all(ctx, mode, sids, str(seq).encode())


async def _notify_all(ctx, mode: str, sids: list[str], payload: bytes) -> None:
    """Publish one notification per stream in one pipeline (so one pub/sub read can hold them all)."""
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for sid in sids:
            (pipe.spublish if mode == "sharded" else pipe.publish)(ctx.keys.live(sid), payload)
        await pipe.execute()


@pytest.mark.topologies
async def test_seq_only_notifications_of_many_streams_share_one_read(ctx, topology):
    sids = [f"{ctx.sid}_{index}" for index in range(12)]
    counted: list[CountingRedis] = []

    def wrap(client: Any) -> CountingRedis:
        counted.append(CountingRedis(client, {ctx.keys.events(sid) for sid in sids}))
        return counted[0]

    server = await ctx.start_app(make_settings(live_read_ms=300.0), wrap_redis=wrap)
    for sid in sids:
        writer = StreamWriter(ctx.redis, ctx.keys, sid)
        await writer.append(start(sid), block_start(sid, 2, 0), notify=False)
    responses, clients = await _readers(ctx, server, sids)
    for client in clients:
        assert (await client.next_event())["id"] == "2"
    counted[0].xreads.clear()
    counted[0].xranges = 0
    for seq in (3, 4):
        await _append_all(ctx, sids, seq)
        for client in clients:
            assert (await client.next_event())["id"] == str(seq)
    reads = counted[0]
    if topology == "single":  # keys of one node: each round in one or two XREADs, never one read per stream
        assert reads.xranges + len(reads.xreads) <= 4
        assert sum(reads.xreads) + reads.xranges == 2 * len(sids)
    else:  # keys of several slots cannot share a command: one XRANGE per stream and round
        assert (reads.xreads, reads.xranges) == ([], 2 * len(sids))
    for resp in responses:
        resp.close()


async def test_live_reads_are_paced_at_one_per_interval(ctx):
    sids = [f"{ctx.sid}_{index}" for index in range(3)]
    counted: list[CountingRedis] = []

    def wrap(client: Any) -> CountingRedis:
        counted.append(CountingRedis(client, {ctx.keys.events(sid) for sid in sids}))
        return counted[0]

    interval_s = 0.15
    server = await ctx.start_app(make_settings(live_read_ms=interval_s * 1000, live_batch_ms=0.0), wrap_redis=wrap)
    for sid in sids:
        await StreamWriter(ctx.redis, ctx.keys, sid).append(start(sid), notify=False)
    responses, clients = await _readers(ctx, server, sids)
    counted[0].xreads.clear()
    counted[0].xranges = 0
    began = time.monotonic()
    rounds = 12
    for seq in range(2, 2 + rounds):  # a notification every ~20 ms: far more often than the interval
        await _append_all(ctx, sids, seq)
        await asyncio.sleep(0.02)
    for client in clients:
        got = [(await client.next_event())["id"] for _ in range(rounds)]
        assert got == [str(seq) for seq in range(2, 2 + rounds)]
    elapsed = time.monotonic() - began
    reads = len(counted[0].xreads) + counted[0].xranges
    assert reads <= BURST + elapsed / interval_s  # the saved tokens, then one read per interval
    assert reads < rounds * len(sids)
    for resp in responses:
        resp.close()


async def test_a_full_page_is_followed_by_the_next_read(ctx):
    server = await ctx.start_app(make_settings(read_page=4, read_first_page=4))
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        client = SSEClient(resp)
        assert (await client.next_event())["id"] == "1"
        await writer.append(block_start(ctx.sid, 2, 0), *(delta(ctx.sid, seq, 0) for seq in range(3, 12)), notify=False)
        await writer.notify(11)  # one seq-only notification for ten new events: three pages
        assert [(await client.next_event())["id"] for _ in range(10)] == [str(seq) for seq in range(2, 12)]


async def test_a_stream_whose_events_key_changed_type_gets_a_gap_and_the_others_go_on(ctx):
    good, bad = f"{ctx.sid}_good", f"{ctx.sid}_bad"
    for sid in (good, bad):
        await StreamWriter(ctx.redis, ctx.keys, sid).append(start(sid), notify=False)
    responses, clients = await _readers(ctx, ctx.server, [good, bad])
    await ctx.redis.delete(ctx.keys.events(bad))
    await ctx.redis.set(ctx.keys.events(bad), "not a stream")  # every XREAD naming it fails WRONGTYPE
    await ctx.redis.xadd(ctx.keys.events(good), {"e": encode_event(block_start(good, 2, 0))}, id="0-2")
    await _notify_all(ctx, await live_mode(ctx.redis), [good, bad], b"2")
    assert (await clients[0].next_event())["id"] == "2"
    messages = []
    async with asyncio.timeout(GUARD_S):  # its history is gone: stream.gap, then the response ends
        while (message := await clients[1].message()) is not None:
            messages.append(message)
    assert messages[-1]["event"] == "stream.gap"
    assert json.loads(messages[-1]["data"])["after_seq"] == 1
    for resp in responses:
        resp.close()


async def test_a_failing_delivery_ends_only_its_own_streams_readers(ctx, monkeypatch):
    good, bad = f"{ctx.sid}_good", f"{ctx.sid}_bad"
    for sid in (good, bad):
        await StreamWriter(ctx.redis, ctx.keys, sid).append(start(sid), notify=False)
    responses, clients = await _readers(ctx, ctx.server, [good, bad])
    offer = Topic.offer

    def offer_or_fail(topic: Topic, entries: list[Any]) -> None:
        if topic.stream_id == bad:
            raise RuntimeError("a bug in the delivery of one stream")
        offer(topic, entries)

    monkeypatch.setattr(Topic, "offer", offer_or_fail)
    for sid in (good, bad):
        await ctx.redis.xadd(ctx.keys.events(sid), {"e": encode_event(block_start(sid, 2, 0))}, id="0-2")
    await _notify_all(ctx, await live_mode(ctx.redis), [bad, good], b"2")  # one batch, the failing one first
    assert (await clients[0].next_event())["id"] == "2"
    async with asyncio.timeout(GUARD_S):  # closed: its client reconnects and resumes
        assert await clients[1].message() is None
    for resp in responses:
        resp.close()


@pytest.mark.topologies
async def test_read_many_pages_missing_and_caught_up_streams(redis_client, keys, topology):
    store = Store(redis_client, keys, page=3, cluster=topology == "cluster")
    for sid, count in (("st_a", 5), ("st_b", 2)):
        for seq in range(1, count + 1):
            await redis_client.xadd(keys.events(sid), {"e": encode_event(delta(sid, seq, 0))}, id=f"0-{seq}")
    pages = await store.read_many([("st_a", 1), ("st_b", 2), ("st_missing", 0)])
    assert all(isinstance(page, Page) for page in pages)
    assert [[entry.seq for entry in page] for page in pages] == [[2, 3, 4], [], []]  # type: ignore[union-attr]
    assert pages[0][0].frame.startswith(b"id: 2\nevent: block.delta\ndata: ")  # type: ignore[index]


async def test_read_many_gives_a_broken_key_its_own_error(redis_client, keys):
    store = Store(redis_client, keys, page=10)
    await redis_client.xadd(keys.events("st_ok"), {"e": encode_event(start("st_ok"))}, id="0-1")
    await redis_client.set(keys.events("st_str"), "x")
    ok, broken = await store.read_many([("st_ok", 0), ("st_str", 0)])
    assert isinstance(ok, Page)
    assert [entry.seq for entry in ok] == [1]
    assert isinstance(broken, Exception)
    assert "WRONGTYPE" in str(broken)


class _SlowHistory:
    """Forwards to the real client; holds the first ``XRANGE`` of ``key`` from ``slow_min`` for ``hold_s``."""

    def __init__(self, inner: Any, key: str, slow_min: str, hold_s: float) -> None:
        self._inner, self._key, self._slow_min, self._hold_s = inner, key, slow_min, hold_s
        self.held = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def xrange(self, name: str, min: str = "-", max: str = "+", count: int | None = None) -> Any:
        result = await self._inner.xrange(name, min, max, count=count)
        if name == self._key and min == self._slow_min and not self.held.is_set():
            self.held.set()
            await asyncio.sleep(self._hold_s)
        return result


async def test_a_read_owed_when_the_live_set_emptied_does_not_stall_the_next_live_set(ctx):
    """A topic that still owed a read when its last live reader left must not stall the reader that goes live next.

    Reader A is live; a seq-only notification asks for a read, which waits for the read
    interval. Before it starts A leaves while B (joined, replaying history up to that seq)
    is not live yet, so the read is dropped. B then goes live at the top: the next
    notification carrying its events must reach B at once, not wait in the backlog.
    """
    key = ctx.keys.events(ctx.sid)
    slow: list[_SlowHistory] = []

    def wrap(client: Any) -> _SlowHistory:
        slow.append(_SlowHistory(client, key, "(0-1", hold_s=1.5))
        return slow[0]

    server = await ctx.start_app(make_settings(live_read_ms=1000.0, live_batch_ms=0.0), wrap_redis=wrap)
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0), notify=False)
    first = await ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY))
    a = SSEClient(first)
    assert [(await a.next_event())["id"] for _ in range(2)] == ["1", "2"]
    await writer.append(delta(ctx.sid, 3, 0))  # seq-only: a live read, which starts the interval
    assert (await a.next_event())["id"] == "3"
    await writer.append(delta(ctx.sid, 4, 0))  # seq-only: a read owed, due a second after the last
    joining = asyncio.ensure_future(ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"),
                                                 headers=bearer(API_KEY) | {"Last-Event-ID": "1"}))
    async with asyncio.timeout(GUARD_S):
        await slow[0].held.wait()  # B's history read (2..4) is held: B is joined, not live
    first.close()
    hub = server.app[HUB]
    await eventually(lambda: hub.reader_count(ctx.sid) == 1)
    second = await joining
    b = SSEClient(second)
    assert [(await b.next_event())["id"] for _ in range(3)] == ["2", "3", "4"]  # B is live at 4
    await writer.append(delta(ctx.sid, 5, 0), full=True)  # carries its event: delivered without a read
    async with asyncio.timeout(3.0):
        assert (await b.next_event())["id"] == "5"
    second.close()


async def test_a_broken_events_key_does_not_stop_the_audit_of_the_other_streams(ctx):
    """A quiet stream whose events key became another type must not fail the audit of every stream.

    The good stream's notification is lost; only the audit can find its new entry, and the
    audit's one pipeline also names the broken key.
    """
    server = await ctx.start_app(make_settings(heartbeat_s=0.6))
    good, bad = f"{ctx.sid}_good", f"{ctx.sid}_bad"
    for sid in (good, bad):
        await StreamWriter(ctx.redis, ctx.keys, sid).append(start(sid), notify=False)
    responses, clients = await _readers(ctx, server, [good, bad])
    await ctx.redis.delete(ctx.keys.events(bad))
    await ctx.redis.set(ctx.keys.events(bad), "not a stream")  # no notification: only the audit reads it
    await StreamWriter(ctx.redis, ctx.keys, good).append(block_start(good, 2, 0), notify=False)  # lost
    async with asyncio.timeout(GUARD_S):  # heartbeats alone would never end the wait
        assert (await clients[0].next_event())["id"] == "2"
    for resp in responses:
        resp.close()


@pytest.mark.topologies
async def test_tops_gives_a_broken_key_its_own_error(redis_client, keys, topology):
    store = Store(redis_client, keys, page=10, cluster=topology == "cluster")
    await redis_client.xadd(keys.events("st_ok"), {"e": encode_event(start("st_ok"))}, id="0-1")
    await redis_client.hset(keys.meta("st_ok"), "state", "running")
    await redis_client.set(keys.events("st_str"), "x")
    ok, broken, missing = await store.tops(["st_ok", "st_str", "st_missing"])
    assert (ok, missing) == ((1, "running", False, None), (None, None, False, None))
    assert isinstance(broken, Exception)
    assert "WRONGTYPE" in str(broken)
