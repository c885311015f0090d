"""GET /v1/streams/{id}/events: SSE format, positions, resume, 204/404/410 (B20, B22, B24)."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from schema.contract import encode_event
from tests.publisher.helpers import (
    API_KEY,
    GUARD_S,
    SSEClient,
    StreamWriter,
    bearer,
    block_start,
    delta,
    done,
    ids,
    make_settings,
    start,
    stop,
    text_stream,
    token_for,
)

pytestmark = pytest.mark.topologies

PROBLEM = "application/problem+json"


def events_url(server, sid: str, query: str = "") -> str:
    return server.url(f"/v1/streams/{sid}/events{query}")


async def get_events(http, server, sid, headers=None, query=""):
    return await http.get(events_url(server, sid, query), headers={**bearer(token_for(sid)), **(headers or {})})


async def test_sse_headers_retry_hint_and_frames(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    events = text_stream(ctx.sid, 2)
    await writer.append(*events)
    async with await get_events(ctx.http, ctx.server, ctx.sid) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        assert resp.headers["Cache-Control"] == "private, max-age=86400, no-transform"  # finished: caching.py
        assert resp.headers["X-Accel-Buffering"] == "no"
        assert "Content-Encoding" not in resp.headers
        body = (await asyncio.wait_for(resp.read(), GUARD_S)).decode()
    assert body.startswith("retry: 2000\n\n")
    messages = body.split("\n\n")[1:-1]
    assert len(messages) == len(events)
    for message, event in zip(messages, events, strict=True):
        lines = message.split("\n")
        assert lines[0] == f"id: {event.seq}"
        assert lines[1] == f"event: {type(event).__struct_config__.tag}"
        assert lines[2].startswith("data: ")
        assert len(lines) == 3
        assert json.loads(lines[2][6:])["seq"] == event.seq


async def test_fresh_viewer_gets_stream_from_seq_1(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*text_stream(ctx.sid, 3))
    async with await get_events(ctx.http, ctx.server, ctx.sid) as resp:
        assert ids(await SSEClient(resp).events()) == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("how", ["header", "query"])
async def test_resume_position_by_header_or_query(ctx, how):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*text_stream(ctx.sid, 3))
    headers, query = ({"Last-Event-ID": "4"}, "") if how == "header" else ({}, "?last_event_id=4")
    async with await get_events(ctx.http, ctx.server, ctx.sid, headers, query) as resp:
        assert ids(await SSEClient(resp).events()) == [5, 6, 7]


async def test_header_position_wins_over_query(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*text_stream(ctx.sid, 3))
    async with await get_events(ctx.http, ctx.server, ctx.sid, {"Last-Event-ID": "5"}, "?last_event_id=2") as resp:
        assert ids(await SSEClient(resp).events()) == [6, 7]


@pytest.mark.parametrize("query", ["?last_event_id=2&last_event_id=3", "?last_event_id=2&last_event_id=2"])
async def test_a_repeated_last_event_id_parameter_is_400(ctx, query):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*text_stream(ctx.sid, 3))
    async with await get_events(ctx.http, ctx.server, ctx.sid, {}, query) as resp:
        assert resp.status == 400
        problem = await resp.json()
        assert problem["type"] == "https://fanout.dev/problems/invalid-position"
        assert "more than once" in problem["detail"]
    async with await get_events(ctx.http, ctx.server, ctx.sid, {}, "?last_event_id=2") as resp:
        assert ids(await SSEClient(resp).events()) == [3, 4, 5, 6, 7]  # once is fine


@pytest.mark.parametrize("position", ["abc", "-1", "1.5.5", "1.A", "+3", "0x10", "\uff11", "9" * 65])
async def test_position_not_a_non_negative_integer_is_400(ctx, position):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*text_stream(ctx.sid, 1))
    async with await get_events(ctx.http, ctx.server, ctx.sid, {"Last-Event-ID": position}) as resp:
        assert resp.status == 400
        assert resp.content_type == PROBLEM
        assert (await resp.json())["type"] == "https://fanout.dev/problems/invalid-position"


async def test_position_ahead_of_stored_top_is_410(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0))
    async with await get_events(ctx.http, ctx.server, ctx.sid, {"Last-Event-ID": "3"}) as resp:
        assert resp.status == 410
        problem = await resp.json()
    assert problem["type"] == "https://fanout.dev/problems/position-ahead"
    assert problem["last_seq"] == 2


async def test_queued_stream_is_served_and_waits_for_events(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta(state="queued")
    async with await get_events(ctx.http, ctx.server, ctx.sid) as resp:
        assert resp.status == 200
        client = SSEClient(resp)
        assert await client.message() == {"retry": "2000"}
        await writer.append(*text_stream(ctx.sid, 1))
        assert ids(await client.events()) == [1, 2, 3, 4, 5]


async def test_heartbeat_comment_carries_no_id(ctx):
    server = await ctx.start_app(make_settings(heartbeat_s=0.05))
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    async with await get_events(ctx.http, server, ctx.sid) as resp:
        client = SSEClient(resp)
        assert await client.message() == {"retry": "2000"}
        assert (await client.message())["id"] == "1"
        assert await client.message() == {"comment": "ping"}
        assert await client.message() == {"comment": "ping"}


async def test_resume_inside_live_stream_then_live_tail(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0))
    async with await get_events(ctx.http, ctx.server, ctx.sid, {"Last-Event-ID": "1"}) as resp:
        client = SSEClient(resp)
        assert int((await client.next_event())["id"]) == 2
        assert int((await client.next_event())["id"]) == 3
        await writer.append(stop(ctx.sid, 4, 0))
        assert int((await client.next_event())["id"]) == 4
        await writer.append(done(ctx.sid, 5))
        assert int((await client.next_event())["id"]) == 5
        assert await client.message() is None


# --- B22: resuming a stream that has already ended -------------------------------------------

async def _ended(redis_client, keys, sid, end="done"):
    events = text_stream(sid, 5, end=end)  # 9 events, ev(9) terminal
    assert len(events) == 9
    await StreamWriter(redis_client, keys, sid).append(*events)


async def test_b22_resume_mid_stream_serves_rest_and_ends(ctx):
    await _ended(ctx.redis, ctx.keys, ctx.sid)
    async with await get_events(ctx.http, ctx.server, ctx.sid, {"Last-Event-ID": "5"}) as resp:
        assert resp.status == 200
        messages = await SSEClient(resp).events()
    assert ids(messages) == [6, 7, 8, 9]
    assert messages[-1]["event"] == "stream.done"


@pytest.mark.parametrize("end", ["done", "error"])
@pytest.mark.parametrize("how", ["header", "query"])
async def test_b22_resume_after_terminal_returns_204(ctx, how, end):
    await _ended(ctx.redis, ctx.keys, ctx.sid, end)
    headers, query = ({"Last-Event-ID": "9"}, "") if how == "header" else ({}, "?last_event_id=9")
    async with await get_events(ctx.http, ctx.server, ctx.sid, headers, query) as resp:
        assert resp.status == 204
        assert await resp.read() == b""


async def test_b22_unknown_stream_is_404(server, http):
    async with await http.get(events_url(server, "st_x0x0x0"), headers=bearer(API_KEY)) as resp:
        assert resp.status == 404
        assert resp.content_type == PROBLEM
        problem = await resp.json()
    assert problem["type"] == "https://fanout.dev/problems/not-found"
    assert problem["status"] == 404


async def test_b22_expired_events_tombstone_terminal_holder_gets_204(ctx):
    await _ended(ctx.redis, ctx.keys, ctx.sid)
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).expire(9)
    async with await get_events(ctx.http, ctx.server, ctx.sid, {"Last-Event-ID": "9"}) as resp:
        assert resp.status == 204


@pytest.mark.parametrize("position", [None, "5", "10"])
async def test_b22_expired_events_tombstone_other_position_gets_410(ctx, position):
    await _ended(ctx.redis, ctx.keys, ctx.sid)
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).expire(9)
    headers = {"Last-Event-ID": position} if position else {}
    async with await get_events(ctx.http, ctx.server, ctx.sid, headers) as resp:
        assert resp.status == 410
        problem = await resp.json()
    assert problem["type"] == "https://fanout.dev/problems/history-expired"
    assert problem["last_seq"] == 9


async def test_b22_tombstone_also_expired_is_404(ctx):
    await _ended(ctx.redis, ctx.keys, ctx.sid)
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).expire(9)
    await ctx.redis.delete(ctx.keys.tomb(ctx.sid))
    async with await get_events(ctx.http, ctx.server, ctx.sid, {"Last-Event-ID": "9"}) as resp:
        assert resp.status == 404


# --- B20: resume from a trimmed position ------------------------------------------------------

async def _trimmed(redis_client, keys, sid):
    writer = StreamWriter(redis_client, keys, sid)
    await writer.meta()
    events = text_stream(sid, 1)  # 5 events: start, block.start, delta, block.stop, done
    await writer.append(*events, maxlen=3)
    entries = await redis_client.xrange(keys.events(sid))
    assert [e[0] for e in entries] == [b"0-3", b"0-4", b"0-5"]


@pytest.mark.parametrize("position", ["1", None])
async def test_b20_resume_from_trimmed_position_is_410(ctx, position):
    await _trimmed(ctx.redis, ctx.keys, ctx.sid)
    headers = {"Last-Event-ID": position} if position else {}
    async with await get_events(ctx.http, ctx.server, ctx.sid, headers) as resp:
        assert resp.status == 410
        assert resp.content_type == PROBLEM
        problem = await resp.json()
    assert problem["type"] == "https://fanout.dev/problems/history-trimmed"
    assert problem["first_seq"] == 3


async def test_b20_resume_without_gap_serves_rest(ctx):
    await _trimmed(ctx.redis, ctx.keys, ctx.sid)
    async with await get_events(ctx.http, ctx.server, ctx.sid, {"Last-Event-ID": "2"}) as resp:
        assert resp.status == 200
        assert ids(await SSEClient(resp).events()) == [3, 4, 5]


async def test_b20_gap_during_open_response_sends_error_frame_and_closes(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0))
    async with await get_events(ctx.http, ctx.server, ctx.sid) as resp:
        client = SSEClient(resp)
        assert [int((await client.next_event())["id"]) for _ in range(2)] == [1, 2]
        # seqs 3 and 4 are stored and trimmed away before the publisher reads them
        await writer.append(delta(ctx.sid, 3, 0), stop(ctx.sid, 4, 0), notify=False)
        await writer.append(done(ctx.sid, 5), maxlen=1)
        frame = await client.message()
        assert "id" not in frame
        assert frame["event"] == "stream.gap"
        assert json.loads(frame["data"])["after_seq"] == 2
        assert await client.message() is None
    async with await get_events(ctx.http, ctx.server, ctx.sid, {"Last-Event-ID": "2"}) as resp:
        assert resp.status == 410
        assert (await resp.json())["type"] == "https://fanout.dev/problems/history-trimmed"


# --- B24: no compression, no buffering ---------------------------------------------------------

async def _read_http_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD_S)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def _read_chunk(reader: asyncio.StreamReader) -> bytes:
    size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), GUARD_S)).strip(), 16)
    data = await asyncio.wait_for(reader.readexactly(size + 2), GUARD_S)
    return data[:-2]


async def test_b24_no_compression_no_buffering(ctx):
    sid = "st_t24"
    writer = StreamWriter(ctx.redis, ctx.keys, sid)
    await writer.meta()
    await writer.append(start(sid))
    host, port = ctx.server.base_url.removeprefix("http://").split(":")
    reader, sock_writer = await asyncio.open_connection(host, int(port), family=socket.AF_INET)
    try:
        sock_writer.write(
            f"GET /v1/streams/{sid}/events?last_event_id=1 HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {token_for(sid)}\r\nAccept: text/event-stream\r\n"
            "Accept-Encoding: gzip, deflate, br\r\n\r\n".encode()
        )
        await sock_writer.drain()
        status, headers = await _read_http_head(reader)
        assert status == 200
        assert headers["content-type"].startswith("text/event-stream")
        assert headers["cache-control"] in ("no-cache, no-transform", "no-store, no-transform")
        assert headers["x-accel-buffering"] == "no"
        assert "content-encoding" not in headers
        assert headers.get("transfer-encoding") == "chunked"
        buffer = b""
        while b"\n\n" not in buffer:
            buffer += await _read_chunk(reader)
        assert buffer == b"retry: 2000\n\n"
        for seq in range(2, 7):
            event = delta(sid, seq, 0, "y")
            await writer.append(event)
            buffer = b""
            while not buffer.endswith(b"\n\n"):
                buffer += await _read_chunk(reader)
            assert buffer == f"id: {seq}\nevent: block.delta\ndata: ".encode() + encode_event(event) + b"\n\n"
    finally:
        sock_writer.close()
        await sock_writer.wait_closed()
