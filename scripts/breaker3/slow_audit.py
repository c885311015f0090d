"""Attack 2: a slow but alive Redis (DEBUG SLEEP on a PRIVATE server) vs the bounded audit.

Usage: python -m scripts.breaker3.slow_audit PORT HEARTBEAT_S SLEEP_S STREAMS [old]
Quiet streams with live readers; Redis is put to sleep SLEEP_S at a time, with 50 ms gaps,
for about 4 s. Counts readers whose responses were closed. 'old' removes the audit bound
(asyncio.timeout -> no-op) to show the behaviour before 3e1ad81.
Then checks the pool's connections answer correctly (no reply shifted by a cancelled pipeline).
"""
from __future__ import annotations

import asyncio
import contextlib
import sys
import time

import aiohttp
import redis as syncredis
import redis.asyncio as aioredis

import publisher.hub as hubmod
from schema.keys import Keys
from scripts.breaker3.common import Follower, private_redis
from tests.publisher.helpers import StreamWriter, delta, make_settings, running_publisher, start, block_start


import logging
logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")


async def main(port: int, heartbeat_s: float, sleep_s: float, streams: int, old: bool) -> None:
    if old:
        class _NoBound:
            @staticmethod
            def timeout(_s):
                return contextlib.nullcontext()
        hubmod.asyncio = type("A", (), {k: getattr(asyncio, k) for k in dir(asyncio) if not k.startswith("__")})
        hubmod.asyncio.timeout = lambda s: contextlib.nullcontext()  # type: ignore[attr-defined]
    keys = Keys(prefix="breaker3-audit")
    with private_redis(port, "--enable-debug-command", "yes") as url:
        r = aioredis.from_url(url)
        settings = make_settings(heartbeat_s=heartbeat_s, redis_timeout_s=2.0)
        async with running_publisher(url, keys, settings) as base, aiohttp.ClientSession() as http:
            writers = [StreamWriter(r, keys, f"st_q{i:05d}") for i in range(streams)]
            for w in writers:
                await w.meta()
                await w.append(start(w.sid), block_start(w.sid, 2, 0), full=True)
            followers = [Follower(base, w.sid) for w in writers]
            tasks = [asyncio.create_task(f.run(http)) for f in followers]
            while sum(len(f.got) >= 2 for f in followers) < streams:
                await asyncio.sleep(0.05)
            await asyncio.sleep(heartbeat_s)  # let audits run on a healthy Redis
            print(f"{streams} live readers; closed before slowness: {sum(f.ended for f in followers)}")
            side = syncredis.Redis(port=port)
            t0 = time.monotonic()
            slept = 0

            def slow() -> None:
                nonlocal slept
                while time.monotonic() - t0 < 4.0:
                    side.execute_command("DEBUG", "SLEEP", sleep_s)
                    slept += 1
                    time.sleep(0.05)
            await asyncio.to_thread(slow)
            await asyncio.sleep(heartbeat_s)
            closed = sum(f.ended for f in followers)
            print(f"DEBUG SLEEP {sleep_s}s x{slept} (each under redis_timeout_s=2): readers closed: {closed}/{streams}")
            # pool sanity: do replies still match their commands?
            w = writers[0]
            await w.append(delta(w.sid, 3, 0, "after"), full=True)
            bad = 0
            for i in range(20):
                k = f"{keys.prefix}:probe{i}"
                await r.set(k, str(i))
            from publisher.store import Store
            for _ in range(20):
                vals = await asyncio.gather(*(r.get(f"{keys.prefix}:probe{i}") for i in range(20)))
                bad += sum(v != str(i).encode() for i, v in enumerate(vals))
            print(f"probe replies wrong: {bad}")
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await r.aclose()


if __name__ == "__main__":
    a = sys.argv
    asyncio.run(main(int(a[1]), float(a[2]), float(a[3]), int(a[4]), len(a) > 5 and a[5] == "old"))
