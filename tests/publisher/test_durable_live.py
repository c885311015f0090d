"""``/v1/streams/{id}/durable`` long-poll and SSE reads, on a real server and a real Redis."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from publisher.state import FAIR_SHARES
from publisher.wire.durable import format_offset
from tests.publisher.conftest import Ctx
from tests.publisher.helpers import (
    GUARD_S,
    StreamWriter,
    bearer,
    block_start,
    delta,
    done,
    eventually,
    make_settings,
    start,
    stop,
    text_stream,
    token_for,
)

EPOCH = "k3x9q2m0ab"


async def running(ctx: Ctx, events: list[Any]) -> StreamWriter:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=EPOCH.encode())
    await writer.meta()
    await writer.append(*events)
    return writer


def auth(ctx: Ctx) -> dict[str, str]:
    return bearer(token_for(ctx.sid))


async def sse_events(response: aiohttp.ClientResponse) -> list[tuple[str, Any]]:
    """Read an SSE body to its end: ``(event, parsed data)`` per event, ``("ping", None)`` per comment."""
    out: list[tuple[str, Any]] = []
    async with asyncio.timeout(GUARD_S):
        body = (await response.read()).decode()
    for block in body.split("\n\n"):
        if block.startswith(":"):
            out.append(("ping", None))
        elif block:
            name, data = block.split("\n", 1)
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


async def test_long_poll_answers_the_event_that_arrives_while_it_waits(ctx: Ctx) -> None:
    writer = await running(ctx, [start(ctx.sid), block_start(ctx.sid, 2, 0)])
    tail = format_offset(2, EPOCH)
    request = asyncio.ensure_future(ctx.http.get(ctx.server.url(
        f"/v1/streams/{ctx.sid}/durable?offset={tail}&live=long-poll"), headers=auth(ctx)))
    await asyncio.sleep(0.2)
    assert not request.done()
    await writer.append(delta(ctx.sid, 3, 0, "hi"))
    async with await request as response:
        assert response.status == 200
        assert [item["seq"] for item in await response.json()] == [3]
        assert response.headers["Stream-Next-Offset"] == format_offset(3, EPOCH)
        assert response.headers["Stream-Cursor"].isdigit()
        assert response.headers["Stream-Up-To-Date"] == "true"


async def test_long_poll_behind_the_tail_answers_stored_events_at_once(ctx: Ctx) -> None:
    await running(ctx, [start(ctx.sid), block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0)])
    url = ctx.server.url(f"/v1/streams/{ctx.sid}/durable?offset=-1&live=long-poll")
    async with ctx.http.get(url, headers=auth(ctx)) as response:
        assert response.status == 200
        assert [item["seq"] for item in await response.json()] == [1, 2, 3]
        assert response.headers["ETag"] == f'"public:{format_offset(0, None)}:{format_offset(3, EPOCH)}"'


async def test_long_poll_times_out_with_204_up_to_date_and_a_cursor(ctx: Ctx) -> None:
    server = await ctx.start_app(make_settings(durable_long_poll_s=0.2))
    await running(ctx, [start(ctx.sid)])
    tail = format_offset(1, EPOCH)
    url = server.url(f"/v1/streams/{ctx.sid}/durable?offset={tail}&live=long-poll&cursor=99999999999")
    async with ctx.http.get(url, headers=auth(ctx)) as response:
        assert response.status == 204
        assert response.headers["Stream-Next-Offset"] == tail
        assert response.headers["Stream-Up-To-Date"] == "true"
        assert int(response.headers["Stream-Cursor"]) > 99999999999  # never a cursor the client already has
        assert "Stream-Closed" not in response.headers


async def test_long_poll_at_the_end_of_an_ended_stream_is_204_closed_without_waiting(ctx: Ctx) -> None:
    events = text_stream(ctx.sid, 1)
    await running(ctx, events)
    url = ctx.server.url(f"/v1/streams/{ctx.sid}/durable?offset={format_offset(5, EPOCH)}&live=long-poll")
    async with ctx.http.get(url, headers=auth(ctx)) as response:  # the default wait is 20 s: GUARD_S is 10
        assert response.status == 204
        assert response.headers["Stream-Closed"] == "true"
        assert response.headers["Stream-Up-To-Date"] == "true"


async def test_sse_replays_an_ended_stream_then_closes_with_stream_closed(ctx: Ctx) -> None:
    events = text_stream(ctx.sid, 2)
    await running(ctx, events)
    url = ctx.server.url(f"/v1/streams/{ctx.sid}/durable?offset=-1&live=sse")
    async with ctx.http.get(url, headers=auth(ctx)) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        assert response.headers["Cache-Control"] == "no-cache"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        got = await sse_events(response)
    assert [name for name, _ in got] == ["data", "control"]
    assert [item["seq"] for item in got[0][1]] == [1, 2, 3, 4, 5, 6]
    assert got[1][1] == {"streamNextOffset": format_offset(6, EPOCH), "upToDate": True, "streamClosed": True}


async def test_sse_announces_up_to_date_then_serves_live_events_to_the_end(ctx: Ctx) -> None:
    writer = await running(ctx, [start(ctx.sid)])
    url = ctx.server.url(f"/v1/streams/{ctx.sid}/durable?offset={format_offset(1, EPOCH)}&live=sse")
    async with ctx.http.get(url, headers=auth(ctx)) as response:
        first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), GUARD_S)
        assert first.startswith(b"event: control\ndata: ")
        control = json.loads(first.split(b"data: ", 1)[1])
        assert control["upToDate"] is True
        assert control["streamNextOffset"] == format_offset(1, EPOCH)
        await writer.append(block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0), stop(ctx.sid, 4, 0), done(ctx.sid, 5))
        got = await sse_events(response)
    data = [item["seq"] for name, items in got if name == "data" for item in items]
    assert data == [2, 3, 4, 5]
    assert got[-1] == ("control", {"streamNextOffset": format_offset(5, EPOCH), "upToDate": True,
                                   "streamClosed": True})
    assert all("streamCursor" in body for name, body in got[:-1] if name == "control")


async def test_sse_at_the_end_of_an_ended_stream_is_one_closed_control(ctx: Ctx) -> None:
    await running(ctx, text_stream(ctx.sid, 1))
    url = ctx.server.url(f"/v1/streams/{ctx.sid}/durable?offset=now&live=sse")
    async with ctx.http.get(url, headers=auth(ctx)) as response:
        got = await sse_events(response)
    assert got == [("control", {"streamNextOffset": format_offset(5, EPOCH), "upToDate": True,
                                "streamClosed": True})]


async def test_sse_ends_after_its_time_limit_with_the_client_s_offset_and_pings_while_idle(ctx: Ctx) -> None:
    server = await ctx.start_app(make_settings(durable_sse_max_s=0.6, heartbeat_s=0.1))
    await running(ctx, [start(ctx.sid), block_start(ctx.sid, 2, 0)])
    url = server.url(f"/v1/streams/{ctx.sid}/durable?offset=-1&live=sse")
    async with ctx.http.get(url, headers=auth(ctx)) as response:
        got = await sse_events(response)
    assert [name for name, _ in got[:2]] == ["data", "control"]
    assert got[1][1]["streamNextOffset"] == format_offset(2, EPOCH)
    assert got[1][1]["upToDate"] is True
    assert ("ping", None) in got[2:]
    assert all(name == "ping" for name, _ in got[2:])


async def test_live_reads_of_unknown_or_expired_streams_get_the_read_answers(ctx: Ctx) -> None:
    for live in ("long-poll", "sse"):
        url = ctx.server.url(f"/v1/streams/{ctx.sid}/durable?offset=now&live={live}")
        async with ctx.http.get(url, headers=auth(ctx)) as response:
            assert response.status == 404
    writer = await running(ctx, text_stream(ctx.sid, 1))
    await writer.expire(5)
    for live in ("long-poll", "sse"):
        url = ctx.server.url(f"/v1/streams/{ctx.sid}/durable?offset=-1&live={live}")
        async with ctx.http.get(url, headers=auth(ctx)) as response:
            assert response.status == 410


@pytest.mark.parametrize(("limit", "status"), [({"max_connections_per_token": 1}, 429),
                                             ({"max_connections": 1}, 503)])
async def test_a_live_read_past_a_connection_limit_is_refused_with_retry_after(ctx: Ctx, limit: dict[str, int],
                                                                                status: int) -> None:
    server = await ctx.start_app(make_settings(**limit, durable_long_poll_s=5.0))
    await running(ctx, [start(ctx.sid)])
    url = server.url(f"/v1/streams/{ctx.sid}/durable?offset={format_offset(1, EPOCH)}&live=long-poll")
    held = asyncio.ensure_future(ctx.http.get(url, headers=auth(ctx)))
    await eventually(lambda: server.app[FAIR_SHARES].held("sse") == 1)
    async with ctx.http.get(url, headers=auth(ctx)) as response:
        assert response.status == status
        assert "Retry-After" in response.headers
    held.cancel()


async def test_sse_ends_when_history_stops_following_and_the_reconnect_gets_410(ctx: Ctx) -> None:
    writer = await running(ctx, [start(ctx.sid)])
    offset = format_offset(1, EPOCH)
    url = ctx.server.url(f"/v1/streams/{ctx.sid}/durable?offset={offset}&live=sse")
    async with ctx.http.get(url, headers=auth(ctx)) as response:
        first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), GUARD_S)
        assert json.loads(first.split(b"data: ", 1)[1])["upToDate"] is True
        await writer.append(delta(ctx.sid, 3, 0))  # seq 2 is never stored: a gap
        got = await sse_events(response)
    assert all(name == "ping" for name, _ in got)  # nothing past the gap, no streamClosed
    async with ctx.http.get(url, headers=auth(ctx)) as response:
        assert response.status == 410
        assert (await response.json(content_type=None))["type"].endswith("/history-trimmed")


async def test_offsets_of_a_stream_read_live_since_it_was_queued_carry_its_epoch(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=EPOCH.encode())
    await writer.meta(state="queued")
    url = ctx.server.url(f"/v1/streams/{ctx.sid}/durable?offset=-1&live=sse")
    async with ctx.http.get(url, headers=auth(ctx)) as response:
        first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), GUARD_S)
        assert json.loads(first.split(b"data: ", 1)[1])["streamNextOffset"] == format_offset(0, None)
        await writer.append(*text_stream(ctx.sid, 1), full=True)
        got = await sse_events(response)
    controls = [body for name, body in got if name == "control"]
    assert controls[-1]["streamClosed"] is True
    assert all(control["streamNextOffset"].endswith(f".{EPOCH}") for control in controls)


class AppendOnBlockSearch:
    """Forwards to the real client; the first XREVRANGE (a block-start search) first stores one more event."""

    def __init__(self, inner: Any, append: Any) -> None:
        self._inner, self._append, self.fired = inner, append, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def xrevrange(self, *args: Any, **kwargs: Any) -> Any:
        if not self.fired:
            self.fired = True
            await self._append()
            await asyncio.sleep(0.2)  # the hub queues it for the reader meanwhile
        return await self._inner.xrevrange(*args, **kwargs)


async def test_a_live_answer_s_offset_is_its_last_event_not_one_queued_meanwhile(ctx: Ctx) -> None:
    sid = ctx.sid
    writer = await running(ctx, [start(sid), block_start(sid, 2, 0, "reasoning"), delta(sid, 3, 0, "a", "reasoning")])
    wrapped: list[AppendOnBlockSearch] = []

    def wrap(client: Any) -> AppendOnBlockSearch:
        wrapped.append(AppendOnBlockSearch(client, lambda: writer.append(stop(sid, 5, 0, "reasoning"))))
        return wrapped[0]

    server = await ctx.start_app(wrap_redis=wrap)
    url = server.url(f"/v1/streams/{sid}/durable?offset={format_offset(3, EPOCH)}&live=long-poll")
    request = asyncio.ensure_future(ctx.http.get(url, headers=auth(ctx)))  # public: resumes inside block 0
    await eventually(lambda: server.app[FAIR_SHARES].held("sse") == 1)
    await writer.append(delta(sid, 4, 0, "b", "reasoning"))  # its block's start is searched for
    async with await request as response:
        assert [item["seq"] for item in await response.json()] == [4]
        assert response.headers["Stream-Next-Offset"] == format_offset(4, EPOCH)  # seq 5 is still owed
    assert wrapped[0].fired
