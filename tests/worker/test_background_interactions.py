"""Gemini Interactions background streams outlive their worker: SIGKILL the holder, a successor re-attaches.

As ``test_background_handover`` for OpenAI Responses, on the endpoint ``bgi``
(``api = "gemini_interactions"``, ``background = true``) of the fake provider
(:mod:`tools.fake_interactions`): three real ``fanout worker`` processes, the holder killed
at a chosen point, what Redis holds and what a reader saw compared with the golden.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import msgspec
import pytest
import redis.asyncio as aioredis

from fanout_client import FanoutClient
from schema.contract import StreamError
from schema.keys import Keys
from tests.publisher.helpers import API_KEY, make_settings, running_publisher
from tests.worker.background import background_toml, comparable, contiguous, golden, workers
from tests.worker.routes import routing_worker
from tests.worker.support import (
    fake_upstream,
    make_job,
    meta,
    settings_for,
    stored_events,
    stored_ids,
    submit,
    wait_done,
    wait_for,
)
from tests.worker.test_background_handover import PACED, _at_seq, _follow

THOUGHT = "thought_then_text"
"""Reasoning with a signature, then text (10 events)."""
CALL = "function_call_streamed_arguments"
"""A signed thought and a tool call whose arguments arrive in two fragments (10 events)."""
DIRECTORY = "gemini_interactions"

KILL_POINTS = [(THOUGHT, 1), (THOUGHT, 4), (CALL, 7), (THOUGHT, len(golden(THOUGHT, DIRECTORY)) - 1)]
"""(case, the stored ``last_seq`` at which the holder is killed)."""
KILL_NAMES = ["before_first_delta", "mid_reasoning", "mid_tool_arguments", "between_last_delta_and_terminal"]


@pytest.mark.parametrize("point", KILL_POINTS, ids=KILL_NAMES)
async def test_sigkill_of_the_holder_loses_nothing(point: tuple[str, int], redis_url: str, keys: Keys,
                                                   redis_client: aioredis.Redis, tmp_path: Path) -> None:
    case, kill_at = point
    async with fake_upstream(PACED) as (base, state), workers(base, redis_url, keys, tmp_path, 3) as procs, \
            running_publisher(redis_url, keys, make_settings()) as url, FanoutClient(url, api_key=API_KEY) as fanout:
        job = make_job("gemini_interactions", f"slow-{case}", endpoint="bgi")
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
    assert comparable(events) == golden(case, DIRECTORY)
    assert contiguous(await stored_ids(redis_client, keys, job.stream_id))
    assert int(stored_meta["token"]) >= 2  # a successor finished it
    assert "Traceback" not in logs
    assert sorted(seen) == [e.seq for e in events]  # the reader: every seq, no gap
    assert [seen[e.seq] for e in events] == [msgspec.to_builtins(e) for e in events]
    assert int(at_kill["last_seq"]) < len(events)
    kept = next(iter(state.background.kept))
    assert at_kill["bg_id"] == kept  # the interaction id was stored, with its last event_id as the cursor
    assert at_kill["bg_cursor"].startswith(f"{kept}.")
    assert "event=reattach_start" in logs
    assert len(state.background.kept) == 1  # no second model call
    assert state.background.cursors == [(kept, None)]  # a full replay from the first event


async def test_an_expired_interaction_ends_the_stream_worker_lost(redis_url: str, keys: Keys,
                                                                 redis_client: aioredis.Redis,
                                                                 tmp_path: Path) -> None:
    async with fake_upstream(PACED) as (base, _state), workers(base, redis_url, keys, tmp_path, 2) as procs:
        job = make_job("gemini_interactions", f"slow-expire-{THOUGHT}", endpoint="bgi")
        await submit(redis_client, keys, job)
        await _at_seq(redis_client, keys, job.stream_id, 4)
        holder = await procs.holder(redis_client)
        assert holder is not None
        holder.kill()
        stored_meta = await wait_done(redis_client, keys, job.stream_id)
        logs = procs.logs()
    events = await stored_events(redis_client, keys, job.stream_id)
    last = events[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category, stored_meta["status"]) == ("interrupted", "worker_lost", "interrupted")
    assert comparable(events[:-1]) == golden(THOUGHT, DIRECTORY)[:len(events) - 1]  # nothing stored changed
    assert "event=reattach_lost" in logs


async def test_the_fake_resumes_after_last_event_id_and_cancels() -> None:
    """The fake provider is faithful to E.3: ``last_event_id`` continues after that event; cancel stops it."""
    async with fake_upstream(PACED) as (base, state), aiohttp.ClientSession() as session:
        body = {"model": THOUGHT, "input": "hi", "stream": True, "background": True}
        async with session.post(f"{base}/v1beta/interactions", json=body) as response:
            first = await response.text()
        kept = next(iter(state.background.kept))
        ids = [line.split('"event_id":"')[1].split('"')[0] for line in first.splitlines() if '"event_id"' in line]
        async with session.get(f"{base}/v1beta/interactions/{kept}",
                               params={"stream": "true", "last_event_id": ids[3]}) as response:
            rest = await response.text()
        async with session.post(f"{base}/v1beta/interactions/{kept}/cancel") as response:
            assert response.status == 200
        async with session.get(f"{base}/v1beta/interactions/nope", params={"stream": "true"}) as response:
            assert response.status == 404
    assert ids == [f"{kept}.{n}" for n in range(len(ids))]
    assert f'"event_id":"{ids[4]}"' in rest
    assert f'"event_id":"{ids[3]}"' not in rest
    assert state.background.cancelled == [kept]


async def test_request_meta_and_cancel_of_a_background_interaction(redis_url: str, keys: Keys,
                                                                   redis_client: aioredis.Redis) -> None:
    async with fake_upstream(PACED) as (base, state):
        settings = settings_for(base, redis_url, keys)
        async with routing_worker(settings, keys, background_toml(base)):
            whole = make_job("gemini_interactions", CALL, endpoint="bgi")
            job = make_job("gemini_interactions", f"slow-{THOUGHT}", endpoint="bgi")
            for one in (whole, job):
                await submit(redis_client, keys, one)
            whole_meta = await wait_done(redis_client, keys, whole.stream_id)

            async def streaming() -> bool:
                return int((await meta(redis_client, keys, job.stream_id)).get("last_seq", 0)) >= 3

            await wait_for(streaming)
            await redis_client.set(keys.cancel(job.stream_id), 1)
            await redis_client.publish(keys.cancels, job.stream_id)
            stored_meta = await wait_done(redis_client, keys, job.stream_id)
    assert comparable(await stored_events(redis_client, keys, whole.stream_id)) == golden(CALL, DIRECTORY)
    kept = state.background.kept[whole_meta["bg_id"]]
    assert (whole_meta["bg_endpoint"], whole_meta["bg_cursor"]) == ("bgi", kept.events[-1]["event_id"])
    assert all(r["body"]["background"] is True and r["body"]["store"] is True for r in state.requests)
    assert all(r["headers"].get("Api-Revision") == "2026-05-20" for r in state.requests)
    assert stored_meta["status"] == "cancelled"
    assert state.background.cancelled == [stored_meta["bg_id"]]  # the provider's cancel was called
    assert state.background.kept[stored_meta["bg_id"]].events[-1]["status"] == "cancelled"
