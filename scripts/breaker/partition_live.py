"""Live readers of a publisher cut off from Redis (FreezeProxy holds every reply) while a worker keeps appending.

Prints what the readers received during the partition (events, pings, end of response) and
checks exact seqs after it heals. Run: `.venv/bin/python -m scripts.breaker.partition_live [partition_s] [timeout_s]`.
"""

from __future__ import annotations

import asyncio
import sys
import time

import aiohttp
import redis.asyncio as aioredis

from schema.keys import Keys
from scripts.breaker.ra_harness import FreezeProxy, PrivateRedis, Publisher, append_live, check_exact, new_sid, store_stream
from scripts.breaker.redis_freeze import Follower


async def main(partition_s: float, timeout_s: str) -> int:
    r = PrivateRedis()
    r.start()
    proxy = FreezeProxy(r.port)
    await proxy.start()
    c = aioredis.from_url(r.url)
    keys = Keys("brk2part")
    p = Publisher(proxy.url, "brk2part", FANOUT_REDIS_TIMEOUT_S=timeout_s, FANOUT_HEARTBEAT_S="2")
    failures: list[str] = []
    try:
        sid = new_sid()
        await store_stream(c, keys, sid, 5)
        await p.astart()
        async with aiohttp.ClientSession() as h:
            fs = [Follower(p.base, sid, 0) for _ in range(3)]
            tasks = [asyncio.create_task(f.run(h)) for f in fs]
            await asyncio.sleep(1.0)
            proxy.freeze()
            began = time.monotonic()
            seq = 6
            while time.monotonic() - began < partition_s:
                await append_live(c, keys, sid, seq, 2)
                seq += 2
                await asyncio.sleep(0.5)
            print(f"during {partition_s}s partition: ids {[len(f.ids) for f in fs]} responses "
                  f"{[f.responses for f in fs]}")
            proxy.thaw()
            await append_live(c, keys, sid, seq, 1, terminal=True)
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            for i, f in enumerate(fs):
                check_exact(f"r{i}", f.ids, 1, seq, failures)
            print("responses", [f.responses for f in fs])
    finally:
        await p.astop()
        await proxy.close()
        await c.aclose()
        r.stop()
    print("log", p.log.name)
    print("warnings:", sorted({ln.split("logger=")[1][:100] for ln in p.logtext().splitlines() if "WARNING" in ln}))
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(float(sys.argv[1]) if len(sys.argv) > 1 else 15.0,
                              sys.argv[2] if len(sys.argv) > 2 else "1")))
