"""The fan-out hub: hand-over without loss (B18), one subscription per stream, overflow, projections."""

from __future__ import annotations

import asyncio
import json
import random
import socket

import aiohttp
import pytest

from publisher.history.entries import Entry
from publisher.live.hub import UNSUBSCRIBE_DELAY_S
from publisher.live.reader import Reader
from publisher.state import HUB
from tests.conftest import client_for, delete_prefix
from tests.publisher.helpers import (
    API_KEY,
    GUARD_S,
    HookedRedis,
    SSEClient,
    StreamWriter,
    bearer,
    block_start,
    delta,
    done,
    drain_socket,
    eventually,
    ids,
    make_settings,
    recording_redis,
    running_publisher,
    start,
    stop,
    text_stream,
    token_for,
)
from tests.worker.support import command_calls

# --- B18 ----------------------------------------------------------------------------------------

async def _b18(start_app, http, redis_client, keys, when, *, preload: bool = True) -> HookedRedis:
    sid = "st_t18"
    writer = StreamWriter(redis_client, keys, sid)
    await writer.meta()
    if preload:
        await writer.append(start(sid))
    hooked: list[HookedRedis] = []

    async def append_2() -> None:
        if not preload:
            await writer.append(start(sid))
        await writer.append(block_start(sid, 2, 0))  # XADD 0-2 + the worker's usual PUBLISH

    def wrap(client):
        hooked.append(HookedRedis(client, keys.events(sid), when, append_2))
        return hooked[0]

    server = await start_app(wrap_redis=wrap)
    async with http.get(server.url(f"/v1/streams/{sid}/events"), headers=bearer(token_for(sid))) as resp:
        assert resp.status == 200
        assert resp.content_type == "text/event-stream"
        client = SSEClient(resp)
        got = [await client.next_event(), await client.next_event()]  # id 2 needs no further append
        assert ids(got) == [1, 2]
        await writer.append(delta(sid, 3, 0), stop(sid, 4, 0), done(sid, 5))
        got += await client.events()  # the response ends after id 5
    assert ids(got) == [1, 2, 3, 4, 5]
    assert hooked[0].fired
    return hooked[0]


async def test_b18_live_tail_never_loses_entry_appended_during_empty_wait(ctx):
    hooked = await _b18(ctx.start_app, ctx.http, ctx.redis, ctx.keys, when=lambda result: result == [], preload=False)
    # the cursor is concrete from the start and afterwards always the last seq handled
    assert hooked.xrange_calls[0] == "(0-0"
    assert all(call in ("(0-0", "(0-1", "(0-2", "(0-3", "(0-4") for call in hooked.xrange_calls)
    assert "$" not in hooked.xrange_calls


async def test_b18_entry_appended_during_history_read_is_not_lost(ctx):
    await _b18(ctx.start_app, ctx.http, ctx.redis, ctx.keys, when=lambda result: len(result) == 1)


async def test_concurrent_readers_at_random_positions_get_exact_sequences(ctx):
    server = await ctx.start_app(make_settings(read_page=4))
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    events = text_stream(ctx.sid, 120)
    last = events[-1].seq
    rng = random.Random(7)

    async def read(position: int) -> list[int]:
        headers = bearer(token_for(ctx.sid))
        if position:
            headers["Last-Event-ID"] = str(position)
        while True:
            async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=headers) as resp:
                if resp.status == 410:  # asked before the worker stored that far: retry
                    await asyncio.sleep(0.001)
                    continue
                assert resp.status == 200
                return ids(await SSEClient(resp).events())

    async def write() -> None:
        for event in events:
            await writer.append(event)
            if rng.random() < 0.3:
                await asyncio.sleep(0)

    await writer.meta()
    readers = []
    for _ in range(12):
        readers.append(asyncio.create_task(read(rng.randrange(0, 20))))
    got = await asyncio.gather(write(), *readers)
    for sequence in got[1:]:
        assert sequence == list(range(sequence[0], last + 1))


# --- one subscription per stream --------------------------------------------------------------

async def _numsub(redis_client, channel: str) -> int:
    return dict(await redis_client.pubsub_numsub(channel))[channel.encode()]


