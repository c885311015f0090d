"""The four named timeouts, each at its edge, with real sockets and sub-second limits."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from schema.contract import BlockDelta, StreamDone, StreamError
from schema.keys import Keys
from tests.worker.support import (
    fake_upstream,
    make_job,
    recorded,
    running_worker,
    settings_for,
    stored_events,
    submit,
    wait_done,
)
from tools.upstream import ServerConfig
from worker.control import Deadline, Stopped, Stopper
from worker.upstream import UpstreamTimeoutError

SLOW_ANTHROPIC = "slow-simple_text_ping_and_padding"


async def _run_one(redis_client: aioredis.Redis, keys: Keys, base: str, redis_url: str, *, provider: str,
                   model: str, **limits: float) -> StreamError | StreamDone:
    async with running_worker(settings_for(base, redis_url, keys, **limits), keys):
        job = make_job(provider, model)
        await submit(redis_client, keys, job)
        await wait_done(redis_client, keys, job.stream_id)
    last = (await stored_events(redis_client, keys, job.stream_id))[-1]
    assert isinstance(last, StreamError | StreamDone)
    return last


@contextlib.contextmanager
def _unaccepting_listener() -> Iterator[int]:
    """A port whose accept queue is full: a TCP connect to it hangs (SYNs dropped)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        server.close()


async def test_connect_timeout_before_any_byte_is_retried_then_interrupted(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    with _unaccepting_listener() as port:
        base = f"http://127.0.0.1:{port}"
        last = await _run_one(redis_client, keys, base, redis_url, provider="openai_chat", model="m",
                              connect_timeout_s=0.2, idle_timeout_s=5, progress_timeout_s=5, max_retries=1)
    assert isinstance(last, StreamError)
    assert (last.seq, last.status, last.error.category, last.error.retryable) == (2, "interrupted", "timeout", True)
    assert "connect" in last.error.message


async def test_idle_timeout_interrupts(redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async with fake_upstream() as (base, _state):
        last = await _run_one(redis_client, keys, base, redis_url, provider="anthropic", model="hang",
                              idle_timeout_s=0.3, progress_timeout_s=5, max_retries=0)
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category, last.error.retryable) == ("interrupted", "timeout", True)
    assert "idle timeout" in last.error.message


async def test_idle_timeout_after_output_ends_stream_without_retry(redis_url: str, keys: Keys,
                                                                   redis_client: aioredis.Redis) -> None:
    config = ServerConfig(chunk_bytes=900, slow_delay_ms=2000)  # the first read carries text, then silence
    async with fake_upstream(config) as (base, _state):
        last = await _run_one(redis_client, keys, base, redis_url, provider="openai_chat",
                              model="slow-simple_text_cyrillic_usage_chunk", idle_timeout_s=0.3, progress_timeout_s=5,
                              max_retries=2)
        assert len(await recorded(base)) == 1
    events = await stored_events(redis_client, keys, last.stream_id)
    assert any(isinstance(e, BlockDelta) for e in events)
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category) == ("interrupted", "timeout")


async def test_steady_bytes_within_idle_limit_complete(redis_url: str, keys: Keys,
                                                       redis_client: aioredis.Redis) -> None:
    config = ServerConfig(chunk_bytes=128, slow_delay_ms=50)  # a pause well under the idle limit
    async with fake_upstream(config) as (base, _state):
        last = await _run_one(redis_client, keys, base, redis_url, provider="anthropic", model=SLOW_ANTHROPIC,
                              idle_timeout_s=1.0, progress_timeout_s=5)
    assert isinstance(last, StreamDone)


async def test_progress_timeout_ignores_pings(redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    config = ServerConfig(ping_interval_ms=40)  # bytes keep flowing, well inside the idle limit
    async with fake_upstream(config) as (base, _state):
        for provider in ("anthropic", "openai_chat"):
            last = await _run_one(redis_client, keys, base, redis_url, provider=provider, model="pings",
                                  idle_timeout_s=0.5, progress_timeout_s=0.8, max_retries=0)
            assert isinstance(last, StreamError)
            assert (last.status, last.error.category) == ("interrupted", "timeout")
            assert "progress timeout" in last.error.message


async def test_total_timeout(redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    config = ServerConfig(chunk_bytes=16, slow_delay_ms=40)  # progressing steadily, but too long overall
    async with fake_upstream(config) as (base, _state):
        last = await _run_one(redis_client, keys, base, redis_url, provider="anthropic", model=SLOW_ANTHROPIC,
                              idle_timeout_s=1, progress_timeout_s=3, total_timeout_s=0.5)
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category) == ("interrupted", "timeout")
    assert "total time limit" in last.error.message


async def test_deadline_names_the_soonest_limit() -> None:
    deadline = Deadline(("idle", 5.0), ("progress", 3.0), ("total", 9.0))
    assert (deadline.kind, deadline.at) == ("progress", 3.0)
    error = deadline.error()
    assert isinstance(error, UpstreamTimeoutError)
    assert (error.kind, error.category, error.retryable) == ("progress", "timeout", True)


async def test_stopper_interrupts_a_wait_and_cancels_it() -> None:
    stopper = Stopper()
    never = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.05, stopper.stop, "cancel")
    with pytest.raises(Stopped) as caught:
        await stopper.race(never, Deadline(("total", asyncio.get_running_loop().time() + 60)))
    assert caught.value.reason == "cancel"
    await asyncio.sleep(0)
    assert never.cancelled()
