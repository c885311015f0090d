"""Intake under a hostile jobs stream: spin rate, group destroyed under running jobs. Not run by CI.

Usage: REDIS_URL=redis://127.0.0.1:42001/0 .venv/bin/python -m scripts.breaker7.intake_probe
Prints the worker's commands per second (INFO commandstats) while its shard is (a) normal, (b)
deleted over and over, (c) a string (WRONGTYPE); then destroys the group under a running slow job
and prints how that stream ended.
"""
import asyncio
import logging
import os
import uuid

import redis

from schema.keys import JOBS_GROUP, Keys
from tests.worker.support import fake_upstream, make_job, meta, running_worker, settings_for, submit, wait_done
from worker.redis_client import RedisOptions, connect
from worker.upstream_server import ServerConfig


def calls(sync: redis.Redis) -> int:
    stats = sync.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k.startswith("cmdstat_x"))


async def rate(sync: redis.Redis, seconds: float, during=None) -> float:
    before = calls(sync)
    end = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < end:
        if during:
            await during()
        await asyncio.sleep(0.05)
    return (calls(sync) - before) / seconds


async def main() -> None:
    url = os.environ["REDIS_URL"]
    keys = Keys(prefix=f"b7intake-{uuid.uuid4().hex[:8]}")
    client = connect(url, RedisOptions())
    sync = redis.Redis.from_url(url)
    shard = keys.jobs_shard(0)
    async with fake_upstream(ServerConfig(delay_ms=1, slow_delay_ms=300)) as (base, _), \
            running_worker(settings_for(base, url, keys, block_ms=500, progress_timeout_s=30, idle_timeout_s=30, total_timeout_s=60), keys):
        print("x* commands/s idle:", await rate(sync, 3))

        async def delete() -> None:
            await client.delete(shard)
        print("x* commands/s while the shard is deleted every 50 ms:", await rate(sync, 3, delete))
        await client.delete(shard)
        await client.set(shard, "not a stream")
        print("x* commands/s while the shard is a string:", await rate(sync, 3))
        await client.delete(shard)
        await asyncio.sleep(2)
        job = make_job("openai_chat", "slow-simple_text_cyrillic_usage_chunk")
        await submit(client, keys, job)
        for _ in range(200):
            m = await meta(client, keys, job.stream_id)
            if int(m.get("last_seq", "0")) >= 3 or m.get("state") == "done":
                break
            await asyncio.sleep(0.05)
        print("before destroy:", m, await client.xinfo_groups(shard))
        await client.xgroup_destroy(shard, JOBS_GROUP)
        done = await wait_done(client, keys, job.stream_id)
        print("group destroyed under a running job: status", done.get("status"), "token", done.get("token"))
        events = await client.xrange(keys.events(job.stream_id))
        print("last event:", events[-1][1][b"e"][:200])
    for key in sync.keys(f"{keys.prefix}:*"):
        sync.delete(key)
    await client.aclose()

logging.basicConfig(level=logging.WARNING)
asyncio.run(main())
