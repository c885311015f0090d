"""Cooldowns, per-endpoint concurrency caps, and where the answering endpoint shows (status route, client, telemetry).

Real sockets and real Redis: each endpoint is a fake provider of its own (tests/worker/routes.py).
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from fanout_client import FanoutClient
from schema.contract import StreamDone, StreamError
from schema.keys import Keys
from tests.publisher.helpers import API_KEY, running_publisher
from tests.worker.routes import OK, OK_MODEL, fakes, models_sent, routing_worker, run_route_job, upstreams_toml
from tests.worker.support import make_job, settings_for, stored_events, submit, wait_done
from tests.worker.test_telemetry import Captured
from tools.upstream import ServerConfig

SLOW = ServerConfig(delay_ms=1, slow_delay_ms=40)
"""``slow-<case>`` answers take a few hundred ms, so two jobs overlap."""


async def test_cooling_endpoint_is_skipped_then_used_again_after_its_cooldown(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async with fakes("a", "b") as servers:
        urls = {name: base for name, (base, _) in servers.items()}
        toml = upstreams_toml(urls, {"a": "status-429", "b": OK})  # a: 429 with Retry-After: 1
        async with routing_worker(settings_for(urls["a"], redis_url, keys, max_retries=1), keys, toml):
            first_at = time.monotonic()
            first = await run_route_job(redis_client, keys)
            second = await run_route_job(redis_client, keys)
            seen_while_cooling = len(servers["a"][1].requests)
            await asyncio.sleep(max(0.0, first_at + 1.1 - time.monotonic()))  # past a's Retry-After
            third = await run_route_job(redis_client, keys)
    assert [e[-1].endpoint for e in (first, second, third)] == ["b", "b", "b"]  # type: ignore[union-attr]
    assert seen_while_cooling == 1  # the second job never asked a
    assert len(servers["a"][1].requests) == 2  # the third did, once the cooldown was over
    assert len(servers["b"][1].requests) == 3


async def test_failures_in_a_row_cool_an_endpoint_down(redis_url: str, keys: Keys,
                                                       redis_client: aioredis.Redis) -> None:
    async with fakes("a", "b") as servers:
        urls = {name: base for name, (base, _) in servers.items()}
        toml = upstreams_toml(urls, {"a": "status-500", "b": OK})
        settings = settings_for(urls["a"], redis_url, keys, max_retries=1, cooldown_after_failures=2,
                                cooldown_failure_s=60.0)
        async with routing_worker(settings, keys, toml):
            await run_route_job(redis_client, keys)
            await run_route_job(redis_client, keys)
    assert len(servers["a"][1].requests) == 2  # both tries of the first job, none of the second
    assert len(servers["b"][1].requests) == 2


async def _two_at_once(redis: aioredis.Redis, keys: Keys) -> list[StreamDone]:
    jobs = [make_job("anthropic", "team-model") for _ in range(2)]
    for job in jobs:
        await submit(redis, keys, job)
    ends = []
    for job in jobs:
        await wait_done(redis, keys, job.stream_id)
        end = (await stored_events(redis, keys, job.stream_id))[-1]
        assert isinstance(end, StreamDone)
        ends.append(end)
    return ends


async def test_a_full_endpoint_sends_the_next_job_to_the_next_endpoint(redis_url: str, keys: Keys,
                                                                      redis_client: aioredis.Redis) -> None:
    async with fakes("a", "b", config=SLOW) as servers:
        urls = {name: base for name, (base, _) in servers.items()}
        toml = upstreams_toml(urls, {"a": f"slow-{OK}", "b": f"slow-{OK}"}, endpoint_keys={"a": "max_concurrency = 1"})
        async with routing_worker(settings_for(urls["a"], redis_url, keys, concurrency=4), keys, toml):
            ends = await _two_at_once(redis_client, keys)
    assert sorted(end.endpoint for end in ends) == ["a", "b"]  # type: ignore[type-var]
    assert servers["a"][1].open_max == 1
    assert len(servers["b"][1].requests) == 1


async def test_a_full_endpoint_makes_the_job_wait_when_the_route_says_wait(redis_url: str, keys: Keys,
                                                                          redis_client: aioredis.Redis) -> None:
    async with fakes("a", "b", config=SLOW) as servers:
        urls = {name: base for name, (base, _) in servers.items()}
        toml = upstreams_toml(urls, {"a": f"slow-{OK}", "b": f"slow-{OK}"}, endpoint_keys={"a": "max_concurrency = 1"},
                              route_keys='on_full = "wait"')
        async with routing_worker(settings_for(urls["a"], redis_url, keys, concurrency=4), keys, toml):
            ends = await _two_at_once(redis_client, keys)
    assert [end.endpoint for end in ends] == ["a", "a"]
    assert servers["a"][1].open_max == 1  # the second request only after the first answer ended
    assert len(servers["a"][1].requests) == 2
    assert servers["b"][1].requests == []


async def test_status_route_and_client_name_the_answering_endpoint_and_model(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async with fakes("a", "b") as servers:
        urls = {name: base for name, (base, _) in servers.items()}
        toml = upstreams_toml(urls, {"a": "status-503", "b": OK})
        async with routing_worker(settings_for(urls["a"], redis_url, keys, max_retries=0), keys, toml), \
                running_publisher(redis_url, keys) as publisher:
            job = make_job("anthropic", "team-model")
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
            async with FanoutClient(publisher, api_key=API_KEY) as client:
                status = await client.status(job.stream_id)
                result = await client.result(job.stream_id)
    assert (status["endpoint"], status["model"], status["status"]) == ("b", "team-model", "completed")
    assert (status["result"]["endpoint"], status["result"]["model"]) == ("b", OK_MODEL)
    assert (result.endpoint, result.model) == ("b", OK_MODEL)


async def test_attempts_are_spans_and_metrics_labelled_by_endpoint(redis_url: str, keys: Keys,
                                                                   redis_client: aioredis.Redis) -> None:
    captured = Captured()
    async with fakes("a", "b") as servers:
        urls = {name: base for name, (base, _) in servers.items()}
        toml = upstreams_toml(urls, {"a": "status-429", "b": OK})
        async with routing_worker(settings_for(urls["a"], redis_url, keys), keys, toml, telemetry=captured.telemetry):
            await run_route_job(redis_client, keys)
    spans = [s for s in captured.spans.get_finished_spans() if s.name == "fanout.upstream"]
    assert [(s.attributes or {}).get("fanout.endpoint") for s in spans] == ["a", "b"]
    assert captured.total("fanout.upstream.attempts", endpoint="a", category="rate_limited") == 1
    assert captured.total("fanout.upstream.attempts", endpoint="b", category="none") == 1
    assert captured.total("fanout.upstream.fallbacks", endpoint="a") == 1
    assert captured.total("fanout.endpoint.cooldowns", endpoint="a") == 1
    assert models_sent(servers["b"][1]) == [OK]


async def test_a_job_waiting_for_a_slot_past_its_total_time_ends_interrupted_timeout(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async with fakes("a", "b") as servers:
        urls = {name: base for name, (base, _) in servers.items()}
        toml = upstreams_toml(urls, {"a": OK, "b": OK}, endpoint_keys={"a": "max_concurrency = 1"},
                              route_keys='on_full = "wait"')
        async with routing_worker(settings_for(urls["a"], redis_url, keys, total_timeout_s=0.5), keys, toml) as worker:
            worker.ctx.router.slots.take("a")  # held by a job of this process that never ends
            events = await run_route_job(redis_client, keys)
    end = events[-1]
    assert isinstance(end, StreamError)
    assert (end.status, end.error.category) == ("interrupted", "timeout")
    assert "no free slot" in end.error.message
    assert servers["a"][1].requests == []
    assert servers["b"][1].requests == []
