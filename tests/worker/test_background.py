"""Background mode in one worker: the request, the meta fields stored with the events, the provider's cancel."""

from __future__ import annotations

import redis.asyncio as aioredis

from schema.contract import StreamError
from schema.keys import Keys
from tests.worker.background import MIXED, TEXT, TOOL, background_toml, comparable, golden
from tests.worker.routes import routing_worker
from tests.worker.support import (
    fake_upstream,
    make_job,
    meta,
    settings_for,
    stored_events,
    submit,
    wait_done,
    wait_for,
)
from tools.upstream import ServerConfig


async def test_background_stream_stores_response_id_and_cursor(redis_url: str, keys: Keys,
                                                               redis_client: aioredis.Redis) -> None:
    async with fake_upstream(ServerConfig(delay_ms=1)) as (base, state):
        settings = settings_for(base, redis_url, keys)
        async with routing_worker(settings, keys, background_toml(base)):
            jobs = [make_job("openai_responses", case, endpoint="bg") for case in (TEXT, TOOL, MIXED)]
            for job in jobs:
                await submit(redis_client, keys, job)
            found = [await wait_done(redis_client, keys, job.stream_id) for job in jobs]
    for job, stored_meta in zip(jobs, found, strict=True):
        assert comparable(await stored_events(redis_client, keys, job.stream_id)) == golden(job.model)
        kept = state.background.kept[stored_meta["bg_id"]]
        assert stored_meta["bg_endpoint"] == "bg"
        assert int(stored_meta["bg_cursor"]) == len(kept.events) - 1  # the terminal's sequence_number
    bodies = [request["body"] for request in state.requests]
    assert all(body["background"] is True and body["store"] is True and body["stream"] is True for body in bodies)


async def test_endpoint_without_background_sends_no_background_and_stores_no_id(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async with fake_upstream(ServerConfig(delay_ms=1)) as (base, state):
        settings = settings_for(base, redis_url, keys)
        async with routing_worker(settings, keys, background_toml(base, background=False)):
            job = make_job("openai_responses", TEXT, endpoint="bg")
            await submit(redis_client, keys, job)
            stored_meta = await wait_done(redis_client, keys, job.stream_id)
    assert "bg_id" not in stored_meta
    assert "bg_cursor" not in stored_meta
    assert "background" not in state.requests[0]["body"]
    assert state.background.kept == {}


async def test_cancel_of_background_stream_calls_the_providers_cancel(redis_url: str, keys: Keys,
                                                                     redis_client: aioredis.Redis) -> None:
    async with fake_upstream(ServerConfig(delay_ms=1, slow_delay_ms=200)) as (base, state):
        settings = settings_for(base, redis_url, keys)
        async with routing_worker(settings, keys, background_toml(base)):
            job = make_job("openai_responses", f"slow-{TEXT}", endpoint="bg")
            await submit(redis_client, keys, job)

            async def streaming() -> bool:
                return int((await meta(redis_client, keys, job.stream_id)).get("last_seq", 0)) >= 3

            await wait_for(streaming)
            await redis_client.set(keys.cancel(job.stream_id), 1)
            await redis_client.publish(keys.cancels, job.stream_id)
            stored_meta = await wait_done(redis_client, keys, job.stream_id)
    assert stored_meta["status"] == "cancelled"
    assert state.background.cancelled == [stored_meta["bg_id"]]
    assert state.background.kept[stored_meta["bg_id"]].events[-1]["type"] == "response.cancelled"
    last = (await stored_events(redis_client, keys, job.stream_id))[-1]
    assert isinstance(last, StreamError)
    assert last.error.category == "cancelled"
