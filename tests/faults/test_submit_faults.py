"""Submissions whose job write Redis applied but whose answer was lost: one job, one run, as the README says.

From the ambiguous-submission round (``scripts/breaker/submit_ambiguous``; docs/faults.md).
A real ``fanout publisher`` reaches a private Redis through :class:`tests.faults.proxy.FaultProxy`,
which holds the reply of the job's ``XADD`` (Redis ran it: the job entry exists) until the
publisher's ``FANOUT_REDIS_TIMEOUT_S`` passes. The README promises: a ``503`` (or a dropped
connection) can follow a stored job, and a retry with the same ``stream_id`` and body then
returns that stream instead of running a second job. The worker and the fake provider run
in this process on the same Redis.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import redis.asyncio as aioredis

from schema.keys import JOB_FIELD, Keys
from tests.faults.conftest import StartPublisher
from tests.faults.procs import log_problems
from tests.faults.proxy import FaultProxy
from tests.publisher.helpers import API_KEY
from tests.redis_servers import RedisServer
from tests.worker.support import fake_upstream, meta, running_worker, settings_for, wait_done, wait_for
from tools.upstream import ServerConfig

pytestmark = pytest.mark.faults

SID = "st_ambiguous"
BODY = {"provider": "anthropic", "model": "slow-several_blocks_thinking_text_two_tools", "stream_id": SID,
        "request": {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}}
SLOW = ServerConfig(chunk_bytes=64, slow_delay_ms=20)


async def post(http: aiohttp.ClientSession, base: str) -> tuple[int, str]:
    async with http.post(f"{base}/v1/streams", json=BODY, headers={"Authorization": f"Bearer {API_KEY}"}) as resp:
        return resp.status, resp.headers.get("Content-Type", "")


async def job_entries(client: aioredis.Redis, keys: Keys) -> int:
    """Job entries naming :data:`SID` still in the jobs stream (a worker deletes the ones it acked)."""
    return sum(SID.encode() in fields[JOB_FIELD] for _, fields in await client.xrange(keys.jobs_shard(0)))


async def test_a_503_after_the_job_was_stored_keeps_one_job_and_a_retry_returns_that_stream(
        server: RedisServer, client: aioredis.Redis, keys: Keys, start_publisher: StartPublisher) -> None:
    async with FaultProxy(server.port) as proxy:
        publisher = await start_publisher(proxy.url, keys.prefix, FANOUT_REDIS_TIMEOUT_S=0.5)
        async with aiohttp.ClientSession() as http:
            proxy.gate_pattern = b"XADD"
            answering = asyncio.create_task(post(http, publisher.base))
            await asyncio.wait_for(proxy.gate_entered.wait(), 30)
            proxy.freeze()  # every later reply held too: the client's retries and its clean-up fail
            assert await answering == (503, "application/problem+json")
            proxy.thaw()
            proxy.gate_open.set()
            assert await job_entries(client, keys) == 1  # stored, though the answer was a 503
            assert await post(http, publisher.base) == (201, "application/json; charset=utf-8")
            assert await job_entries(client, keys) == 1  # the retry returned the stream, enqueued nothing
        async with fake_upstream(SLOW) as (upstream, _), running_worker(settings_for(upstream, server.url, keys),
                                                                        keys):
            done = await wait_done(client, keys, SID)
    assert done["status"] == "completed"
    assert await publisher.stop() == 0
    assert log_problems(publisher.log()) == []


async def test_a_job_write_whose_reply_was_lost_runs_its_stream_once_to_completion(
        server: RedisServer, client: aioredis.Redis, keys: Keys, start_publisher: StartPublisher) -> None:
    async with FaultProxy(server.port) as proxy, fake_upstream(SLOW) as (upstream, _), \
            running_worker(settings_for(upstream, server.url, keys), keys):
        publisher = await start_publisher(proxy.url, keys.prefix, FANOUT_REDIS_TIMEOUT_S=0.5)
        async with aiohttp.ClientSession() as http:
            proxy.gate_pattern = b"XADD"
            answering = asyncio.create_task(post(http, publisher.base))
            await asyncio.wait_for(proxy.gate_entered.wait(), 30)
            proxy.hold_pattern = b"XADD"  # the client's retry of the XADD, on a new connection

            async def running() -> bool:
                return int((await meta(client, keys, SID)).get("last_seq", 0)) >= 2

            await wait_for(running)  # the job stored first runs and has written its first events
            await asyncio.wait_for(proxy.hold_entered.wait(), 30)
            proxy.hold_open.set()
            proxy.gate_open.set()
            status, _ = await answering
        done = await wait_done(client, keys, SID)
    assert status == 201
    assert (done["status"], done["token"]) == ("completed", "1")  # one run, claimed once
    assert await publisher.stop() == 0
