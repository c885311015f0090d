"""GET /v1/streams/{id} (status + assembled result), POST .../cancel, /healthz, /readyz."""

from __future__ import annotations

import asyncio

import pytest

from publisher.app import RUNNER_KWARGS, create_app
from tests.publisher.helpers import (
    API_KEY,
    GUARD_S,
    StreamWriter,
    bearer,
    block_start,
    delta,
    done,
    make_settings,
    start,
    stop,
    text_stream,
    token_for,
)

pytestmark = pytest.mark.topologies

PROBLEM = "application/problem+json"


async def status_of(http, server, sid, credential=None):
    async with http.get(server.url(f"/v1/streams/{sid}"), headers=bearer(credential or token_for(sid))) as resp:
        return resp.status, await resp.json()


async def test_status_of_a_running_stream_has_the_result_so_far(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta(provider="anthropic", model="claude-x", created_ms=1234)
    sid = ctx.sid
    await writer.append(start(sid), block_start(sid, 2, 0), delta(sid, 3, 0, "Hel"), delta(sid, 4, 0, "lo"))
    status, body = await status_of(ctx.http, ctx.server, ctx.sid)
    assert status == 200
    assert body["stream_id"] == ctx.sid
    assert body["state"] == "running"
    assert body["status"] is None
    assert body["last_seq"] == 4
    assert (body["provider"], body["model"], body["created_ms"]) == ("anthropic", "claude-x", 1234)
    assert body["history_complete"] is True
    assert body["result"]["status"] == "running"
    assert body["result"]["blocks"] == [{"kind": "text", "index": 0, "signature": None, "text": "Hello"}]


async def test_status_of_a_finished_stream(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*text_stream(ctx.sid, 2))
    status, body = await status_of(ctx.http, ctx.server, ctx.sid)
    assert status == 200
    assert (body["state"], body["status"], body["last_seq"]) == ("done", "completed", 6)
    assert body["result"]["status"] == "completed"
    assert body["result"]["finish_reason"] == "stop"
    assert body["result"]["blocks"][0]["text"] == "t0 t1 "


async def test_status_of_a_queued_stream(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).meta(state="queued")
    status, body = await status_of(ctx.http, ctx.server, ctx.sid)
    assert (status, body["state"], body["last_seq"], body["result"]["blocks"]) == (200, "queued", 0, [])


async def test_status_of_an_expired_stream_comes_from_the_tombstone(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).expire(9, "failed")
    status, body = await status_of(ctx.http, ctx.server, ctx.sid)
    assert status == 200
    assert (body["state"], body["status"], body["last_seq"], body["result"]) == ("expired", "failed", 9, None)


async def test_status_of_an_unknown_stream_is_404(server, http):
    status, body = await status_of(http, server, "st_none", API_KEY)
    assert status == 404
    assert body["type"] == "https://fanout.dev/problems/not-found"


async def test_status_result_hides_internal_reasoning_from_public_token(ctx):
    sid = ctx.sid
    await StreamWriter(ctx.redis, ctx.keys, sid).append(
        start(sid), block_start(sid, 2, 0, "reasoning", "internal"), delta(sid, 3, 0, "secret", "reasoning"),
        stop(sid, 4, 0, "reasoning"), block_start(sid, 5, 1), delta(sid, 6, 1, "answer"), stop(sid, 7, 1),
        done(sid, 8),
    )
    _, public = await status_of(ctx.http, ctx.server, ctx.sid, token_for(ctx.sid, "public"))
    _, internal = await status_of(ctx.http, ctx.server, ctx.sid, token_for(ctx.sid, "internal"))
    assert [b["kind"] for b in public["result"]["blocks"]] == ["text"]
    assert "secret" not in str(public)
    assert [b["kind"] for b in internal["result"]["blocks"]] == ["reasoning", "text"]
    assert internal["result"]["blocks"][0]["visibility"] == "internal"


# --- cancel -----------------------------------------------------------------------------------

async def cancel(http, server, sid, credential=API_KEY):
    async with http.post(server.url(f"/v1/streams/{sid}/cancel"), headers=bearer(credential)) as resp:
        body = await resp.json()
        return resp.status, body


async def test_cancel_sets_the_flag_and_publishes_the_stream_id(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    pubsub = ctx.redis.pubsub()
    await pubsub.subscribe(ctx.keys.cancels)
    try:
        assert (await pubsub.get_message(timeout=GUARD_S))["type"] == "subscribe"
        status, body = await cancel(ctx.http, ctx.server, ctx.sid)
        assert (status, body) == (202, {"stream_id": ctx.sid, "state": "cancelling"})
        assert await ctx.redis.get(ctx.keys.cancel(ctx.sid)) == b"1"
        assert 0 < await ctx.redis.ttl(ctx.keys.cancel(ctx.sid)) <= 24 * 3600
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=GUARD_S)
        assert message["data"] == ctx.sid.encode()
        assert (await cancel(ctx.http, ctx.server, ctx.sid))[0] == 202  # idempotent
    finally:
        await pubsub.aclose()


async def test_cancel_a_queued_stream_is_202(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).meta(state="queued")
    assert (await cancel(ctx.http, ctx.server, ctx.sid))[0] == 202


@pytest.mark.parametrize("expired", [False, True])
async def test_cancel_once_terminal_is_409(ctx, expired):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(*text_stream(ctx.sid, 1))
    if expired:
        await writer.expire(5)
    status, body = await cancel(ctx.http, ctx.server, ctx.sid)
    assert status == 409
    assert body["type"] == "https://fanout.dev/problems/already-terminal"
    assert (body["status"], body["stream_status"]) == (409, "completed")
    assert await ctx.redis.get(ctx.keys.cancel(ctx.sid)) is None


async def test_cancel_needs_an_api_key_and_a_known_stream(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    assert (await cancel(ctx.http, ctx.server, ctx.sid, token_for(ctx.sid, "internal")))[0] == 401
    assert (await cancel(ctx.http, ctx.server, "st_none"))[0] == 404
    assert await ctx.redis.get(ctx.keys.cancel(ctx.sid)) is None


# --- health -----------------------------------------------------------------------------------

async def test_healthz_and_readyz(server, http):
    for path in ("/healthz", "/readyz"):
        async with http.get(server.url(path)) as resp:
            assert (resp.status, await resp.json()) == (200, {"status": "ok"})


async def test_readyz_is_503_when_redis_is_unreachable(start_app, http):
    from aiohttp import web
    app = create_app(make_settings(), redis_url="redis://127.0.0.1:1/0")
    runner = web.AppRunner(app, **RUNNER_KWARGS)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        async with asyncio.timeout(GUARD_S):
            async with http.get(f"http://{host}:{port}/readyz") as resp:
                assert resp.status == 503
                assert resp.content_type == PROBLEM
                assert (await resp.json())["type"] == "https://fanout.dev/problems/redis-unavailable"
            async with http.get(f"http://{host}:{port}/healthz") as resp:
                assert resp.status == 200
    finally:
        await runner.cleanup()


# --- errors of the router ---------------------------------------------------------------------

async def test_unknown_route_and_wrong_method_are_problems(server, http):
    async with http.get(server.url("/v1/nothing")) as resp:
        assert resp.status == 404
        assert resp.content_type == PROBLEM
        assert (await resp.json())["type"] == "https://fanout.dev/problems/not-found"
    async with http.delete(server.url("/v1/streams")) as resp:
        assert resp.status == 405
        assert resp.content_type == PROBLEM
        assert resp.headers["Allow"] == "POST"
        assert (await resp.json())["type"] == "https://fanout.dev/problems/method-not-allowed"
