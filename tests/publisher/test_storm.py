"""Reconnect storms: transient refusals are 200 + ``retry:`` (EventSource reconnects); a CI-sized storm is served."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from publisher.api.edge import EdgeRunner
from publisher.app import RUNNER_KWARGS, create_app
from publisher.state import GATE
from tests.publisher.helpers import (
    API_KEY,
    GUARD_S,
    SSEClient,
    StreamWriter,
    bearer,
    done,
    ids,
    make_settings,
    start,
    token_for,
)

STORM_READERS = 1000
STORM_STREAMS = 10


async def _busy_messages(resp: aiohttp.ClientResponse) -> list[dict[str, str]]:
    assert resp.status == 200
    assert resp.content_type == "text/event-stream"
    client, messages = SSEClient(resp), []
    while (message := await client.message()) is not None:
        messages.append(message)
    assert "retry" in messages[0]
    assert not [m for m in messages if "id" in m or "data" in m]
    return messages


async def test_sse_request_while_shutting_down_is_200_with_a_retry_hint(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    ctx.server.app[GATE].closing = True
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        messages = await _busy_messages(resp)
    assert "shutting-down" in messages[1]["comment"]


async def test_sse_request_whose_subscription_is_not_confirmed_is_200_with_a_retry_hint(ctx):
    server = await ctx.start_app(make_settings(subscribe_timeout_s=1e-9))
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        messages = await _busy_messages(resp)
    assert "redis-unavailable" in messages[1]["comment"]


async def test_sse_request_when_redis_is_unreachable_is_200_with_a_retry_hint(http):
    app = create_app(make_settings(redis_pool_timeout_s=0.2), redis_url="redis://127.0.0.1:1/0")
    runner = EdgeRunner(app, **RUNNER_KWARGS)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        async with asyncio.timeout(GUARD_S):
            url = f"http://{host}:{port}/v1/streams/st_x/events"
            async with http.get(url, headers=bearer(API_KEY)) as resp:
                messages = await _busy_messages(resp)
    finally:
        await runner.cleanup()
    assert "redis-unavailable" in messages[1]["comment"]


async def test_real_client_errors_keep_their_4xx(ctx):
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer("wrong")) as resp:
        assert resp.status == 401
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        assert resp.status == 404


async def test_storm_of_readers_arriving_at_once_is_all_served(ctx):
    sids = [f"{ctx.sid}_{j}" for j in range(STORM_STREAMS)]
    writers = [StreamWriter(ctx.redis, ctx.keys, sid) for sid in sids]
    for writer, sid in zip(writers, sids, strict=True):
        await writer.append(start(sid))
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:
        connected = asyncio.Event()
        opened = 0

        async def read(index: int) -> list[int]:
            nonlocal opened
            sid = sids[index % STORM_STREAMS]
            url = ctx.server.url(f"/v1/streams/{sid}/events")
            # a token per reader, as a deployment that gives one to each viewer (one token holds at most
            # FANOUT_MAX_CONNECTIONS_PER_TOKEN open streams: tests/publisher/test_fair_share.py)
            async with http.get(url, headers=bearer(token_for(sid, ttl_s=3600 + index))) as resp:
                assert resp.status == 200
                client = SSEClient(resp)
                first = await client.next_event()
                assert first is not None, "a reader was turned away"
                opened += 1
                if opened == STORM_READERS:
                    connected.set()
                return [int(first["id"]), *ids(await client.events())]

        readers = [asyncio.create_task(read(i)) for i in range(STORM_READERS)]  # all at once
        async with asyncio.timeout(GUARD_S * 6):
            await connected.wait()
            for writer, sid in zip(writers, sids, strict=True):
                await writer.append(done(sid, 2), full=True)
            got = await asyncio.gather(*readers)
    assert got == [[1, 2]] * STORM_READERS
