"""Adversarial review: stored entries no worker of ours writes never break a response or the live pump."""

from __future__ import annotations

import pytest

from publisher.history.entries import entry_of
from schema.contract import encode_event
from tests.publisher.helpers import (
    API_KEY,
    SSEClient,
    StreamWriter,
    bearer,
    block_start,
    delta,
    done,
    ids,
    start,
    token_for,
)

BROKEN = {
    "text with a line feed": b"not json\n",
    "text with a carriage return": b"garbage\r",
    "a raw line feed inside a JSON string": b'{"type":"block.delta","seq":3,"x":"a\nid: 99"}',
}


@pytest.mark.parametrize("raw", list(BROKEN.values()), ids=list(BROKEN))
def test_a_stored_value_with_a_line_break_that_is_not_json_is_an_invalid_entry(raw):
    entry = entry_of(3, raw)  # before the fix: msgspec.DecodeError escaped from one_line
    assert (entry.seq, entry.type, entry.frame) == (3, "invalid", b"")


@pytest.mark.parametrize("raw", list(BROKEN.values()), ids=list(BROKEN))
async def test_replay_skips_a_broken_entry_and_serves_the_rest(ctx, raw):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0))
    await ctx.redis.xadd(ctx.keys.events(ctx.sid), {"e": raw}, id="0-3")
    await writer.append(delta(ctx.sid, 4, 0), done(ctx.sid, 5))
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        assert resp.status == 200  # before the fix: 500 internal, on every reconnect
        assert ids(await SSEClient(resp).events()) == [1, 2, 4, 5]


async def test_a_broken_entry_read_live_does_not_stop_the_streams_live_reads(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0))
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        client = SSEClient(resp)
        assert ids([await client.next_event(), await client.next_event()]) == [1, 2]
        await ctx.redis.xadd(ctx.keys.events(ctx.sid), {"e": b"not json\n"}, id="0-3")
        await ctx.redis.hset(ctx.keys.meta(ctx.sid), "last_seq", 3)
        await writer.notify(3)  # seq-only: the topic's pump reads 0-3 (before the fix the pump task died)
        await writer.append(delta(ctx.sid, 4, 0), full=True)
        await writer.append(done(ctx.sid, 5))  # seq-only again: needs the pump
        assert ids(await client.events()) == [4, 5]


async def test_a_broken_event_carried_live_does_not_drop_the_subscription(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(start(ctx.sid))
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        client = SSEClient(resp)
        assert ids([await client.next_event()]) == [1]
        await ctx.redis.xadd(ctx.keys.events(ctx.sid), {"e": b"garbage\r"}, id="0-2")
        await ctx.redis.hset(ctx.keys.meta(ctx.sid), "last_seq", 2)
        await writer.notify(2, [b"garbage\r"])  # carried live: parsed in the pub/sub dispatch
        await writer.append(block_start(ctx.sid, 3, 0), done(ctx.sid, 4), full=True)
        assert ids(await client.events()) == [3, 4]


@pytest.mark.parametrize("scope", ["internal", "public"])
async def test_a_live_batch_with_entries_after_its_terminal_ends_at_the_terminal(ctx, scope):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0))
    credential = API_KEY if scope == "internal" else token_for(ctx.sid)
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(credential)) as resp:
        client = SSEClient(resp)
        assert ids([await client.next_event(), await client.next_event()]) == [1, 2]
        batch = [delta(ctx.sid, 3, 0), done(ctx.sid, 4), delta(ctx.sid, 5, 0), delta(ctx.sid, 6, 0)]
        for event in batch:  # what a foreign writer could store; the fenced append script never does
            await ctx.redis.xadd(ctx.keys.events(ctx.sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
        await ctx.redis.hset(ctx.keys.meta(ctx.sid), mapping={"last_seq": 6, "state": "done"})
        await writer.notify(6, [encode_event(event) for event in batch])
        # before the fix: 3, 4, 5, 6 and the response stayed open (replay stops at 4)
        assert ids(await client.events()) == [3, 4]


DEEP = b'{"type":"block.delta","x":' + b"[" * 5000 + b"]" * 5000 + b"}"
"""A stored value nested past msgspec's recursion limit (it raises RecursionError, not DecodeError)."""


async def test_a_stored_value_nested_too_deeply_is_skipped_by_replay_and_status(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0))
    await ctx.redis.xadd(ctx.keys.events(ctx.sid), {"e": DEEP}, id="0-3")
    await writer.append(delta(ctx.sid, 4, 0, "kept"), done(ctx.sid, 5))
    assert entry_of(3, DEEP).type == "invalid"
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        assert resp.status == 200
        assert ids(await SSEClient(resp).events()) == [1, 2, 4, 5]
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}"), headers=bearer(API_KEY)) as resp:
        assert resp.status == 200  # before the fix: 500, the status assembly let RecursionError out
        assert "kept" in await resp.text()