async def test_one_subscription_per_stream_however_many_readers(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    other = StreamWriter(ctx.redis, ctx.keys, ctx.sid + "_b")
    await writer.append(start(ctx.sid))
    await other.append(start(ctx.sid + "_b"))
    responses = []
    for stream, count in ((ctx.sid, 5), (ctx.sid + "_b", 3)):
        for _ in range(count):
            resp = await ctx.http.get(ctx.server.url(f"/v1/streams/{stream}/events"), headers=bearer(API_KEY))
            assert (await SSEClient(resp).next_event())["id"] == "1"
            responses.append(resp)
    hub = ctx.server.app[HUB]
    assert hub.reader_count(ctx.sid) == 5
    assert await _numsub(ctx.redis, ctx.keys.live(ctx.sid)) == 1
    assert await _numsub(ctx.redis, ctx.keys.live(ctx.sid + "_b")) == 1
    for resp in responses[:5]:
        resp.close()
    await eventually(lambda: hub.reader_count(ctx.sid) == 0)

    async def unsubscribed() -> bool:
        return await _numsub(ctx.redis, ctx.keys.live(ctx.sid)) == 0

    await eventually(unsubscribed)
    assert await _numsub(ctx.redis, ctx.keys.live(ctx.sid + "_b")) == 1
    for resp in responses[5:]:
        resp.close()


async def test_readers_share_one_xrange_per_notification(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    wrap, hooked = recording_redis(ctx.keys.events(ctx.sid))
    server = await ctx.start_app(wrap_redis=wrap)
    clients, responses = [], []
    for _ in range(4):
        resp = await ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY))
        responses.append(resp)
        clients.append(SSEClient(resp))
        assert (await clients[-1].next_event())["id"] == "1"
    await asyncio.sleep(0.05)  # let the join-time reads settle
    before = len(hooked[0].xrange_calls)
    await writer.append(block_start(ctx.sid, 2, 0))
    for client in clients:
        assert (await client.next_event())["id"] == "2"
    assert len(hooked[0].xrange_calls) - before == 1
    for resp in responses:
        resp.close()


# --- overflow ---------------------------------------------------------------------------------

def _entry(seq: int) -> Entry:
    return Entry(seq=seq, type="block.delta", ts_ms=0, block_index=0, block_kind="text", visibility=None, frame=b"x")


async def test_reader_queue_holds_exactly_its_limit_and_overflows_one_past():
    overflowed: list[bool] = []
    reader = Reader("s", 0, 3, lambda: overflowed.append(True))
    for seq in (1, 2, 3):
        reader.offer(_entry(seq))
    assert reader.queued() == 3
    assert reader.closed is None
    reader.offer(_entry(4))
    assert reader.closed == "overflow"
    assert overflowed == [True]


async def test_reader_gap_closes_after_delivering_what_came_before():
    reader = Reader("s", 0, 10)
    reader.offer(_entry(1))
    reader.offer(_entry(3))
    assert reader.closed == "gap"
    assert reader.gap == (1, 3)
    assert (await reader.next(1.0)).seq == 1
    assert await reader.next(1.0) is None



async def test_slow_reader_overflow_closes_only_that_reader(ctx):
    server = await ctx.start_app(make_settings(client_queue=32))
    hub = server.app[HUB]
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    fast_resp = await ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY))
    fast = SSEClient(fast_resp)
    assert (await fast.next_event())["id"] == "1"
    host, port = server.base_url.removeprefix("http://").split(":")
    slow = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect((host, int(port)))
    request = f"GET /v1/streams/{ctx.sid}/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n\r\n"
    slow.sendall(request.encode())
    try:
        await eventually(lambda: hub.reader_count(ctx.sid) == 2)
        fast_ids, seq, text = [1], 1, "z" * 4000
        while hub.reader_count(ctx.sid) == 2 and seq < 6000:  # bounded: the slow one must overflow well before
            for _ in range(8):
                seq += 1
                await writer.append(delta(ctx.sid, seq, 0, text))
            while fast_ids[-1] < seq:
                fast_ids.append(int((await fast.next_event())["id"]))
        assert hub.reader_count(ctx.sid) == 1, "the slow reader was closed on overflow"
        await writer.append(done(ctx.sid, seq + 1))
        fast_ids += ids(await fast.events())
        assert fast_ids == list(range(1, seq + 2))
        print(f"slow reader overflowed after {seq} events")
        assert b"stream.done" not in await asyncio.to_thread(drain_socket, slow)
    finally:
        fast_resp.close()
        slow.close()


