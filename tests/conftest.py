"""Shared fixtures: the ``--regen`` flag for goldens and the real Redis.

Redis: ``REDIS_URL`` when set (CI points it at the machine's server), else one embedded
server for the whole session. Each test gets its own key prefix, so keys never meet.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings

from schema.keys import Keys
from worker.embedded_redis import redis_url as _redis_url

# Property tests assert behaviour, never speed: no deadline, and no "too slow" health
# check failing a run on a loaded CI machine. Each test still sets its own example count.
# Under CI (CI=true) examples are derandomized so a red run is reproducible; locally each
# run explores new ones.
settings.register_profile("fanout", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=bool(os.environ.get("CI")))
settings.load_profile("fanout")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--regen", action="store_true", help="rewrite golden files instead of comparing")


@pytest.fixture
def regen(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--regen"))


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of the real Redis every integration test talks to."""
    with _redis_url() as url:
        yield url


@pytest.fixture
def keys() -> Keys:
    """A key namespace unique to this test."""
    return Keys(prefix=f"fanouttest-{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def redis_client(redis_url: str, keys: Keys) -> AsyncIterator[aioredis.Redis]:
    """An asyncio Redis client; the test's keys are deleted afterwards."""
    client = aioredis.Redis.from_url(redis_url)
    yield client
    async for key in client.scan_iter(match=f"{keys.prefix}:*", count=500):
        await client.delete(key)
    await client.aclose()
