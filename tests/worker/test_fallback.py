"""Fallback before the first token, over real sockets and real Redis: each failure kind, two and three endpoints.

Every endpoint is a fake provider of its own; the route's ``upstream_model`` tells each what
to answer. The worker retries an endpoint by its policy (``max_retries=1`` here), then
falls back; after the first stored delta it never does.
"""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from schema.contract import StreamDone, StreamError, StreamStart
from schema.keys import Keys
from schema.validate import validate
from tests.worker.routes import (
    AFTER_CONTENT,
    IN_STREAM,
    OK,
    OK_MODEL,
    closed_port_url,
    fakes,
    models_sent,
    routing_worker,
    run_route_job,
    upstreams_toml,
)
from tests.worker.support import settings_for, strip_volatile
from tools.replay import replay_file
from tools.upstream import DEFAULT_ROOTS

SHORT = "idle_timeout_s = 0.3\nprogress_timeout_s = 0.3"
"""A failing endpoint's own short deadlines (the worker's are 3 s): per-endpoint timeouts at work."""

KINDS: dict[str, tuple[str, int]] = {
    "http_429": ("status-429", 1),  # Retry-After: 1 -> cools down -> falls back without retrying
    "http_503": ("status-503", 1),  # Retry-After: 1 as well
    "http_500": ("status-500", 2),  # no Retry-After: its retry policy first (1 + max_retries)
    "http_529": ("status-529", 2),
    "in_stream_error_before_content": (IN_STREAM, 2),
    "progress_timeout": ("pings", 2),
    "idle_timeout": ("hang", 2),
    "connection_refused": ("", 0),
}
"""Failure kind → (the failing endpoint's upstream model, requests it gets before the job falls back)."""


def _failing(kind: str, name: str, urls: dict[str, str], models: dict[str, str]) -> None:
    model, _requests = KINDS[kind]
    if kind == "connection_refused":
        urls[name] = closed_port_url()
        model = OK
    models[name] = model


def _assert_answered_by(events: list, endpoint: str) -> None:  # type: ignore[type-arg]
    done = events[-1]
    assert isinstance(done, StreamDone), done
    assert (done.endpoint, done.model) == (endpoint, OK_MODEL)
    assert validate(events) == []
    assert sum(isinstance(e, StreamStart) for e in events) == 1
    golden, _ = replay_file(DEFAULT_ROOTS[0] / "anthropic" / f"{OK}.sse")
    without = [{k: v for k, v in e.items() if k != "endpoint"} for e in strip_volatile(events)]
    assert without == strip_volatile(golden)


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_falls_back_to_the_second_endpoint(kind: str, redis_url: str, keys: Keys,
                                                 redis_client: aioredis.Redis) -> None:
    async with fakes("a", "b") as servers:
        urls = {name: base for name, (base, _) in servers.items()}
        models = {"b": OK}
        _failing(kind, "a", urls, models)
        toml = upstreams_toml(urls, models, endpoint_keys={"a": SHORT})
        async with routing_worker(settings_for(urls["b"], redis_url, keys, max_retries=1), keys, toml):
            events = await run_route_job(redis_client, keys)
    _assert_answered_by(events, "b")
    assert len(servers["a"][1].requests) == KINDS[kind][1]
    assert models_sent(servers["b"][1]) == [OK]


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_falls_back_over_three_endpoints(kind: str, redis_url: str, keys: Keys,
                                               redis_client: aioredis.Redis) -> None:
    async with fakes("a", "b", "c") as servers:
        urls = {name: base for name, (base, _) in servers.items()}
        models = {"c": OK}
        _failing(kind, "a", urls, models)
        models["b"] = "status-500" if kind != "http_500" else IN_STREAM
        toml = upstreams_toml(urls, models, endpoint_keys={"a": SHORT})
        async with routing_worker(settings_for(urls["c"], redis_url, keys, max_retries=1), keys, toml):
            events = await run_route_job(redis_client, keys)
    _assert_answered_by(events, "c")
    assert len(servers["a"][1].requests) == KINDS[kind][1]
    assert len(servers["b"][1].requests) == 2
    assert models_sent(servers["c"][1]) == [OK]


async def test_no_fallback_after_the_first_delta(redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async with fakes("a", "b") as servers:
        urls = {name: base for name, (base, _) in servers.items()}
        toml = upstreams_toml(urls, {"a": AFTER_CONTENT, "b": OK})
        async with routing_worker(settings_for(urls["a"], redis_url, keys, max_retries=1), keys, toml):
            events = await run_route_job(redis_client, keys)
    end = events[-1]
    assert isinstance(end, StreamError)
    assert (end.endpoint, end.error.category, end.error.retryable) == ("a", "upstream_error", True)
    assert servers["b"][1].requests == []
    assert len(servers["a"][1].requests) == 1
    golden, _ = replay_file(DEFAULT_ROOTS[0] / "anthropic" / f"{AFTER_CONTENT}.sse")
    assert [{k: v for k, v in e.items() if k != "endpoint"} for e in strip_volatile(events)] == \
        strip_volatile(golden)


async def test_every_endpoint_failing_stores_the_last_error_naming_its_endpoint(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async with fakes("a", "b") as servers:
        urls = {name: base for name, (base, _) in servers.items()}
        toml = upstreams_toml(urls, {"a": "status-503", "b": "status-500"})
        async with routing_worker(settings_for(urls["a"], redis_url, keys, max_retries=1), keys, toml):
            events = await run_route_job(redis_client, keys)
    assert [type(e) for e in events] == [StreamStart, StreamError]
    end = events[-1]
    assert isinstance(end, StreamError)
    assert (end.endpoint, end.error.category, end.status) == ("b", "upstream_error", "failed")
    assert "HTTP 500" in end.error.message


async def test_a_job_naming_an_endpoint_gets_only_that_endpoint(redis_url: str, keys: Keys,
                                                                redis_client: aioredis.Redis) -> None:
    async with fakes("a", "b") as servers:
        urls = {name: base for name, (base, _) in servers.items()}
        toml = upstreams_toml(urls, {"a": "status-503", "b": OK})
        async with routing_worker(settings_for(urls["a"], redis_url, keys, max_retries=0), keys, toml):
            events = await run_route_job(redis_client, keys, model="status-503", endpoint="a")
    end = events[-1]
    assert isinstance(end, StreamError)
    assert (end.endpoint, end.error.category) == ("a", "upstream_overloaded")
    assert servers["b"][1].requests == []
    assert models_sent(servers["a"][1]) == ["status-503"]