# --- projections ------------------------------------------------------------------------------

def _reasoning_then_text(sid: str, visibility: str) -> list:
    return [
        start(sid),
        block_start(sid, 2, 0, "reasoning", visibility),
        delta(sid, 3, 0, "secret thought", "reasoning"),
        stop(sid, 4, 0, "reasoning"),
        block_start(sid, 5, 1),
        delta(sid, 6, 1, "answer"),
        stop(sid, 7, 1),
        done(sid, 8),
    ]


async def _read_ids(http, server, sid, headers) -> list[int]:
    async with http.get(server.url(f"/v1/streams/{sid}/events"), headers=headers) as resp:
        assert resp.status == 200
        messages = await SSEClient(resp).events()
    return ids(messages)


async def test_internal_blocks_hidden_from_public_token(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*_reasoning_then_text(ctx.sid, "internal"))
    assert await _read_ids(ctx.http, ctx.server, ctx.sid, bearer(token_for(ctx.sid, "public"))) == [1, 5, 6, 7, 8]


@pytest.mark.parametrize("credential", ["internal-token", "api-key"])
async def test_internal_blocks_shown_to_internal_scope(ctx, credential):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*_reasoning_then_text(ctx.sid, "internal"))
    auth = bearer(token_for(ctx.sid, "internal") if credential == "internal-token" else API_KEY)
    assert await _read_ids(ctx.http, ctx.server, ctx.sid, auth) == list(range(1, 9))


async def test_public_reasoning_blocks_shown_to_public_token(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*_reasoning_then_text(ctx.sid, "public"))
    assert await _read_ids(ctx.http, ctx.server, ctx.sid, bearer(token_for(ctx.sid, "public"))) == list(range(1, 9))


async def test_public_resume_inside_internal_block_stays_hidden(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*_reasoning_then_text(ctx.sid, "internal"))
    headers = {**bearer(token_for(ctx.sid, "public")), "Last-Event-ID": "3"}
    assert await _read_ids(ctx.http, ctx.server, ctx.sid, headers) == [5, 6, 7, 8]


async def test_public_live_reader_resumed_after_internal_start_sees_no_reasoning(ctx):
    events = _reasoning_then_text(ctx.sid, "internal")
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(*events[:2])
    headers = {**bearer(token_for(ctx.sid, "public")), "Last-Event-ID": "2"}
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=headers) as resp:
        client = SSEClient(resp)
        assert await client.message() == {"retry": "2000"}
        await writer.append(*events[2:])
        messages = await client.events()
    assert ids(messages) == [5, 6, 7, 8]
    assert all("secret" not in m["data"] for m in messages)
    assert json.loads(messages[1]["data"])["delta"]["text"] == "answer"


async def test_live_readers_survive_a_lost_pubsub_connection(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        client = SSEClient(resp)
        assert (await client.next_event())["id"] == "1"
        name = f"fanout-publisher:{ctx.keys.prefix}"
        listing = (await ctx.redis.execute_command("CLIENT", "LIST", "TYPE", "pubsub")).decode()
        killed = 0
        for line in listing.splitlines():
            fields = dict(part.split("=", 1) for part in line.split(" ") if "=" in part)
            if fields.get("name") == name:
                killed += await ctx.redis.execute_command("CLIENT", "KILL", "ID", fields["id"])
        assert killed == 1
        await writer.append(block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0))  # notifications may be lost

        async def resubscribed() -> bool:
            return await _numsub(ctx.redis, ctx.keys.live(ctx.sid)) == 1

        await eventually(resubscribed)
        assert [(await client.next_event())["id"] for _ in range(2)] == ["2", "3"]  # no further append needed
        await writer.append(stop(ctx.sid, 4, 0), done(ctx.sid, 5))
        assert ids(await client.events()) == [4, 5]


