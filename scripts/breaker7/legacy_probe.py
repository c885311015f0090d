"""Does a worker resurrect a retired legacy jobs stream P:jobs, or a removed shard? Not run by CI.

Usage: REDIS_URL=redis://127.0.0.1:42001/0 .venv/bin/python -m scripts.breaker7.legacy_probe
"""
import asyncio
import logging
import os
import uuid

from schema.keys import JOBS_GROUP, Keys
from tests.worker.support import fake_upstream, running_worker, settings_for
from worker.intake import ensure_group
from worker.redis_client import RedisOptions, connect


async def main() -> None:
    url = os.environ["REDIS_URL"]
    keys = Keys(prefix=f"b7legacy-{uuid.uuid4().hex[:8]}")
    client = connect(url, RedisOptions())
    await ensure_group(client, keys.jobs)  # a legacy stream left by an earlier release
    async with fake_upstream() as (base, _), running_worker(settings_for(base, url, keys, block_ms=500), keys):
        await asyncio.sleep(1)
        print("legacy exists before DEL:", await client.exists(keys.jobs))
        await client.delete(keys.jobs)  # retired: empty, deleted by the operator
        for i in range(6):
            await asyncio.sleep(1)
            print(f"t+{i + 1}s legacy exists:", await client.exists(keys.jobs),
                  "groups:", [g["name"] for g in await client.xinfo_groups(keys.jobs)]
                  if await client.exists(keys.jobs) else None)
    for key in await client.keys(f"{keys.prefix}:*"):
        await client.delete(key)
    await client.aclose()
    _ = JOBS_GROUP

logging.basicConfig(level=logging.WARNING)
asyncio.run(main())
