"""A worker whose jobs stream is broken under it pauses and recovers; it never spins on Redis.

From the intake round (``scripts/breaker7/intake_probe``: 3.7 stream commands/s idle, about 59/s
while the shard was deleted 20 times a second, 1/s while it was a string; docs/faults.md).
A real worker (in this process) on a private Redis, so ``INFO commandstats`` counts its
commands alone. Its jobs shard is made a string (every read answers ``WRONGTYPE``), then
deleted every 50 ms (each blocked read answers ``UNBLOCKED``, the next ``NOGROUP``, and the
group is recreated). A loop that retried at once would send thousands of commands a second;
the worker sends a few per second (at most one read and one claim per ``REDIS_RETRY_DELAY_S``
on an error) or a few per deletion. Then a job submitted to the repaired shard runs to the
end. The fixes the round led to (a retired legacy stream recreated, a redelivered running job
started twice, stray shard counts) are tests/worker/test_legacy_jobs_retired.py,
tests/worker/test_group_lost_running.py and tests/publisher/test_jobshards_corrupt.py.
"""

from __future__ import annotations

import asyncio

import pytest

from infra.redis_client import RedisOptions, connect
from schema.keys import Keys
from tests.redis_servers import RedisServer
from tests.worker.support import fake_upstream, make_job, running_worker, settings_for, submit, wait_done

pytestmark = pytest.mark.faults

WINDOW_S = 2.0
"""How long each broken state lasts while its commands are counted, seconds."""


async def stream_commands(server: RedisServer) -> int:
    """Calls of every stream command (``X*``) the server has run."""
    with server.client() as client:
        stats = client.info("commandstats")
    return sum(int(value["calls"]) for name, value in stats.items() if name.startswith("cmdstat_x"))


async def test_a_jobs_stream_that_is_the_wrong_type_or_keeps_vanishing_costs_a_few_commands_then_jobs_run(
        server: RedisServer, keys: Keys) -> None:
    client = connect(server.url, RedisOptions())
    shard = keys.jobs_shard(0)
    async with fake_upstream() as (upstream, _), running_worker(settings_for(upstream, server.url, keys,
                                                                             block_ms=500), keys):
        await client.delete(shard)
        await client.set(shard, "not a stream")
        before = await stream_commands(server)
        await asyncio.sleep(WINDOW_S)
        wrong_type = await stream_commands(server) - before
        await client.delete(shard)
        before, deletions = await stream_commands(server), 0
        for _ in range(int(WINDOW_S / 0.05)):
            await client.delete(shard)
            deletions += 1
            await asyncio.sleep(0.05)
        vanishing = await stream_commands(server) - before  # the test's DELs are no X command
        job = make_job("openai_chat", "simple_text_greek_usage_chunk")
        await submit(client, keys, job)
        done = await wait_done(client, keys, job.stream_id)
    await client.aclose()
    assert wrong_type <= 4 * WINDOW_S + 4  # a read and a claim per second of pause, and the first ones
    assert vanishing <= 6 * deletions + 10  # a few per deletion: the failed read, the recreation, the next read
    assert done["status"] == "completed"
