"""A submission whose job XADD is applied by Redis but never answered (FreezeProxy holds replies).

The publisher's FANOUT_REDIS_TIMEOUT_S fires, redis-py retries, the request fails (503) or
succeeds; afterwards the Redis state is printed: job entries for the stream, meta present.
Run: `.venv/bin/python -m scripts.breaker.submit_ambiguous [timeout_s]`.
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import redis.asyncio as aioredis

from schema.keys import Keys
from scripts.breaker.ra_harness import API_KEY, FreezeProxy, PrivateRedis, Publisher

BODY = {"provider": "openai_chat", "model": "m", "request": {"messages": [{"role": "user", "content": "hi"}]}}


async def one(freeze_after_gate: bool, timeout_s: str) -> None:
    r = PrivateRedis()
    r.start()
    proxy = FreezeProxy(r.port)
    await proxy.start()
    c = aioredis.from_url(r.url)
    keys = Keys("brk2amb")
    p = Publisher(proxy.url, "brk2amb", FANOUT_REDIS_TIMEOUT_S=timeout_s)
    try:
        await p.astart()
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_KEY}"}) as h:
            async with h.post(p.base + "/v1/streams", json=BODY) as resp:  # warm the pool
                assert resp.status == 201
            proxy.gate_pattern = b"XADD"

            async def post() -> tuple[int, bytes]:
                async with h.post(p.base + "/v1/streams", json={**BODY, "stream_id": "st_amb1"}) as resp:
                    return resp.status, await resp.read()

            task = asyncio.create_task(post())
            await proxy.gate_entered.wait()
            if freeze_after_gate:
                proxy.freeze()
            status, body = await asyncio.wait_for(task, 60)
            proxy.gate_open.set()
            proxy.thaw()
            await asyncio.sleep(1.0)
            entries = await c.xrange(keys.jobs_shard(0))
            mine = [e for e in entries if b"st_amb1" in e[1][b"j"]]
            meta = await c.hgetall(keys.meta("st_amb1"))
            print(f"freeze_after_gate={freeze_after_gate}: answer {status} {body[:90]!r}; job entries for "
                  f"st_amb1: {len(mine)}; meta: {sorted(meta)[:6]}")
            async with h.post(p.base + "/v1/streams", json={**BODY, "stream_id": "st_amb1"}) as resp:
                print("  resubmit:", resp.status, (await resp.read())[:120])
            entries = await c.xrange(keys.jobs_shard(0))
            print("  job entries after resubmit:", len([e for e in entries if b"st_amb1" in e[1][b"j"]]))
    finally:
        await p.astop()
        await proxy.close()
        await c.aclose()
        r.stop()


async def main(timeout_s: str) -> None:
    await one(False, timeout_s)
    await one(True, timeout_s)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "0.5"))
