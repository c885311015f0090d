"""Fallback before the first token, over real sockets and real Redis: each failure kind, two and three endpoints.

Every endpoint is a fake provider of its own; the route's ``upstream_model`` tells each what
to answer. The worker retries an endpoint by its policy (``max_retries=1`` here), then
falls back; after the first stored delta it never does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from schema.contract import BlockDelta, StreamDone, StreamError, StreamStart
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
    unaccepting_url,
    upstreams_toml,
)
from tests.worker.support import make_job, settings_for, stored_events, strip_volatile, submit, wait_done
from tools.replay import TRANSCRIPT_DIRS, replay_file
from tools.upstream import DEFAULT_ROOTS

SHORT = "idle_timeout_s = 0.3\nprogress_timeout_s = 0.3\nconnect_timeout_s = 0.3"
"""A failing endpoint's own short deadlines: per-endpoint timeouts at work."""
PATIENT = {"connect_timeout_s": 60.0, "idle_timeout_s": 60.0, "progress_timeout_s": 60.0, "total_timeout_s": 8.0}
"""The worker's own deadlines: were the endpoint's not applied, a timing-out endpoint would use up the job's
total time and no fallback could happen."""

KINDS: dict[str, tuple[str, int]] = {
    "http_429": ("status-429", 1),  # Retry-After: 1 -> cools down -> falls back without retrying
    "http_503": ("status-503", 1),  # Retry-After: 1 as well
    "http_500": ("status-500", 2),  # no Retry-After: its retry policy first (1 + max_retries)
    "http_529": ("status-529", 2),
    "in_stream_error_before_content": (IN_STREAM, 2),
    "progress_timeout": ("pings", 2),
    "idle_timeout": ("hang", 2),
    "connection_refused": ("", 0),
    "connect_timeout": ("", 0),
}
"""Failure kind → (the failing endpoint's upstream model, requests it gets before the job falls back)."""


def _failing(kind: str, name: str, urls: dict[str, str], models: dict[str, str], hanging: str) -> None:
    model, _requests = KINDS[kind]
    if kind in ("connection_refused", "connect_timeout"):
        urls[name] = closed_port_url() if kind == "connection_refused" else hanging
        model = OK
    models[name] = model


@pytest.fixture
def hanging() -> Iterator[str]:
    """A URL whose TCP connects hang (:func:`tests.worker.routes.unaccepting_url`)."""
    with unaccepting_url() as url:
        yield url


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
async def test_falls_back_to_the_second_endpoint(kind: str, redis_url: str, keys: Keys, redis_client: aioredis.Redis,
                                                 hanging: str) -> None:
    async with fakes("a", "b") as servers:
        urls = {name: base for name, (base, _) in servers.items()}
        models = {"b": OK}
        _failing(kind, "a", urls, models, hanging)
        toml = upstreams_toml(urls, models, endpoint_keys={"a": SHORT})
        async with routing_worker(settings_for(urls["b"], redis_url, keys, max_retries=1, **PATIENT), keys, toml):
            events = await run_route_job(redis_client, keys)
    _assert_answered_by(events, "b")
    assert len(servers["a"][1].requests) == KINDS[kind][1]
    assert models_sent(servers["b"][1]) == [OK]


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_falls_back_over_three_endpoints(kind: str, redis_url: str, keys: Keys, redis_client: aioredis.Redis,
                                               hanging: str) -> None:
    async with fakes("a", "b", "c") as servers:
        urls = {name: base for name, (base, _) in servers.items()}
        models = {"c": OK}
        _failing(kind, "a", urls, models, hanging)
        models["b"] = "status-500" if kind != "http_500" else IN_STREAM
        toml = upstreams_toml(urls, models, endpoint_keys={"a": SHORT})
        async with routing_worker(settings_for(urls["c"], redis_url, keys, max_retries=1, **PATIENT), keys, toml):
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



def _before_content_cases() -> list[tuple[str, str, str]]:
    """Every recorded case the fake serves whose stream fails retryably before any delta, with a success of its API."""
    cases = []
    for directory in sorted(TRANSCRIPT_DIRS):
        paths = sorted(p for root in DEFAULT_ROOTS for p in (root / directory).glob("*.sse"))
        ends = {path.stem: replay_file(path)[0] for path in paths}
        ok = next(name for name, events in ends.items()
                  if isinstance(events[-1], StreamDone) and events[-1].status == "completed")
        for name, events in ends.items():
            end = events[-1]
            if isinstance(end, StreamError) and end.error.retryable and \
                    not any(isinstance(e, BlockDelta) for e in events):
                cases.append((directory, name, ok))
    return cases


@pytest.mark.parametrize("case", _before_content_cases(), ids="/".join)
async def test_every_recorded_error_before_content_falls_back(case: tuple[str, str, str], redis_url: str, keys: Keys,
                                                             redis_client: aioredis.Redis) -> None:
    directory, failing, ok = case
    provider, framing = TRANSCRIPT_DIRS[directory]
    async with fakes("a", "b") as servers:
        root = "/v1" if provider.startswith("openai") else ""
        toml = "".join(
            f'[endpoints.{name}]\napi = "{provider}"\nurl = "{base}{root}"\nauth = "none"\nframing = "{framing}"\n\n'
            for name, (base, _) in servers.items())
        toml += f'[models."routed"]\nendpoints = ["a", "b"]\nupstream_model = {{ a = "{failing}", b = "{ok}" }}\n'
        async with routing_worker(settings_for(servers["a"][0], redis_url, keys, max_retries=0), keys, toml):
            job = make_job(provider, "routed")
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
            events = await stored_events(redis_client, keys, job.stream_id)
    assert isinstance(events[-1], StreamDone)
    assert events[-1].endpoint == "b"
    assert validate(events) == []
    assert (len(servers["a"][1].requests), len(servers["b"][1].requests)) == (1, 1)
