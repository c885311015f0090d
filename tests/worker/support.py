"""Helpers shared by the worker's integration tests: a fake provider, a running worker, jobs.

Everything runs on real sockets (port 0) and the real Redis of the ``redis_url`` fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from infra.redis_client import RedisClient, RedisOptions, connect, primary_clients
from schema.contract import Event, decode_event
from schema.job import Job, job_encoder, new_stream_id
from schema.keys import JOB_FIELD, Keys, shard_of
from schema.stored_entries import entry_jsons
from schema.upstreams import Upstreams
from tests.conftest import is_cluster_url
from tools.upstream import STATE, ServerConfig, ServerState, make_app
from worker.runner import Worker
from worker.settings import WorkerSettings
from worker.telemetry import Telemetry
from worker.upstream import Credentials, new_session

FAST: dict[str, Any] = {
    "connect_timeout_s": 2.0, "idle_timeout_s": 3.0, "progress_timeout_s": 3.0, "total_timeout_s": 20.0,
    "lease_s": 3.0, "block_ms": 50, "backoff_base_s": 0.01, "backoff_max_s": 0.05, "retry_after_max_s": 0.05,
    "drain_s": 2.0, "max_retries": 2,
}
"""Small limits so tests never wait long; each test overrides what it probes."""

GUARD_S = 15.0
"""Upper bound of any wait in a test: a hang guard, never a performance target."""


def settings_for(base_url: str, redis_url: str, keys: Keys, **overrides: Any) -> WorkerSettings:
    """Worker settings pointing every provider at ``base_url`` with :data:`FAST` limits."""
    values = {"redis_cluster": is_cluster_url(redis_url), **FAST, **overrides}
    return WorkerSettings(redis_url=redis_url, redis_prefix=keys.prefix, openai_base_url=f"{base_url}/v1",
                          anthropic_base_url=base_url, gemini_base_url=base_url, **values)


@contextlib.asynccontextmanager
async def fake_upstream(config: ServerConfig | None = None) -> AsyncIterator[tuple[str, ServerState]]:
    """Serve :func:`tools.upstream.make_app` on 127.0.0.1:0; yield (base URL, its state)."""
    app = make_app(config or ServerConfig(delay_ms=1))
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}", app[STATE]
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def running_worker(
    settings: WorkerSettings, keys: Keys, *, telemetry: Telemetry | None = None, consumer: str | None = None,
    credentials: Credentials | None = None, upstreams: Upstreams | None = None,
) -> AsyncIterator[Worker]:
    """Run a :class:`Worker` in this event loop until the block ends (then drain it)."""
    client = connect(settings.redis_url, RedisOptions(cluster=settings.redis_cluster))
    session = new_session(settings)
    worker = Worker.create(client, keys, settings, session=session, telemetry=telemetry, consumer=consumer,
                           credentials=credentials or Credentials(openai="sk-test-openai", anthropic="ak-test",
                                                                  gemini="AIzaTestKeyTestKeyTestKey00"),
                           upstreams=upstreams)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(worker.ready.wait(), GUARD_S)
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, GUARD_S + settings.drain_s)
        await session.close()
        await client.aclose()


def make_job(provider: str, model: str, **fields: Any) -> Job:
    """A job with a fresh stream id and a small provider-native request."""
    request = fields.pop("request", None) or {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
    stream_id = fields.pop("stream_id", None) or new_stream_id()
    return Job(stream_id=stream_id, provider=provider, model=model, request=request,  # type: ignore[arg-type]
               metadata=fields.pop("metadata", {"test": True}), **fields)


def jobs_stream(keys: Keys, job: Job, shards: int = 1) -> str:
    """The jobs stream a publisher with ``shards`` shards puts ``job`` in."""
    return keys.jobs_shard(shard_of(job.stream_id, shards))


async def submit(redis: RedisClient, keys: Keys, job: Job, *, shards: int = 1, stream: str | None = None) -> str:
    """XADD the job to its jobs shard (as the publisher does), or to ``stream``; return its job ref."""
    key = stream or jobs_stream(keys, job, shards)
    entry = await redis.xadd(key, {JOB_FIELD: job_encoder.encode(job)})
    return keys.job_ref(key, entry.decode() if isinstance(entry, bytes) else str(entry))


async def stored_events(redis: RedisClient, keys: Keys, stream_id: str) -> list[Event]:
    """Every stored event of the stream, in entry order."""
    entries = await redis.xrange(keys.events(stream_id))
    events = [decode_event(data) for entry_id, fields in entries
              for _, data in entry_jsons(stream_id, entry_id, fields)]
    return [e for e in events if e is not None]


async def stored_ids(redis: RedisClient, keys: Keys, stream_id: str) -> list[str]:
    """The stored entry ids of the stream (``0-<seq>``)."""
    return [i.decode() for i, _ in await redis.xrange(keys.events(stream_id))]


async def meta(redis: RedisClient, keys: Keys, stream_id: str) -> dict[str, str]:
    """The stream's meta hash as text."""
    raw = await redis.hgetall(keys.meta(stream_id))
    return {k.decode(): v.decode() for k, v in raw.items()}


async def wait_for(predicate: Any, *, guard_s: float = GUARD_S, step_s: float = 0.01) -> None:
    """Poll an async predicate until it is true; fail the test after ``guard_s``."""
    deadline = time.monotonic() + guard_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached within the guard time")
        await asyncio.sleep(step_s)


async def wait_done(redis: RedisClient, keys: Keys, stream_id: str) -> dict[str, str]:
    """Wait until the stream's meta says ``state=done``; return the meta."""
    async def done() -> bool:
        return (await meta(redis, keys, stream_id)).get("state") == "done"

    await wait_for(done)
    return await meta(redis, keys, stream_id)


async def pending_count(redis: RedisClient, keys: Keys, shards: int = 1) -> int:
    """How many jobs are pending (delivered, not acked) in the ``workers`` group of every shard."""
    total = 0
    for stream in keys.jobs_streams(shards):
        info = await redis.xpending(stream, "workers")
        total += int(info["pending"])
    return total


async def recorded(base_url: str) -> list[dict[str, Any]]:
    """The fake upstream's recorded requests, through its HTTP API."""
    async with aiohttp.ClientSession() as session, session.get(f"{base_url}/_requests") as response:
        return list(msgspec.json.decode(await response.read()))


def strip_volatile(events: list[Event]) -> list[dict[str, Any]]:
    """Events as builtins without ``stream_id``, ``ts`` and ``stream.start``'s model/metadata/epoch (random)."""
    out = []
    for event in events:
        item = msgspec.to_builtins(event)
        item.pop("stream_id", None)
        item.pop("ts", None)
        if item["type"] == "stream.start":
            item.pop("model", None)
            item.pop("metadata", None)
            item.pop("epoch", None)
        out.append(item)
    return out


async def node_command_calls(redis: RedisClient, names: list[str]) -> list[int]:
    """Per master (one for a single node): calls of the commands ``names`` (``INFO commandstats``)."""
    out = []
    for node in await primary_clients(redis):
        try:
            stats = await node.info("commandstats")
        finally:
            await node.aclose()
        out.append(sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in names))
    return out


async def command_calls(redis: RedisClient, name: str) -> int:
    """Calls of command ``name`` summed over every master."""
    return sum(await node_command_calls(redis, [name]))