async def _raw_http10_reader(server, sid: str, token: str) -> socket.socket:
    """An HTTP/1.0 SSE reader (no chunked coding) on a plain socket."""
    host, port = server.url("").removeprefix("http://").rstrip("/").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"GET /v1/streams/{sid}/events HTTP/1.0\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    sock.settimeout(GUARD_S)
    return sock


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


async def test_live_batches_encoded_once_reach_every_projection_and_coding_exactly(ctx):
    """Plain batches go to every live reader as one shared encoding; reasoning ones still pass each projection."""
    events = _reasoning_then_text(ctx.sid, "internal")
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(events[0])
    public, internal = token_for(ctx.sid, "public"), token_for(ctx.sid, "internal")
    responses = [await ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(token))
                 for token in (public, internal, public)]
    clients = [SSEClient(resp) for resp in responses]
    for client in clients:
        assert (await client.next_event())["id"] == "1"
    raw = await _raw_http10_reader(ctx.server, ctx.sid, public)
    assert b"id: 1\n" in await asyncio.to_thread(_read_until, raw, b"id: 1\n")
    await eventually(lambda: len(ctx.server.app[HUB]._topics[ctx.sid].live) == 4)
    await writer.append(*events[1:4])  # the internal reasoning block, one batch
    await writer.append(*events[4:])  # the text block and stream.done, one batch
    got = [ids(await client.events()) for client in clients]
    assert got == [[5, 6, 7, 8], list(range(2, 9)), [5, 6, 7, 8]]
    tail = await asyncio.to_thread(_read_until, raw, b"event: stream.done")
    raw.close()
    assert b"secret" not in tail
    assert [int(line[4:]) for line in tail.split(b"\n") if line.startswith(b"id: ")] == [5, 6, 7, 8]
    assert b"\r\n" not in tail.split(b"\r\n\r\n", 1)[-1]  # HTTP/1.0: frames as they are, no chunk framing
    for resp in responses:
        resp.close()


async def test_streams_left_together_are_unsubscribed_in_one_command(private_node_url, keys):
    """Every stream whose last reader left within UNSUBSCRIBE_DELAY_S goes in one UNSUBSCRIBE."""
    client = client_for(private_node_url)
    sids = [f"st_leave{index}" for index in range(10)]
    try:
        for sid in sids:
            await StreamWriter(client, keys, sid).append(start(sid))
        async with running_publisher(private_node_url, keys) as base, aiohttp.ClientSession() as http:
            responses = []
            for sid in sids:
                resp = await http.get(f"{base}/v1/streams/{sid}/events", headers=bearer(API_KEY))
                assert (await SSEClient(resp).next_event())["id"] == "1"
                responses.append(resp)
            before = await command_calls(client, "unsubscribe")
            for resp in responses:
                resp.close()

            async def all_unsubscribed() -> bool:
                return all([await _numsub(client, keys.live(sid)) == 0 for sid in sids])

            await eventually(all_unsubscribed)
            assert await command_calls(client, "unsubscribe") - before == 1
    finally:
        await delete_prefix(client, keys.prefix)
        await client.aclose()


async def test_a_reader_back_within_the_delay_keeps_the_subscription(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    url = ctx.server.url(f"/v1/streams/{ctx.sid}/events")
    first = await ctx.http.get(url, headers=bearer(API_KEY))
    assert (await SSEClient(first).next_event())["id"] == "1"
    first.close()
    hub = ctx.server.app[HUB]
    await eventually(lambda: hub.reader_count(ctx.sid) == 0)
    assert await _numsub(ctx.redis, ctx.keys.live(ctx.sid)) == 1  # still subscribed: within the delay
    async with ctx.http.get(url, headers=bearer(API_KEY) | {"Last-Event-ID": "1"}) as again:
        client = SSEClient(again)
        await asyncio.sleep(UNSUBSCRIBE_DELAY_S * 2)  # the delay passes while this reader holds the stream
        assert await _numsub(ctx.redis, ctx.keys.live(ctx.sid)) == 1
        await writer.append(block_start(ctx.sid, 2, 0), done(ctx.sid, 3), full=True)
        assert ids(await client.events()) == [2, 3]
