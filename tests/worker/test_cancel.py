"""Cancellation: the publisher's flag + notification stop the upstream and store `cancelled`."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from schema.contract import BlockDelta, StreamError
from schema.keys import Keys
from tests.worker.support import (
    fake_upstream,
    make_job,
    meta,
    pending_count,
    recorded,
    running_worker,
    settings_for,
    stored_events,
    submit,
    wait_done,
    wait_for,
)
from tools.upstream import ServerConfig
from worker.attempt import RetryAttempt

pytestmark = pytest.mark.topologies


async def _request_cancel(redis: aioredis.Redis, keys: Keys, stream_id: str, *, notify: bool = True) -> None:
    """What the publisher does on POST /v1/streams/{id}/cancel."""
    await redis.set(keys.cancel(stream_id), 1)
    if notify:
        await redis.publish(keys.cancels, stream_id)


def _assert_cancelled(last: object) -> None:
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category, last.error.retryable) == ("cancelled", "cancelled", False)


async def test_cancel_aborts_upstream_and_writes_cancelled(redis_url: str, keys: Keys,
                                                           redis_client: aioredis.Redis) -> None:
    config = ServerConfig(chunk_bytes=300, slow_delay_ms=200)
    async with fake_upstream(config) as (base, state), running_worker(
            settings_for(base, redis_url, keys, lease_s=30), keys):
        job = make_job("anthropic", "slow-simple_text_ping_and_padding")
        await submit(redis_client, keys, job)

        async def has_delta() -> bool:
            return any(isinstance(e, BlockDelta) for e in await stored_events(redis_client, keys, job.stream_id))

        await wait_for(has_delta)
        await _request_cancel(redis_client, keys, job.stream_id)
        await wait_done(redis_client, keys, job.stream_id)

        async def upstream_aborted() -> bool:
            return state.outcomes == ["client_left"]

        await wait_for(upstream_aborted)
    events = await stored_events(redis_client, keys, job.stream_id)
    _assert_cancelled(events[-1])
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert (await meta(redis_client, keys, job.stream_id))["status"] == "cancelled"
    assert await pending_count(redis_client, keys) == 0


async def test_cancel_flag_set_before_start_writes_cancelled_without_upstream(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    job = make_job("openai_chat", "simple_text_cyrillic_usage_chunk")
    await _request_cancel(redis_client, keys, job.stream_id, notify=False)
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys), keys):
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
        assert await recorded(base) == []
    events = await stored_events(redis_client, keys, job.stream_id)
    assert [type(e).__name__ for e in events] == ["StreamStart", "StreamError"]
    _assert_cancelled(events[-1])


async def test_missed_notification_is_caught_at_lease_renewal(redis_url: str, keys: Keys,
                                                               redis_client: aioredis.Redis) -> None:
    async with fake_upstream() as (base, state), running_worker(settings_for(base, redis_url, keys, lease_s=0.3), keys):
        job = make_job("gemini", "hang")
        await submit(redis_client, keys, job)

        async def started() -> bool:
            return (await meta(redis_client, keys, job.stream_id)).get("last_seq") == "1"

        await wait_for(started)
        await _request_cancel(redis_client, keys, job.stream_id, notify=False)  # flag only
        await wait_done(redis_client, keys, job.stream_id)

        async def upstream_aborted() -> bool:
            return state.outcomes == ["client_left"]

        await wait_for(upstream_aborted)
    _assert_cancelled((await stored_events(redis_client, keys, job.stream_id))[-1])


async def test_cancel_during_retry_backoff_stops_retrying(redis_url: str, keys: Keys,
                                                          redis_client: aioredis.Redis) -> None:
    # The fake's 503 asks Retry-After: 1; the cancel lands during that wait, so no second request.
    async with fake_upstream() as (base, _state):
        settings = settings_for(base, redis_url, keys, lease_s=30, max_retries=1, retry_after_max_s=5.0)
        async with running_worker(settings, keys):
            job = make_job("openai_responses", "status-503")
            await submit(redis_client, keys, job)

            async def first_request_done() -> bool:
                return len(await recorded(base)) == 1

            await wait_for(first_request_done)
            await _request_cancel(redis_client, keys, job.stream_id)
            await wait_done(redis_client, keys, job.stream_id)
        assert len(await recorded(base)) == 1
    events = await stored_events(redis_client, keys, job.stream_id)
    assert [e.seq for e in events] == [1, 2]
    _assert_cancelled(events[-1])


async def test_cancel_for_a_stream_not_running_here_is_ignored(redis_url: str, keys: Keys,
                                                               redis_client: aioredis.Redis) -> None:
    config = ServerConfig(chunk_bytes=300, slow_delay_ms=50)
    async with fake_upstream(config) as (base, _state), running_worker(settings_for(base, redis_url, keys), keys):
        job = make_job("anthropic", "slow-simple_text_ping_and_padding")
        await submit(redis_client, keys, job)
        await redis_client.publish(keys.cancels, "st_someone_else")
        state = await wait_done(redis_client, keys, job.stream_id)
    assert state["status"] == "completed"


async def test_retry_loop_lets_task_cancellation_through() -> None:
    # The retry library must not swallow asyncio cancellation (a hard stop after the drain).
    started = asyncio.Event()

    async def attempt() -> None:
        started.set()
        await asyncio.sleep(60)

    retrying = AsyncRetrying(stop=stop_after_attempt(5), retry=retry_if_exception_type(RetryAttempt), reraise=True)
    task = asyncio.create_task(retrying(attempt))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
