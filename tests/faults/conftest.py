"""Fixtures of the fault scenarios: a private Redis a test may stall, kill or restart, and real publishers.

Every scenario here runs against its own ``redis-server`` (:mod:`tests.redis_servers`, a
random loopback port, persistence off, ``DEBUG`` enabled) and never against the shared one,
since faults hit every client of a server. Publishers are real processes
(:class:`tests.faults.procs.PublisherProcess`), stopped and removed after the test.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
import redis.asyncio as aioredis

from schema.keys import Keys
from tests.faults.procs import PublisherProcess
from tests.redis_servers import RedisServer, redis_node

DEBUG = ["--enable-debug-command", "yes"]
"""Lets the test send ``DEBUG SLEEP`` (Redis 7 refuses DEBUG otherwise)."""

StartPublisher = Callable[..., Awaitable[PublisherProcess]]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A private Redis server for this test alone (``DEBUG`` enabled)."""
    with redis_node(extra=DEBUG) as node:
        yield node


@pytest.fixture
def keys() -> Keys:
    """A key prefix of this test."""
    return Keys(prefix=f"faults-{uuid.uuid4().hex[:8]}")


@pytest.fixture
async def client(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """An asyncio client of :func:`server` (a worker's or an operator's connection)."""
    conn = aioredis.Redis(host="127.0.0.1", port=server.port)
    yield conn
    await conn.aclose()


@pytest.fixture
async def start_publisher() -> AsyncIterator[StartPublisher]:
    """Start real publishers (:class:`PublisherProcess` arguments); each is killed and removed after the test."""
    started: list[PublisherProcess] = []

    async def start(redis_url: str, prefix: str, **env: object) -> PublisherProcess:
        metrics = bool(env.pop("metrics", False))
        publisher = PublisherProcess(redis_url, prefix, metrics=metrics, **{k: str(v) for k, v in env.items()})
        started.append(publisher)
        return await publisher.start()

    yield start
    for publisher in started:
        publisher.remove()
