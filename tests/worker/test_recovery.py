"""Crash recovery: leases, reclaim by XAUTOCLAIM, fencing, and SIGTERM drain of a real `fanout worker`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from schema.contract import BlockDelta, BlockRef, BlockStart, Delta, Event, StreamDone, StreamError, StreamStart
from schema.job import Job
from schema.keys import Keys
from tests.conftest import is_cluster_url
from tests.worker.support import (
    GUARD_S,
    fake_upstream,
    make_job,
    meta,
    pending_count,
    recorded,
    running_worker,
    settings_for,
    stored_events,
    strip_volatile,
    submit,
    wait_done,
    wait_for,
)
from tools.replay import replay_file
from tools.upstream import DEFAULT_ROOTS, ServerConfig
from worker.appender import Appender
from worker.intake import Intake
from worker.lease import Leases

pytestmark = pytest.mark.topologies

ROOT = Path(__file__).resolve().parents[2]
CHAT_CASE = DEFAULT_ROOTS[1] / "openai_chat" / "simple_text_cyrillic_usage_chunk.sse"


async def _leave_as_dead_worker(redis: aioredis.Redis, keys: Keys, job: Job, stored: int) -> str:
    """Put the job in the state a worker that died after storing ``stored`` events leaves."""
    intake = Intake(redis, keys, consumer="dead-1", lease_s=30)
    await intake.ensure_groups()
    entry = await submit(redis, keys, job)
    assert [e for e, _ in await intake.read_new(keys.jobs_shard(0), 1, block_ms=100)] == [entry]
    claim = await Leases(redis, keys, consumer="dead-1", lease_s=30).claim(
        stream_id=job.stream_id, provider=job.provider, model=job.model, entry_id=entry, now_ms=1_000)
    ref = BlockRef(id="b0", index=0, kind="text")
    events: list[Event] = [
        StreamStart(stream_id=job.stream_id, seq=1, ts=1_000, provider=job.provider, model=job.model, metadata={}),
        BlockStart(stream_id=job.stream_id, seq=2, ts=1_001, block=ref),
        BlockDelta(stream_id=job.stream_id, seq=3, ts=1_002, block=ref, delta=Delta(kind="text", text="Hel")),
    ]
    writer = Appender(redis, keys).writer(job.stream_id, token=claim.token, last_seq=0)
    await writer.append(events[:stored])
    return entry


async def test_dead_worker_job_reclaimed_and_worker_lost_written(redis_url: str, keys: Keys,
                                                                 redis_client: aioredis.Redis) -> None:
    job = make_job("openai_chat", "simple_text_cyrillic_usage_chunk")
    await _leave_as_dead_worker(redis_client, keys, job, stored=3)
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys, lease_s=0.3), keys, consumer="heir"):
            state = await wait_done(redis_client, keys, job.stream_id)
        assert await recorded(base) == []  # output was stored: never run again
    events = await stored_events(redis_client, keys, job.stream_id)
    assert [e.seq for e in events] == [1, 2, 3, 4]
    last = events[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category, last.error.retryable) == ("interrupted", "worker_lost", True)
    assert (state["owner"], state["token"], state["status"]) == ("heir", "2", "interrupted")
    assert await pending_count(redis_client, keys) == 0


async def test_reclaimed_job_with_only_start_is_retried(redis_url: str, keys: Keys,
                                                        redis_client: aioredis.Redis) -> None:
    job = make_job("openai_chat", "simple_text_cyrillic_usage_chunk")
    await _leave_as_dead_worker(redis_client, keys, job, stored=1)
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys, lease_s=0.3), keys, consumer="heir"):
            await wait_done(redis_client, keys, job.stream_id)
        assert len(await recorded(base)) == 1
    events = await stored_events(redis_client, keys, job.stream_id)
    assert sum(isinstance(e, StreamStart) for e in events) == 1
    golden, _ = replay_file(CHAT_CASE)
    assert strip_volatile(events[1:]) == strip_volatile(golden[1:])
    assert isinstance(events[-1], StreamDone)
    assert await pending_count(redis_client, keys) == 0


async def test_fenced_worker_cannot_append(redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    config = ServerConfig(chunk_bytes=200, slow_delay_ms=100)
    async with fake_upstream(config) as (base, state):
        settings = settings_for(base, redis_url, keys, lease_s=30)
        async with running_worker(settings, keys, consumer="victim") as victim:
            job = make_job("anthropic", "slow-simple_text_ping_and_padding")
            entry = await submit(redis_client, keys, job)

            async def some_output() -> bool:
                return int((await meta(redis_client, keys, job.stream_id)).get("last_seq", 0)) >= 3

            await wait_for(some_output)
            # Another worker takes the stream over: a new fencing token and the pending entry.
            await Leases(redis_client, keys, consumer="thief", lease_s=30).claim(
                stream_id=job.stream_id, provider=job.provider, model=job.model, entry_id=entry, now_ms=1)
            await redis_client.xclaim(keys.jobs_shard(0), "workers", "thief", 0, [keys.parse_job_ref(entry)[1]],
                                      justid=True)
            before = int((await meta(redis_client, keys, job.stream_id))["last_seq"])

            async def victim_gave_up() -> bool:
                return not victim.runs

            await wait_for(victim_gave_up)

            async def upstream_aborted() -> bool:
                return "client_left" in state.outcomes

            await wait_for(upstream_aborted)
        after = await meta(redis_client, keys, job.stream_id)
    assert int(after["last_seq"]) <= before + 1  # at most the batch already in flight
    assert after["state"] == "running"  # no terminal from the fenced worker
    pending = await redis_client.xpending_range(keys.jobs_shard(0), "workers", min="-", max="+", count=10)
    assert [(p["message_id"].decode(), p["consumer"].decode()) for p in pending] == [
        (keys.parse_job_ref(entry)[1], "thief")]


async def test_lease_renewal_keeps_running_job_from_reclaim(redis_url: str, keys: Keys,
                                                            redis_client: aioredis.Redis) -> None:
    config = ServerConfig(chunk_bytes=200, slow_delay_ms=100)  # about a second: three leases long
    async with fake_upstream(config) as (base, _state):
        settings = settings_for(base, redis_url, keys, lease_s=0.3)
        async with running_worker(settings, keys, consumer="a"), running_worker(settings, keys, consumer="b"):
            job = make_job("anthropic", "slow-simple_text_ping_and_padding")
            await submit(redis_client, keys, job)
            state = await wait_done(redis_client, keys, job.stream_id)
        assert len(await recorded(base)) == 1
    assert state["token"] == "1"  # claimed once, never taken over
    assert state["status"] == "completed"


# -- real processes ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _worker_process(base: str, redis_url: str, keys: Keys, log: Path, **env: str) -> AsyncIterator[
        asyncio.subprocess.Process]:
    variables = {
        **os.environ, "REDIS_URL": redis_url, "FANOUT_REDIS_PREFIX": keys.prefix, "FANOUT_BLOCK_MS": "50",
        "FANOUT_OPENAI_BASE_URL": f"{base}/v1", "FANOUT_ANTHROPIC_BASE_URL": base, "FANOUT_GEMINI_BASE_URL": base,
        "FANOUT_BACKOFF_BASE_S": "0.01", "FANOUT_BACKOFF_MAX_S": "0.05",
        "FANOUT_REDIS_CLUSTER": "1" if is_cluster_url(redis_url) else "0", **env,
    }
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fanout_cli", "worker", "--concurrency", "4", cwd=ROOT, env=variables,
            stdout=sink, stderr=sink,
        )
        try:
            yield process
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()


async def _wait_exit(process: asyncio.subprocess.Process) -> int:
    return await asyncio.wait_for(process.wait(), GUARD_S)


async def test_sigterm_drains(redis_url: str, keys: Keys, redis_client: aioredis.Redis, tmp_path: Path) -> None:
    config = ServerConfig(chunk_bytes=300, slow_delay_ms=80)
    async with fake_upstream(config) as (base, state):
        async with _worker_process(base, redis_url, keys, tmp_path / "worker.log", FANOUT_DRAIN_S="10") as process:
            job = make_job("anthropic", "slow-simple_text_ping_and_padding")
            await submit(redis_client, keys, job)

            async def streaming() -> bool:
                return int((await meta(redis_client, keys, job.stream_id)).get("last_seq", 0)) >= 2

            await wait_for(streaming)
            process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.2)
            late = make_job("anthropic", "simple_text_ping_and_padding")
            await submit(redis_client, keys, late)  # after SIGTERM: must not be taken
            assert await _wait_exit(process) == 0
        assert state.outcomes == ["complete"]
    last = (await stored_events(redis_client, keys, job.stream_id))[-1]
    assert isinstance(last, StreamDone)
    assert await stored_events(redis_client, keys, late.stream_id) == []
    assert await pending_count(redis_client, keys) == 0
    assert "event=drain_start" in (tmp_path / "worker.log").read_text()


async def test_sigterm_after_drain_leaves_job_pending_for_reclaim(redis_url: str, keys: Keys,
                                                                  redis_client: aioredis.Redis,
                                                                  tmp_path: Path) -> None:
    async with fake_upstream() as (base, _state):
        async with _worker_process(base, redis_url, keys, tmp_path / "worker.log", FANOUT_DRAIN_S="0.3",
                                   FANOUT_LEASE_S="30") as process:
            job = make_job("openai_chat", "hang")
            entry = await submit(redis_client, keys, job)

            async def started() -> bool:
                return (await meta(redis_client, keys, job.stream_id)).get("last_seq") == "1"

            await wait_for(started)
            process.send_signal(signal.SIGTERM)
            assert await _wait_exit(process) == 0
        assert (await meta(redis_client, keys, job.stream_id))["state"] == "running"  # no terminal written
        pending = await redis_client.xpending_range(keys.jobs_shard(0), "workers", min="-", max="+", count=10)
        assert [p["message_id"].decode() for p in pending] == [keys.parse_job_ref(entry)[1]]
        assert pending[0]["time_since_delivered"] >= 30_000  # released: reclaimable at once
        # Another worker takes it over at once and retries it (only stream.start was stored).
        settings = settings_for(base, redis_url, keys, lease_s=30, idle_timeout_s=0.2, max_retries=0)
        async with running_worker(settings, keys, consumer="heir"):
            state = await wait_done(redis_client, keys, job.stream_id)
    assert (state["owner"], state["token"]) == ("heir", "2")
    events = await stored_events(redis_client, keys, job.stream_id)
    assert [type(e).__name__ for e in events] == ["StreamStart", "StreamError"]


async def test_killed_worker_process_is_recovered(redis_url: str, keys: Keys, redis_client: aioredis.Redis,
                                                  tmp_path: Path) -> None:
    config = ServerConfig(chunk_bytes=300, slow_delay_ms=100)
    async with fake_upstream(config) as (base, _state):
        async with _worker_process(base, redis_url, keys, tmp_path / "worker.log", FANOUT_LEASE_S="0.6") as process:
            job = make_job("anthropic", "slow-simple_text_ping_and_padding")
            await submit(redis_client, keys, job)

            async def has_delta() -> bool:
                events = await stored_events(redis_client, keys, job.stream_id)
                return any(isinstance(e, BlockDelta) for e in events)

            await wait_for(has_delta)
            process.kill()
            await _wait_exit(process)
        async with running_worker(settings_for(base, redis_url, keys, lease_s=0.6), keys, consumer="heir"):
            state = await wait_done(redis_client, keys, job.stream_id)
    last = (await stored_events(redis_client, keys, job.stream_id))[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category) == ("interrupted", "worker_lost")
    assert state["owner"] == "heir"
    assert await pending_count(redis_client, keys) == 0
