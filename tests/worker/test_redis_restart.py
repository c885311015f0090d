"""Redis that loses its data or its connections, on private servers this test stops and starts.

A restart without persistence is what losing the data looks like (also a failover to an
empty replica): the consumer groups are gone (``NOGROUP``) and every pooled connection is
dead. Workers recreate the group and go on; ``fanout health`` and ``/readyz`` fail while
the group is missing; a stale pooled connection never reaches a client as a 503.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from infra.groups import ensure_group
from infra.redis_client import RedisClient, RedisOptions, connect
from publisher.app import RUNNER_KWARGS, create_app
from schema.keys import JOBS_GROUP, Keys
from tests.conftest import client_for, is_cluster_url
from tests.publisher.helpers import make_settings, token_for
from tests.redis_servers import redis_cluster, redis_node
from tests.worker.support import GUARD_S, fake_upstream, make_job, running_worker, settings_for, submit, wait_done
from worker.intake import Intake

ROOT = Path(__file__).resolve().parents[2]
MODEL = "simple_text_cyrillic_usage_chunk"


async def _health(redis_url: str, keys: Keys, *, cluster: bool) -> tuple[int, str]:
    env = {**os.environ, "REDIS_URL": redis_url, "FANOUT_REDIS_PREFIX": keys.prefix,
           "FANOUT_REDIS_CLUSTER": "1" if cluster else "0"}
    env.pop("FANOUT_HEALTH_URL", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fanout_cli", "health", cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _out, err = await asyncio.wait_for(process.communicate(), GUARD_S)
    return int(process.returncode or 0), err.decode()


@pytest.mark.topologies
async def test_health_fails_while_the_jobs_group_is_missing(redis_url: str, keys: Keys, redis_client: object) -> None:
    client = client_for(redis_url)
    try:
        await ensure_group(client, keys.jobs_shard(0))
        assert await _health(redis_url, keys, cluster=is_cluster_url(redis_url)) == (0, "")
        await client.xgroup_destroy(keys.jobs_shard(0), JOBS_GROUP)
        code, err = await _health(redis_url, keys, cluster=is_cluster_url(redis_url))
        assert code == 1
        assert f"jobs stream {keys.jobs_shard(0)} has no consumer group" in err
    finally:
        await client.aclose()


async def test_health_fails_unless_every_master_reports_cluster_state_ok() -> None:
    keys = Keys(f"fanouttest-{uuid.uuid4().hex[:12]}")
    with redis_cluster(masters=3) as cluster:
        client = connect(cluster.url, RedisOptions(cluster=True))
        try:
            await ensure_group(client, keys.jobs_shard(0))
        finally:
            await client.aclose()
        assert await _health(cluster.url, keys, cluster=True) == (0, "")
        with cluster.nodes[2].client() as node:
            node.execute_command("CLUSTER DELSLOTS", 16383)  # a slot no node serves: cluster_state:fail
        code, err = await _health(cluster.url, keys, cluster=True)
    assert code == 1
    assert "redis" in err


async def test_a_restart_without_persistence_recreates_the_group_and_intake_goes_on() -> None:
    keys = Keys(f"fanouttest-{uuid.uuid4().hex[:12]}")
    with redis_node() as server:
        client = client_for(server.url)
        try:
            async with fake_upstream() as (base, _state), running_worker(settings_for(base, server.url, keys), keys):
                before = make_job("openai_chat", MODEL)
                await submit(client, keys, before)
                assert (await wait_done(client, keys, before.stream_id))["status"] == "completed"
                await asyncio.to_thread(server.stop)
                await asyncio.to_thread(server.start)  # same port, empty: no stream, no group
                after = make_job("openai_chat", MODEL)
                await submit(client, keys, after)
                assert (await wait_done(client, keys, after.stream_id))["status"] == "completed"
            groups = await client.xinfo_groups(keys.jobs_shard(0))
            assert [g["name"].decode() for g in groups] == [JOBS_GROUP]
        finally:
            await client.aclose()


async def test_stale_pooled_connections_after_a_restart_never_answer_503() -> None:
    keys = Keys(f"fanouttest-{uuid.uuid4().hex[:12]}")
    with redis_node() as server:
        # 12 status requests of one token at once (FANOUT_MAX_STATUS_READS_PER_TOKEN is 2 by default),
        # twice, unpaced (FANOUT_STATUS_READ_RATE_PER_TOKEN: a burst of 10 by default)
        app = create_app(make_settings(max_status_reads_per_token=12, status_read_rate_per_token=0),
                         keys=keys, redis_url=server.url)
        runner = web.AppRunner(app, **RUNNER_KWARGS)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        sid = f"st_{uuid.uuid4().hex}"
        url = f"http://{host}:{port}/v1/streams/{sid}?token={token_for(sid)}"
        try:
            async with aiohttp.ClientSession() as http:

                async def statuses() -> list[int]:
                    async def one() -> int:
                        async with http.get(url) as resp:
                            return resp.status

                    return list(await asyncio.gather(*(one() for _ in range(12))))

                assert set(await statuses()) == {404}  # 12 pooled connections, all used
                await asyncio.to_thread(server.stop)
                await asyncio.to_thread(server.start)
                assert set(await statuses()) == {404}  # every one of them dead: none answers 503
        finally:
            await runner.cleanup()


@pytest.mark.parametrize("command", ["worker", "publisher"])
async def test_a_cluster_url_redis_cannot_serve_is_an_error_message_not_a_traceback(command: str,
                                                                                   tmp_path: Path) -> None:
    env = {**os.environ, "REDIS_URL": f"unix://{tmp_path}/none.sock", "FANOUT_REDIS_CLUSTER": "1",
           "FANOUT_DEV": "1", "FANOUT_API_KEYS": "k" * 20}
    args = ["--port", "0"] if command == "publisher" else []
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fanout_cli", command, *args, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _out, err = await asyncio.wait_for(process.communicate(), GUARD_S)
    assert process.returncode == 1
    assert "Traceback" not in err.decode()
    assert "check REDIS_URL and FANOUT_REDIS_CLUSTER" in err.decode()


@pytest.mark.topologies
async def test_a_jobs_stream_deleted_under_a_blocked_read_recreates_the_group(
        redis_url: str, keys: Keys, redis_client: RedisClient) -> None:
    """Redis 7 answers a read blocked on a stream deleted meanwhile (evicted, flushed) ``UNBLOCKED``.

    Like ``NOGROUP``, that is the group lost: the read returns nothing, the group is back at
    once, and a job enqueued afterwards is read, with no error raised to the runner.
    """
    intake = Intake(redis_client, keys, consumer="c-1", lease_s=30)
    stream = keys.jobs_shard(0)
    await ensure_group(redis_client, stream)
    read = asyncio.create_task(intake.read_new(stream, 1, block_ms=3000))
    await asyncio.sleep(0.3)  # the read is blocked
    await redis_client.delete(stream)
    assert await asyncio.wait_for(read, GUARD_S) == []
    if not await redis_client.exists(stream):  # Redis 6.2 does not unblock the read: the next one says NOGROUP
        assert await intake.read_new(stream, 1, block_ms=10) == []
    groups = await redis_client.xinfo_groups(stream)
    assert [g["name"].decode() for g in groups] == [JOBS_GROUP]
    entry_id = await redis_client.xadd(stream, {"j": b"{}"})
    entries = await intake.read_new(stream, 1, block_ms=1000)
    assert [ref for ref, _ in entries] == [f"{stream}/{entry_id.decode()}"]
