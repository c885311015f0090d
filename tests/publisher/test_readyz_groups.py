"""``/readyz`` of a publisher that started before its Redis, or whose Redis came back empty.

A real ``fanout publisher`` process and a private ``redis-server`` (port 40000-45000,
no persistence) started after it: the publisher creates the ``workers`` group itself
(start id 0, as a worker does), so it becomes ready without a worker, and the job
submitted before any worker ran is served exactly once by the first worker to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp

from infra.redis_client import RedisOptions, connect
from schema.keys import JOBS_GROUP, Keys
from tests.publisher.helpers import API_KEY
from tests.redis_servers import RedisServer, free_port
from tests.worker.support import fake_upstream, running_worker, settings_for, stored_events, wait_done, wait_for

ROOT = Path(__file__).resolve().parents[2]
MODEL = "simple_text_cyrillic_usage_chunk"
BODY = {"provider": "openai_chat", "model": MODEL, "request": {"messages": [{"role": "user", "content": "hi"}]}}


@contextlib.contextmanager
def _redis_later() -> Iterator[RedisServer]:
    """A private server on a free loopback port, not started yet; stopped at the end."""
    server = RedisServer()
    server.port = free_port(cluster=False)
    try:
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def _publisher(redis_url: str, keys: Keys, log: Path) -> AsyncIterator[str]:
    """Run ``fanout publisher`` against ``redis_url`` (which may not answer yet); yield its base URL."""
    port = free_port(cluster=False)
    env = {**os.environ, "REDIS_URL": redis_url, "FANOUT_REDIS_PREFIX": keys.prefix, "FANOUT_DEV": "1",
           "FANOUT_API_KEYS": API_KEY}
    with log.open("w") as err:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fanout_cli", "publisher", "--port", str(port), cwd=ROOT, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=err)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            async def listening() -> bool:
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{base}/healthz") as resp:
                        return resp.status == 200
                return False

            await wait_for(listening, step_s=0.1)
        yield base
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)


async def _ready(http: aiohttp.ClientSession, base: str) -> tuple[int, str]:
    async with http.get(f"{base}/readyz") as resp:
        body = await resp.json()
        return resp.status, str(body.get("detail", body.get("status")))


async def _wait_ready(http: aiohttp.ClientSession, base: str) -> None:
    async def ready() -> bool:
        return (await _ready(http, base))[0] == 200

    await wait_for(ready, step_s=0.1)


async def test_a_publisher_started_before_redis_is_ready_without_a_worker_and_keeps_the_job(tmp_path: Path) -> None:
    keys = Keys(f"readyfresh-{uuid.uuid4().hex[:8]}")
    with _redis_later() as server:
        async with _publisher(server.url, keys, tmp_path / "publisher.log") as base, aiohttp.ClientSession() as http:
            status, detail = await _ready(http, base)
            assert (status, detail) == (503, "redis: unreachable")
            await asyncio.to_thread(server.start)  # empty: no jobs stream, no group
            async with http.post(f"{base}/v1/streams", json=BODY,
                                 headers={"Authorization": f"Bearer {API_KEY}"}) as resp:
                assert resp.status == 201
                stream_id = (await resp.json())["stream_id"]
            await _wait_ready(http, base)  # no worker has started
            client = connect(server.url, RedisOptions())
            try:
                groups = await client.xinfo_groups(keys.jobs_shard(0))
                assert [(g["name"].decode(), g["last-delivered-id"].decode(), g["pending"]) for g in groups] == [
                    (JOBS_GROUP, "0-0", 0)]  # start id 0: the job submitted first is still to be delivered
                assert await client.xlen(keys.jobs_shard(0)) == 1
                async with fake_upstream() as (upstream, _state), \
                        running_worker(settings_for(upstream, server.url, keys), keys):
                    assert (await wait_done(client, keys, stream_id))["status"] == "completed"
                seqs = [event.seq for event in await stored_events(client, keys, stream_id)]
                assert seqs == list(range(1, len(seqs) + 1))  # served once: one run, each seq once
                assert await client.xlen(keys.jobs_shard(0)) == 0  # acked and deleted
            finally:
                await client.aclose()
    assert "created the 'workers' consumer group of jobs stream" in (tmp_path / "publisher.log").read_text()


async def test_readyz_recreates_the_group_after_redis_lost_its_data(tmp_path: Path) -> None:
    keys = Keys(f"readylost-{uuid.uuid4().hex[:8]}")
    with _redis_later() as server:
        await asyncio.to_thread(server.start)
        async with _publisher(server.url, keys, tmp_path / "publisher.log") as base, aiohttp.ClientSession() as http:
            assert await _ready(http, base) == (200, "ok")
            await asyncio.to_thread(server.stop)
            await asyncio.to_thread(server.start)  # same port, no persistence: the group is gone
            await _wait_ready(http, base)
            with contextlib.closing(server.client()) as sync:
                groups = sync.xinfo_groups(keys.jobs_shard(0))
            assert [g["name"].decode() for g in groups] == [JOBS_GROUP]


async def test_readyz_names_a_jobs_key_that_is_not_a_stream(tmp_path: Path) -> None:
    keys = Keys(f"readywrong-{uuid.uuid4().hex[:8]}")
    with _redis_later() as server:
        await asyncio.to_thread(server.start)
        with contextlib.closing(server.client()) as sync:
            sync.hset(keys.jobs_shard(0), "not", "a stream")
        async with _publisher(server.url, keys, tmp_path / "publisher.log") as base, aiohttp.ClientSession() as http:
            status, detail = await _ready(http, base)
    assert (status, detail) == (503, "redis: jobs group cannot be created: a key holds another type (WRONGTYPE)")
    logged = (tmp_path / "publisher.log").read_text()  # the key's name and the server's text: the log only
    assert f"jobs stream {keys.jobs_shard(0)}: cannot create its 'workers' group" in logged
    assert "WRONGTYPE Operation against a key" in logged
