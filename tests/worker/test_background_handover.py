"""Background streams outlive their worker: SIGKILL or SIGTERM a worker process mid-stream, a successor re-attaches.

Three real ``fanout worker`` processes share one upstreams file whose endpoint runs in
background mode (:mod:`tools.fake_background` keeps every response); the test kills the
process holding the job at a chosen point and checks what Redis holds at the end and what
a reader connected through the publisher all along received.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis.asyncio as aioredis

from fanout_client import FanoutClient
from schema.contract import StreamError
from schema.keys import Keys
from tests.publisher.helpers import API_KEY, make_settings, running_publisher, token_for
from tests.worker.background import TEXT, TOOL, background_toml, comparable, contiguous, golden, workers
from tests.worker.support import (
    GUARD_S,
    fake_upstream,
    make_job,
    meta,
    stored_events,
    stored_ids,
    submit,
    wait_done,
    wait_for,
)
from tools.upstream import ServerConfig

PACED = ServerConfig(delay_ms=1, slow_delay_ms=150)
"""150 ms between the provider's events: room to kill between any two stored batches."""

KILL_POINTS = [
    (TEXT, 1),
    (TEXT, 5),
    (TOOL, 5),
    (TEXT, len(golden(TEXT)) - 1),
]
"""(case, the stored ``last_seq`` at which the holder is killed)."""
KILL_NAMES = ["before_first_delta", "mid_text", "mid_tool_arguments", "between_last_delta_and_terminal"]


async def _follow(client: FanoutClient, stream_id: str) -> dict[int, dict[str, Any]]:
    got: dict[int, dict[str, Any]] = {}
    async with asyncio.timeout(GUARD_S * 2):
        async for event in client.events(stream_id, token=token_for(stream_id)):
            assert event.seq not in got, f"seq {event.seq} delivered twice"
            got[event.seq] = msgspec.to_builtins(event)
    return got


async def _at_seq(redis: aioredis.Redis, keys: Keys, stream_id: str, seq: int) -> None:
    """Wait until ``seq`` is stored and meta names the background response."""
    async def reached() -> bool:
        found = await meta(redis, keys, stream_id)
        return int(found.get("last_seq", 0)) >= seq and "bg_id" in found

    await wait_for(reached, guard_s=GUARD_S * 2)


@pytest.mark.parametrize("point", KILL_POINTS, ids=KILL_NAMES)
async def test_sigkill_of_the_holder_loses_nothing(point: tuple[str, int], redis_url: str, keys: Keys,
                                                   redis_client: aioredis.Redis, tmp_path: Path) -> None:
    case, kill_at = point
    async with fake_upstream(PACED) as (base, state), workers(base, redis_url, keys, tmp_path, 3) as procs, \
            running_publisher(redis_url, keys, make_settings()) as url, FanoutClient(url, api_key=API_KEY) as fanout:
        job = make_job("openai_responses", f"slow-{case}", endpoint="bg")
        await submit(redis_client, keys, job)
        await _at_seq(redis_client, keys, job.stream_id, 1)
        reader = asyncio.create_task(_follow(fanout, job.stream_id))
        await _at_seq(redis_client, keys, job.stream_id, kill_at)
        holder = await procs.holder(redis_client)
        assert holder is not None
        holder.kill()
        await holder.wait()
        at_kill = await meta(redis_client, keys, job.stream_id)
        stored_meta = await wait_done(redis_client, keys, job.stream_id)
        seen = await reader
        logs = procs.logs()
    events = await stored_events(redis_client, keys, job.stream_id)
    assert comparable(events) == golden(case)
    assert contiguous(await stored_ids(redis_client, keys, job.stream_id))
    assert int(stored_meta["token"]) >= 2  # a successor finished it
    assert "Traceback" not in logs
    assert sorted(seen) == [e.seq for e in events]  # the reader: every seq, no gap
    assert [seen[e.seq] for e in events] == [msgspec.to_builtins(e) for e in events]
    assert int(at_kill["last_seq"]) < len(events)  # killed before the end, at the point named
    if kill_at == 1:  # only stream.start stored: the response id was stored without an event
        assert at_kill["last_seq"] == "1"
    assert "event=reattach_start" in logs  # re-attached to the same response: no second model call
    assert len(state.background.kept) == 1
    assert [after for _id, after in state.background.replays] == [None]  # a full replay from the start


