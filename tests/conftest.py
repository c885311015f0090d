"""Shared fixtures: the ``--regen`` flag for goldens and the real Redis.

Redis: ``REDIS_URL`` when set (CI points it at the machine's server), else one embedded
server for the whole session. Each test gets its own key prefix, so keys never meet.

Topologies: a test (or module, ``pytestmark``) marked ``@pytest.mark.topologies`` runs once
on the single node (``single``) and once on a private 3-master Redis Cluster (``cluster``,
:func:`tests.redis_servers.redis_cluster`, started once per session on first use). Its
``redis_url`` is then that topology's URL; :func:`is_cluster_url` tells the helpers to
set ``redis_cluster`` in the settings they build, and ``redis_client`` is a cluster client
whose cleanup scans every master.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import HealthCheck, settings

from infra.redis_client import RedisClient, RedisOptions, connect, primary_clients
from schema.keys import Keys
from tests.redis_servers import RedisClusterServers, redis_cluster, redis_node
from tools.embedded_redis import redis_url as _redis_url

TOPOLOGIES = ("single", "cluster")
"""The Redis topologies a ``topologies``-marked test runs on."""
_CLUSTER_URLS: set[str] = set()


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` is the seed of this session's test cluster (settings need ``redis_cluster``)."""
    return url in _CLUSTER_URLS


def client_for(url: str) -> RedisClient:
    """A client of ``url`` through the seam, in the mode its topology needs."""
    return connect(url, RedisOptions(cluster=is_cluster_url(url)))

# Property tests assert behaviour, never speed: no deadline, and no "too slow" health
# check failing a run on a loaded CI machine. Each test still sets its own example count.
# Under CI (CI=true) examples are derandomized so a red run is reproducible; locally each
# run explores new ones.
settings.register_profile("fanout", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=bool(os.environ.get("CI")))
settings.load_profile("fanout")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--regen", action="store_true", help="rewrite golden files instead of comparing")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "topologies: run on a single Redis node and on a 3-master Redis Cluster")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("topologies") and "topology" in metafunc.fixturenames:
        metafunc.parametrize("topology", TOPOLOGIES, indirect=True)


@pytest.fixture
def regen(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--regen"))


@pytest.fixture(scope="session")
def single_redis_url() -> Iterator[str]:
    """URL of the single-node Redis (``REDIS_URL``, else an embedded server)."""
    with _redis_url() as url:
        yield url


@pytest.fixture(scope="session")
def test_cluster() -> Iterator[RedisClusterServers]:
    """A private 3-master Redis Cluster on loopback for the whole session (no replicas)."""
    with redis_cluster(masters=3) as cluster:
        _CLUSTER_URLS.add(cluster.url)
        yield cluster


@pytest.fixture(scope="session")
def cluster_redis_url(test_cluster: RedisClusterServers) -> str:
    """Seed URL of the session's test cluster."""
    return test_cluster.url


@pytest.fixture(scope="session")
def private_node_url() -> Iterator[str]:
    """A private single node nobody else writes to, for tests that count commands (``INFO commandstats``)."""
    with redis_node() as server:
        yield server.url


@pytest.fixture
def topology(request: pytest.FixtureRequest) -> str:
    """``single`` unless the test is marked ``topologies`` (then each in turn)."""
    return str(getattr(request, "param", "single"))


@pytest.fixture
def redis_url(request: pytest.FixtureRequest, topology: str) -> str:
    """URL of the real Redis this test talks to (its topology's)."""
    return str(request.getfixturevalue("cluster_redis_url" if topology == "cluster" else "single_redis_url"))


@pytest.fixture
def keys() -> Keys:
    """A key namespace unique to this test."""
    return Keys(prefix=f"fanouttest-{uuid.uuid4().hex[:12]}")


async def delete_prefix(client: RedisClient, prefix: str) -> None:
    """Delete every key under ``prefix``: SCAN on each master (one for a single node)."""
    for node in await primary_clients(client):
        try:
            async for key in node.scan_iter(match=f"{prefix}:*", count=500):
                await client.delete(key)
        finally:
            await node.aclose()


@pytest.fixture
async def redis_client(redis_url: str, keys: Keys) -> AsyncIterator[RedisClient]:
    """An asyncio Redis client of the test's topology; the test's keys are deleted afterwards."""
    client = client_for(redis_url)
    yield client
    await delete_prefix(client, keys.prefix)
    await client.aclose()
