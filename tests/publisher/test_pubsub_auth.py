"""The publisher's own pub/sub connection authenticates as redis-py's connections do: live events flow.

Each case runs a private node configured after start (``CONFIG SET requirepass``, ``ACL
SETUSER``), a publisher whose ``REDIS_URL`` carries the credentials, and one reader that
must get an event appended after it went live, so the event came over the live channel.
"""

from __future__ import annotations

import logging
import uuid

import aiohttp
import msgspec
import pytest

from infra.live_pubsub import live_mode
from infra.redis_client import RedisOptions, connect
from publisher.settings import PublisherSettings
from schema.keys import Keys
from tests.conftest import client_for
from tests.publisher.helpers import (
    API_KEY,
    GUARD_S,
    SSEClient,
    StreamWriter,
    bearer,
    block_start,
    make_settings,
    running_publisher,
    start,
)
from tests.redis_servers import redis_cluster, redis_node

REFUSED_WAIT_S = 60.0
"""The subscribe timeout in the refusal tests: far past GUARD_S, so only a refusal answers in time."""


async def _live_event_arrives(url: str) -> list[int]:
    keys = Keys(prefix=f"auth-{uuid.uuid4().hex[:8]}")
    client = client_for(url)
    sid = "st_auth"
    try:
        writer = StreamWriter(client, keys, sid)
        await writer.append(start(sid))
        async with running_publisher(url, keys) as base, aiohttp.ClientSession() as http, \
                http.get(f"{base}/v1/streams/{sid}/events", headers=bearer(API_KEY),
                         timeout=aiohttp.ClientTimeout(total=GUARD_S)) as resp:
            reader = SSEClient(resp)
            assert (await reader.next_event() or {}).get("id") == "1"
            await writer.append(block_start(sid, 2, 0), full=True)  # reaches the reader only over pub/sub
            return [int((await reader.next_event() or {}).get("id", "0"))]
    finally:
        await client.aclose()


@pytest.mark.parametrize("setup", ["requirepass", "acl-user", "no-password-configured"])
async def test_live_events_flow_with_the_credentials_of_redis_url(setup: str) -> None:
    with redis_node() as server:
        with server.client() as admin:
            if setup == "requirepass":
                admin.config_set("requirepass", "s3cret")
                url = f"redis://:s3cret@127.0.0.1:{server.port}/0"
            elif setup == "acl-user":
                admin.execute_command("ACL", "SETUSER", "alice", "on", ">pw-alice", "~*", "&*", "+@all")
                url = f"redis://alice:pw-alice@127.0.0.1:{server.port}/0"
            else:  # a password in the URL for a server that has none: redis-py accepts it, so must we
                url = f"redis://:unused@127.0.0.1:{server.port}/0"
        assert await _live_event_arrives(url) == [2]


async def _refused_readers_are_told_at_once(url: str, keys: Keys, sid: str, settings: PublisherSettings) -> None:
    """Two readers in a row each get the ``retry:`` answer, long before a subscribe timeout could give it."""
    settings = msgspec.structs.replace(settings, subscribe_timeout_s=REFUSED_WAIT_S)
    async with running_publisher(url, keys, settings) as base, aiohttp.ClientSession() as http:
        for _ in range(2):  # a refused subscription is asked again by the next reader
            async with http.get(f"{base}/v1/streams/{sid}/events", headers=bearer(API_KEY),
                                timeout=aiohttp.ClientTimeout(total=GUARD_S)) as resp:  # GUARD_S < REFUSED_WAIT_S
                reader = SSEClient(resp)
                assert "retry" in (await reader.message() or {})
                assert "redis-unavailable" in (await reader.message() or {}).get("comment", "")


async def test_a_subscription_the_acl_refuses_fails_at_once_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    """A user without channel permissions: the reader gets its retry hint at once, not after the timeout."""
    keys = Keys(prefix=f"auth-{uuid.uuid4().hex[:8]}")
    sid = "st_noperm"
    with redis_node() as server:
        with server.client() as admin:
            admin.execute_command("ACL", "SETUSER", "bob", "on", ">pw-bob", "~*", "resetchannels", "+@all")
        url = f"redis://bob:pw-bob@127.0.0.1:{server.port}/0"
        client = client_for(url)
        try:
            await StreamWriter(client, keys, sid).append(start(sid), notify=False)
            await _refused_readers_are_told_at_once(url, keys, sid, make_settings())
        finally:
            await client.aclose()
    assert any("NOPERM" in record.getMessage() and "SUBSCRIBE" in record.getMessage()
               for record in caplog.records if record.levelno >= logging.WARNING)


async def test_a_sharded_subscription_the_acl_refuses_fails_at_once_and_says_why(
        caplog: pytest.LogCaptureFixture) -> None:
    """The same on a Redis 7 cluster, where the publisher subscribes with SSUBSCRIBE at each primary."""
    keys = Keys(prefix=f"auth-{uuid.uuid4().hex[:8]}")
    sid = "st_noperm_sharded"
    with redis_cluster(masters=3) as cluster:
        for node in cluster.nodes:
            with node.client() as admin:
                admin.execute_command("ACL", "SETUSER", "bob", "on", ">pw-bob", "~*", "resetchannels", "+@all")
        url = f"redis://bob:pw-bob@127.0.0.1:{cluster.nodes[0].port}/0"
        client = connect(url, RedisOptions(cluster=True))
        try:
            assert await live_mode(client) == "sharded"
            await StreamWriter(client, keys, sid).append(start(sid), notify=False)
            await _refused_readers_are_told_at_once(url, keys, sid, make_settings(redis_cluster=True))
        finally:
            await client.aclose()
    assert any("NOPERM" in record.getMessage() and "SSUBSCRIBE" in record.getMessage()
               for record in caplog.records if record.levelno >= logging.WARNING)
