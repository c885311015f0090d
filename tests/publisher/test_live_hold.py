"""A seq-only notification waiting for its read token holds the subscriber connection that long.

Reading the live channel again before the stored-stream read it asked for can start
costs a wake-up and a socket read and serves nobody sooner; so after a read whose
notifications asked for a read, the subscriber connection rests until the next read
token (``LiveReads.hold_s``), and what arrives meanwhile comes in one socket read.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from publisher.history.store import Store
from publisher.live.pubsub import PubSubLink, endpoint_of
from publisher.live.reader import Reader
from publisher.live.reads import BURST, HOLD_MAX_S, LiveReads
from publisher.live.topic import Topic
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
    running_publisher,
    start,
    token_for,
)


async def test_hold_is_zero_while_tokens_are_saved_and_the_capped_token_wait_once_they_are_spent(redis_client, keys):
    interval_s = 5.0  # long beside the test's own steps: no token comes back meanwhile
    reads = LiveReads(Store(redis_client, keys, page=100), interval_s)
    task = reads.start()
    try:
        topic = Topic("st_hold", b"hold:live", reads.want)
        reader = Reader("st_hold", 0, 10)
        topic.readers.add(reader)
        assert topic.go_live(reader)
        for _ in range(int(BURST) - 1):  # tokens left: a read asked for now starts at once
            assert reads.hold_s() == 0.0
            topic.kick()
            assert reads.hold_s() == 0.0  # the queued read takes one saved token, another is left
            await eventually(lambda: not topic.pending and not topic.reading)
        topic.kick()  # takes the last saved token
        assert reads.hold_s() == HOLD_MAX_S  # the next read waits for a token seconds away: capped
        await eventually(lambda: not topic.pending and not topic.reading)
        assert reads.hold_s() == HOLD_MAX_S
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_carried_notification_is_not_held_behind_a_seq_only_read_waiting_for_its_token(ctx):
    """Stream A's seq-only notifications spend every read token (one per 5 s, then), so
    after reading A's last one the subscriber connection rests for the next token; B's
    notification, carrying its event, published during that rest, reaches its reader
    after at most ``HOLD_MAX_S`` of it, not after the seconds until that token."""
    seq_only, carried = f"{ctx.sid}_a", f"{ctx.sid}_b"
    interval_s = 5.0
    server = await ctx.start_app(make_settings(live_read_ms=interval_s * 1000, live_batch_ms=1.0))
    writers = {sid: StreamWriter(ctx.redis, ctx.keys, sid) for sid in (seq_only, carried)}
    for writer in writers.values():
        await writer.append(start(writer.sid), notify=False)
    responses = [await ctx.http.get(server.url(f"/v1/streams/{sid}/events"), headers=bearer(API_KEY))
                 for sid in (seq_only, carried)]
    try:
        client_a, client_b = (SSEClient(resp) for resp in responses)
        for client in (client_a, client_b):
            assert (await client.next_event())["id"] == "1"
        for seq in range(2, 2 + int(BURST)):  # one read each: the last takes the last saved token
            await writers[seq_only].append(delta(seq_only, seq, 0))
            assert (await client_a.next_event())["id"] == str(seq)
        published = time.monotonic()
        await writers[carried].append(delta(carried, 2, 0), full=True)
        assert (await client_b.next_event())["id"] == "2"
        assert time.monotonic() - published < interval_s / 2  # not held until the token, 5 s after A's last read
    finally:
        for resp in responses:
            resp.close()


async def _link(redis_client: Any, hold_s: float) -> tuple[PubSubLink, list[list[bytes]], bytes]:
    """Open a link subscribed to a fresh channel; return it, the messages of each socket read, the channel."""
    channel = f"hold:{time.time_ns()}".encode()
    reads: list[list[bytes]] = [[]]
    subscribed = asyncio.Event()

    def push(reply: Any) -> None:
        if reply[0] == b"message":
            reads[-1].append(reply[2])
        elif reply[0] == b"subscribe":
            subscribed.set()

    def read_done() -> None:
        if reads[-1]:
            reads.append([])

    link = PubSubLink(endpoint_of(redis_client), push, lambda exc: None, 0.001, read_done, hold=lambda: hold_s)
    await link.connect()
    link.send("SUBSCRIBE", channel)
    await subscribed.wait()
    return link, reads, channel


async def test_the_subscriber_connection_rests_for_the_hold_and_reads_what_came_meanwhile_at_once(redis_client):
    hold_s = 0.5
    link, reads, channel = await _link(redis_client, hold_s)
    try:
        await redis_client.publish(channel, b"1")
        await eventually(lambda: reads[0] == [b"1"] and len(reads) == 2)
        read_at = time.monotonic()  # the socket now rests for the hold
        for payload in (b"2", b"3", b"4"):
            await redis_client.publish(channel, payload)
            await asyncio.sleep(0.05)
        published_s = time.monotonic() - read_at
        await eventually(lambda: len(reads) == 3)
        if published_s < hold_s:  # all three were published within the rest: one socket read holds them
            assert reads[1] == [b"2", b"3", b"4"]
        assert time.monotonic() - read_at >= hold_s - 0.01  # the loop's timers round to the millisecond
    finally:
        link.close()


async def test_without_a_hold_each_message_is_read_when_it_comes(redis_client):
    link, reads, channel = await _link(redis_client, 0.0)
    try:
        for count, payload in enumerate((b"1", b"2", b"3"), 2):
            await redis_client.publish(channel, payload)
            await eventually(lambda n=count: len(reads) >= n)
        assert reads[:3] == [[b"1"], [b"2"], [b"3"]]
    finally:
        link.close()


async def _deplete_read_tokens(writer: StreamWriter, first_seq: int) -> int:
    """Send seq-only notifications, each asking for its own read, until the saved read tokens are spent."""
    seq = first_seq
    for _ in range(int(BURST) + 2):
        await writer.append(delta(writer.sid, seq, 0, f"s{seq}"))
        seq += 1
        await asyncio.sleep(0.02)
    return seq


async def _first_events(http: aiohttp.ClientSession, base: str, sid: str, count: int) -> list[int]:
    got: list[int] = []
    async with http.get(f"{base}/v1/streams/{sid}/events", headers=bearer(token_for(sid))) as resp:
        assert resp.status == 200
        client = SSEClient(resp)
        while len(got) < count and (message := await client.next_event()) is not None:
            got.append(int(message["id"]))
    return got


async def test_notifications_that_carry_events_are_not_held_behind_seq_only_ones(redis_url, redis_client, keys):
    """A stream whose notifications carry their events needs no read: its deliveries do not
    wait for the read token that a seq-only stream on the same connection is waiting for
    (FANOUT_LIVE_READ_MS=1000 would hold them up to a second or two)."""
    settings = make_settings(live_read_ms=1000.0, live_batch_ms=3.0)
    seq_only, full = StreamWriter(redis_client, keys, "st_seqonly"), StreamWriter(redis_client, keys, "st_full")
    for writer in (seq_only, full):
        await writer.meta()
        await writer.append(start(writer.sid), block_start(writer.sid, 2, 0), full=writer is full)
    async with running_publisher(redis_url, keys, settings) as base, aiohttp.ClientSession() as http:
        received: dict[int, float] = {}

        async def follow() -> None:
            async with http.get(f"{base}/v1/streams/{full.sid}/events", headers=bearer(token_for(full.sid))) as resp:
                client = SSEClient(resp)
                while (message := await client.next_event()) is not None:
                    received[int(message["id"])] = time.monotonic()
                    if int(message["id"]) == 7:
                        return

        follower = asyncio.create_task(follow())
        async with http.get(f"{base}/v1/streams/{seq_only.sid}/events",
                            headers=bearer(token_for(seq_only.sid))) as resp:
            client = SSEClient(resp)
            assert [int((await client.next_event() or {})["id"]) for _ in range(2)] == [1, 2]
            await eventually(lambda: 2 in received)
            seq = 3
            latencies = []
            for full_seq in range(3, 8):
                seq = await _deplete_read_tokens(seq_only, seq)
                sent = time.monotonic()
                await full.append(delta(full.sid, full_seq, 0, f"f{full_seq}"), full=True)
                await eventually(lambda s=full_seq: s in received)
                latencies.append(received[full_seq] - sent)
        await asyncio.wait_for(follower, GUARD_S)
        assert max(latencies) < 0.4, latencies  # a hold would be about the 1 s read interval


async def test_a_reader_joining_while_the_connection_rests_is_confirmed_without_waiting_for_the_hold(
        redis_url, redis_client, keys):
    """Only seq-only streams are live, so the subscriber connection rests until the next read
    token (up to two 1 s intervals); a reader that joins meanwhile must not wait that long
    for its subscription's confirmation (with FANOUT_SUBSCRIBE_TIMEOUT_S below the hold it
    would be turned away)."""
    settings = make_settings(live_read_ms=1000.0, live_batch_ms=3.0, subscribe_timeout_s=0.5)
    busy, joiner = StreamWriter(redis_client, keys, "st_busy"), StreamWriter(redis_client, keys, "st_joiner")
    for writer in (busy, joiner):
        await writer.meta()
        await writer.append(start(writer.sid), block_start(writer.sid, 2, 0))
    async with running_publisher(redis_url, keys, settings) as base, aiohttp.ClientSession() as http, \
            http.get(f"{base}/v1/streams/{busy.sid}/events", headers=bearer(token_for(busy.sid))) as resp:
        client = SSEClient(resp)
        assert [int((await client.next_event() or {})["id"]) for _ in range(2)] == [1, 2]
        await _deplete_read_tokens(busy, 3)  # the last of them leaves the connection resting
        began = time.monotonic()
        assert await _first_events(http, base, joiner.sid, 2) == [1, 2]
        assert time.monotonic() - began < 0.4