@pytest.mark.parametrize("term_at", [1, 4], ids=["before_first_delta", "mid_text"])
async def test_sigterm_hands_background_streams_over_without_waiting_for_the_drain(
        term_at: int, redis_url: str, keys: Keys, redis_client: aioredis.Redis, tmp_path: Path) -> None:
    async with fake_upstream(PACED) as (base, state), \
            workers(base, redis_url, keys, tmp_path, 2, FANOUT_DRAIN_S="120") as procs, \
            running_publisher(redis_url, keys, make_settings()) as url, FanoutClient(url, api_key=API_KEY) as fanout:
        job = make_job("openai_responses", f"slow-{TEXT}", endpoint="bg")
        await submit(redis_client, keys, job)
        await _at_seq(redis_client, keys, job.stream_id, 1)
        reader = asyncio.create_task(_follow(fanout, job.stream_id))
        await _at_seq(redis_client, keys, job.stream_id, term_at)
        holder = await procs.holder(redis_client)
        assert holder is not None
        at_term = await meta(redis_client, keys, job.stream_id)
        holder.send_signal(signal.SIGTERM)
        # drain_s is 120 s: exiting within the guard proves the stream was given back, not drained
        assert await asyncio.wait_for(holder.wait(), GUARD_S) == 0
        stored_meta = await wait_done(redis_client, keys, job.stream_id)
        seen = await reader
        logs = procs.logs()
    events = await stored_events(redis_client, keys, job.stream_id)
    assert [seen[seq] for seq in sorted(seen)] == [msgspec.to_builtins(e) for e in events]  # no gap, no change
    assert "event=background_handover" in logs
    assert "Traceback" not in logs
    assert (at_term["last_seq"] == "1") is (term_at == 1)  # before the first delta: the id alone was stored
    assert "event=drain_expired" not in logs
    assert comparable(events) == golden(TEXT)
    assert stored_meta["token"] == "2"
    assert len(state.background.kept) == 1


@pytest.mark.parametrize("expected", [
    ("expire-", "interrupted", "worker_lost", "event=reattach_lost"),
    ("drift-", "failed", "protocol", "event=reattach_disagrees"),
], ids=["expired_window", "replay_disagrees"])
async def test_a_replay_that_cannot_continue_ends_the_stream(expected: tuple[str, str, str, str], redis_url: str,
                                                             keys: Keys, redis_client: aioredis.Redis,
                                                             tmp_path: Path) -> None:
    prefix, status, category, log_event = expected
    async with fake_upstream(PACED) as (base, _state), workers(base, redis_url, keys, tmp_path, 2) as procs:
        job = make_job("openai_responses", f"slow-{prefix}{TEXT}", endpoint="bg")
        await submit(redis_client, keys, job)
        await _at_seq(redis_client, keys, job.stream_id, 5)
        holder = await procs.holder(redis_client)
        assert holder is not None
        holder.kill()
        stored_meta = await wait_done(redis_client, keys, job.stream_id)
        logs = procs.logs()
    events = await stored_events(redis_client, keys, job.stream_id)
    last = events[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category) == (status, category)
    assert stored_meta["status"] == status
    assert comparable(events[:-1]) == golden(TEXT)[:len(events) - 1]  # nothing stored was changed
    assert contiguous(await stored_ids(redis_client, keys, job.stream_id))
    assert log_event in logs
    assert "Traceback" not in logs


async def test_an_endpoint_no_longer_in_background_mode_ends_the_stream_worker_lost(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis, tmp_path: Path) -> None:
    async with fake_upstream(PACED) as (base, state), workers(base, redis_url, keys, tmp_path, 1) as procs:
        job = make_job("openai_responses", f"slow-{TEXT}", endpoint="bg")
        await submit(redis_client, keys, job)
        await _at_seq(redis_client, keys, job.stream_id, 5)
        holder = await procs.holder(redis_client)
        assert holder is not None
        holder.kill()
        await holder.wait()
        (tmp_path / "upstreams.toml").write_text(background_toml(base, background=False))
        await procs.start(1)  # the successor reads the changed file
        stored_meta = await wait_done(redis_client, keys, job.stream_id)
        logs = procs.logs()
    last = (await stored_events(redis_client, keys, job.stream_id))[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category) == ("interrupted", "worker_lost")
    assert stored_meta["token"] == "2"
    assert "no longer runs in background mode" in logs
    assert state.background.replays == []  # nothing asked of the provider
