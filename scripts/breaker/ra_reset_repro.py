"""Repro: a Redis connection reset (RST) while pooled idle makes the next command raise RuntimeError under uvloop.

Usage: .venv/bin/python -m scripts.breaker.ra_reset_repro [FANOUT_UVLOOP=0]
"""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio as aioredis

from schema.keys import Keys
from scripts.breaker.ra_harness import FreezeProxy, PrivateRedis, Publisher, StallClient, new_sid, store_stream


async def main(extra: dict[str, str]) -> int:
    redis = PrivateRedis()
    redis.start()
    proxy = FreezeProxy(redis.port)
    await proxy.start()
    client = aioredis.from_url(redis.url)
    pub = Publisher(proxy.url, "brkr", **extra)
    statuses = []
    try:
        await pub.astart()
        sid = new_sid()
        await store_stream(client, Keys("brkr"), sid, 20, terminal=True)
        for round_ in range(4):
            c = StallClient(pub.port, sid)
            await c.connect()
            await c.read_to_end(20)
            c.close()
            statuses.append((c.got.status, len(c.got.ids), c.got.body[:80]))
            proxy.cut()  # every pooled connection reset (RST)
            await asyncio.sleep(0.3)
    finally:
        pub.stop()
        await proxy.close()
        await client.aclose()
        redis.stop()
    for s in statuses:
        print(s)
    text = pub.logtext()
    print("RuntimeError in log:", text.count("RuntimeError"), "log:", pub.log.name)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(dict(a.split("=", 1) for a in sys.argv[1:]))))
