"""Hostile providers and hostile job entries: each ends its stream with the right terminal, the worker lives on.

Every provider here is a small aiohttp app on 127.0.0.1:0 whose handler misbehaves in one
way; the worker under test is the real one (:func:`tests.worker.support.running_worker`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web

from schema.contract import StreamError
from schema.keys import JOB_FIELD, Keys
from tests.worker.support import (
    fake_upstream,
    make_job,
    meta,
    pending_count,
    running_worker,
    settings_for,
    stored_events,
    submit,
    wait_done,
    wait_for,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
DEEP = 5000
"""Nesting depth past any JSON decoder's recursion limit."""


@contextlib.asynccontextmanager
async def provider(handler: Handler) -> AsyncIterator[str]:
    """Serve ``handler`` on every path of 127.0.0.1:0; yield the base URL."""
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def run_job(redis_client: aioredis.Redis, keys: Keys, redis_url: str, handler: Handler, *,
                  job_provider: str = "openai_chat", **limits: Any) -> StreamError:
    """Run one job against ``handler``; return its terminal ``stream.error``."""
    async with provider(handler) as base, running_worker(
            settings_for(base, redis_url, keys, **{"max_retries": 0, **limits}), keys):
        job = make_job(job_provider, "m")
        await submit(redis_client, keys, job)
        await wait_done(redis_client, keys, job.stream_id)
    last = (await stored_events(redis_client, keys, job.stream_id))[-1]
    assert isinstance(last, StreamError)
    return last


def outcome(error: StreamError) -> tuple[str, str, bool]:
    return error.status, error.error.category, error.error.retryable


async def test_retry_after_with_a_non_ascii_digit_keeps_the_rate_limit_category(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=429, headers={"Retry-After": "\u00b2"}, text="{}")

    last = await run_job(redis_client, keys, redis_url, handler)
    assert outcome(last) == ("failed", "rate_limited", True)


async def test_deeply_nested_error_body_keeps_the_status_category(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=400, body=b'{"error":' + b"[" * DEEP + b"]" * DEEP + b"}")

    last = await run_job(redis_client, keys, redis_url, handler)
    assert outcome(last) == ("failed", "invalid_request", False)


async def test_deeply_nested_event_payload_fails_protocol(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async def handler(request: web.Request) -> web.Response:
        body = b"data: {\"choices\":" + b"[" * DEEP + b"]" * DEEP + b"}\n\n"
        return web.Response(body=body, content_type="text/event-stream")

    last = await run_job(redis_client, keys, redis_url, handler)
    assert outcome(last) == ("failed", "protocol", False)


async def test_redirect_is_not_followed_so_provider_keys_stay_home(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    stolen: list[dict[str, str]] = []

    async def thief(request: web.Request) -> web.Response:
        stolen.append(dict(request.headers))
        return web.Response(text='event: message_stop\ndata: {"type":"message_stop"}\n\n',
                            content_type="text/event-stream")

    async with provider(thief) as elsewhere:
        async def handler(request: web.Request) -> web.Response:
            raise web.HTTPTemporaryRedirect(location=f"{elsewhere}/v1/messages")

        last = await run_job(redis_client, keys, redis_url, handler, job_provider="anthropic")
    assert stolen == []
    assert outcome(last) == ("failed", "upstream_error", False)
    assert "HTTP 307" in last.error.message


async def test_html_page_with_status_200_fails_protocol(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="<html><body>Sign in to the Wi-Fi</body></html>\n", content_type="text/html")

    last = await run_job(redis_client, keys, redis_url, handler)
    assert outcome(last) == ("failed", "protocol", False)


async def test_flood_of_comments_without_progress_hits_the_progress_timeout(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError, RuntimeError):
            for _ in range(100_000):  # bounded: far more than the test needs
                await response.write(b": keep-alive\n" * 4096)
        return response

    last = await run_job(redis_client, keys, redis_url, handler, progress_timeout_s=0.3, idle_timeout_s=5)
    assert outcome(last) == ("interrupted", "timeout", True)
    assert "progress" in last.error.message


async def test_deeply_nested_job_entry_is_acked_and_the_worker_keeps_running(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    poison = (b'{"stream_id":"st_deep","provider":"openai_chat","model":"m","request":{"x":'
              + b"[" * DEEP + b"]" * DEEP + b"}}")
    async with fake_upstream() as (base, _state), running_worker(settings_for(base, redis_url, keys), keys):
        await redis_client.xadd(keys.jobs_shard(0), {JOB_FIELD: poison})
        good = make_job("openai_chat", "simple_text_cyrillic_usage_chunk")
        await submit(redis_client, keys, good)
        assert (await wait_done(redis_client, keys, good.stream_id))["status"] == "completed"

        async def none_pending() -> bool:
            return await pending_count(redis_client, keys) == 0

        await wait_for(none_pending)


async def test_job_for_an_unknown_provider_ends_its_stream_failed_invalid_request(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    stream_id = "st_unknown_provider"
    await redis_client.hset(keys.meta(stream_id), mapping={"state": "queued", "last_seq": 0})
    entry = b'{"stream_id":"%s","provider":"nope","model":"m","request":{}}' % stream_id.encode()
    async with fake_upstream() as (base, state), running_worker(settings_for(base, redis_url, keys), keys):
        await redis_client.xadd(keys.jobs_shard(0), {JOB_FIELD: entry})
        await wait_done(redis_client, keys, stream_id)

        async def none_pending() -> bool:
            return await pending_count(redis_client, keys) == 0

        await wait_for(none_pending)
    assert state.requests == []
    events = await stored_events(redis_client, keys, stream_id)
    assert [e.seq for e in events] == [1, 2]
    last = events[-1]
    assert isinstance(last, StreamError)
    assert outcome(last) == ("failed", "invalid_request", False)
    assert (await meta(redis_client, keys, stream_id))["status"] == "failed"
