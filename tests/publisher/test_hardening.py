"""Hostile clients and corrupt stored state: every answer is the documented one, never a bare 500."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest

from publisher.api.validation import MAX_JSON_DEPTH
from publisher.state import GATE, HUB
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
    ids,
    make_settings,
    start,
    token_for,
)

PROBLEM = "application/problem+json"
BODY = {"provider": "openai_chat", "model": "m", "request": {"messages": []}}


def problem_type(slug: str) -> str:
    return "https://fanout.dev/problems/" + slug


async def raw_request(url: str, head: bytes, body: bytes = b"") -> bytes:
    """Send one HTTP/1.1 request with arbitrary header bytes; return the status line and headers."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), GUARD_S)
    writer.close()
    return answer


def nested(depth: int) -> bytes:
    """A submission body whose deepest container is at ``depth`` (the body object is depth 1)."""
    inner = depth - 2  # the body object and metadata take two levels
    return (b'{"provider":"openai_chat","model":"m","request":{},"metadata":{"m":'
            + b"[" * inner + b"]" * inner + b"}}")


@pytest.mark.parametrize(("method", "path"), [(b"POST", "/v1/streams"), (b"GET", "/v1/streams/{sid}/events")])
async def test_non_utf8_authorization_header_is_401_unauthorized(ctx, method, path):
    head = b"%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n" % (
        method, path.format(sid=ctx.sid).encode())
    answer = await raw_request(ctx.server.base_url, head, b"{}" if method == b"POST" else b"")
    assert answer.startswith(b"HTTP/1.1 401 ")
    assert b"Content-Type: " + PROBLEM.encode() in answer
    assert problem_type("unauthorized").encode() in answer


async def test_submission_nested_past_the_decoder_limit_is_400_invalid_body(ctx):
    async with ctx.http.post(ctx.server.url("/v1/streams"), data=nested(5000), headers=bearer(API_KEY)) as resp:
        assert resp.status == 400
        assert resp.content_type == PROBLEM
        assert (await resp.json())["type"] == problem_type("invalid-body")
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 0


async def test_submission_one_level_past_the_depth_limit_is_400_invalid_body(ctx):
    async with ctx.http.post(ctx.server.url("/v1/streams"), data=nested(MAX_JSON_DEPTH + 1),
                             headers=bearer(API_KEY)) as resp:
        assert resp.status == 400
        assert (await resp.json())["type"] == problem_type("invalid-body")


async def test_submission_at_the_depth_limit_is_accepted(ctx):
    async with ctx.http.post(ctx.server.url("/v1/streams"), data=nested(MAX_JSON_DEPTH),
                             headers=bearer(API_KEY)) as resp:
        assert resp.status == 201


@pytest.mark.parametrize("change", ["==", "!"], ids=["padding", "junk"])
async def test_read_token_with_a_reencoded_signature_is_401_invalid_token(ctx, change):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    token = token_for(ctx.sid)
    altered = token + change if change == "==" else token[:-3] + change + token[-3:]
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(altered)) as resp:
        assert resp.status == 401
        assert (await resp.json())["type"] == problem_type("invalid-token")


async def test_tombstone_with_a_corrupt_last_seq_is_410_history_expired(ctx):
    await ctx.redis.hset(ctx.keys.tomb(ctx.sid), mapping={"last_seq": "abc", "status": "completed"})
    headers = {**bearer(token_for(ctx.sid)), "Last-Event-ID": "5"}
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=headers) as resp:
        assert resp.status == 410
        assert (await resp.json())["type"] == problem_type("history-expired")


async def test_unexpected_error_is_a_500_problem_document(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    await ctx.redis.hset(ctx.keys.meta(ctx.sid), "created_ms", "not-a-number")  # corrupt state: a bug to surface
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}"), headers=bearer(token_for(ctx.sid))) as resp:
        assert resp.status == 500
        assert resp.content_type == PROBLEM
        assert (await resp.json())["type"] == problem_type("internal")


async def test_status_of_a_stream_with_a_foreign_entry_skips_it(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    await ctx.redis.xadd(ctx.keys.events(ctx.sid), {"e": b'{"type":"x"}'}, id="7-1")  # not a 0-<seq> id
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}"), headers=bearer(token_for(ctx.sid))) as resp:
        assert resp.status == 200
        assert (await resp.json())["last_seq"] == 1


async def test_reader_gets_a_gap_frame_when_meta_promises_events_that_are_gone(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0))
    await ctx.redis.hset(ctx.keys.meta(ctx.sid), mapping={"last_seq": 5, "state": "done", "status": "completed"})
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"),
                            headers=bearer(token_for(ctx.sid))) as resp:
        assert resp.status == 200
        client = SSEClient(resp)
        messages = []
        while (message := await client.message()) is not None:
            messages.append(message)
    numbered = [m for m in messages if "id" in m]
    assert ids(numbered) == [1, 2, 3]
    assert messages[-1]["event"] == "stream.gap"
    assert "id" not in messages[-1]
    assert json.loads(messages[-1]["data"])["after_seq"] == 3


async def test_reader_that_stops_reading_during_replay_is_disconnected(ctx):
    server = await ctx.start_app(make_settings(write_timeout_s=0.3))
    big = "y" * 4000
    deltas = [delta(ctx.sid, 3 + i, 0, big) for i in range(3000)]  # 12 MB: more than any socket buffers hold
    events = [start(ctx.sid), block_start(ctx.sid, 2, 0), *deltas]
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for event in events:
            pipe.xadd(ctx.keys.events(ctx.sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
        await pipe.execute()
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        host, port = server.base_url.removeprefix("http://").split(":")
        stalled.connect((host, int(port)))
        stalled.sendall(f"GET /v1/streams/{ctx.sid}/events HTTP/1.1\r\nHost: x\r\n"
                        f"Authorization: Bearer {API_KEY}\r\n\r\n".encode())
        await eventually(lambda: server.app[HUB].reader_count(ctx.sid) == 1)
        await eventually(lambda: server.app[HUB].reader_count(ctx.sid) == 0 and server.app[GATE].open == 0)
    finally:
        stalled.close()


async def test_foreign_entry_id_in_the_live_tail_is_skipped_and_the_hub_keeps_serving(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0))
    url = ctx.server.url(f"/v1/streams/{ctx.sid}/events")
    async with ctx.http.get(url, headers=bearer(token_for(ctx.sid))) as live:
        client = SSEClient(live)
        got = [await client.message() for _ in range(3)]  # retry hint, then ids 1 and 2
        assert [m.get("id") for m in got if m and "id" in m] == ["1", "2"]
        await ctx.redis.xadd(ctx.keys.events(ctx.sid), {"e": b'{"type":"x"}'}, id="7-1")
        await ctx.redis.publish(ctx.keys.live(ctx.sid), b"3")
        await asyncio.sleep(0.2)
        # the hub survived: a new reader of the same stream is served the real events
        async with ctx.http.get(url, headers=bearer(token_for(ctx.sid)),
                                timeout=aiohttp.ClientTimeout(sock_read=2)) as again:
            assert again.status == 200
            second = SSEClient(again)
            ids_seen = [m["id"] for m in [await second.message() for _ in range(3)] if m and "id" in m]
            assert ids_seen == ["1", "2"]
