"""Attack 1: mixed traffic; does an event-carrying stream wait behind seq-only ones?

Usage: python -m scripts.breaker3.mixed_hold PORT LIVE_READ_MS LIVE_BATCH_MS
Stream A: seq-only notifications every 50 ms. Stream B: full notifications every 100 ms.
Prints B's delivery latency (receipt - event ts), and checks order/loss for both.
"""
from __future__ import annotations

import asyncio
import statistics
import sys
import time

import aiohttp
import redis.asyncio as aioredis

from schema.keys import Keys
from scripts.breaker3.common import Follower, private_redis
from tests.publisher.helpers import (StreamWriter, block_start, delta, done, make_settings, running_publisher,
                                     start, stop)


async def main(port: int, read_ms: float, batch_ms: float, seconds: float = 4.0) -> None:
    keys = Keys(prefix="breaker3-mixed")
    with private_redis(port) as url:
        r = aioredis.from_url(url)
        settings = make_settings(live_read_ms=read_ms, live_batch_ms=batch_ms)
        async with running_publisher(url, keys, settings) as base, aiohttp.ClientSession() as http:
            wa, wb = StreamWriter(r, keys, "st_seqonly"), StreamWriter(r, keys, "st_full")
            for w in (wa, wb):
                await w.meta()
                await w.append(start(w.sid), block_start(w.sid, 2, 0), full=(w is wb))
            fa, fb = Follower(base, wa.sid), Follower(base, wb.sid)
            ta, tb = asyncio.create_task(fa.run(http)), asyncio.create_task(fb.run(http))
            while len(fa.got) < 2 or len(fb.got) < 2:
                await asyncio.sleep(0.01)
            n = int(seconds / 0.05)

            async def feed_a() -> None:
                for i in range(n):
                    await wa.append(delta(wa.sid, 3 + i, 0, f"a{i}"))
                    await asyncio.sleep(0.05)
                await wa.append(stop(wa.sid, 3 + n, 0), done(wa.sid, 4 + n))

            async def feed_b() -> None:
                for i in range(n // 2):
                    await wb.append(delta(wb.sid, 3 + i, 0, f"b{i}"), full=True)
                    await asyncio.sleep(0.1)
                await wb.append(stop(wb.sid, 3 + n // 2, 0), done(wb.sid, 4 + n // 2), full=True)

            # a reader joining mid-traffic: how long until its stream.start?
            joins = []

            async def late_join() -> None:
                await asyncio.sleep(seconds / 2)
                for k in range(3):
                    w = StreamWriter(r, keys, f"st_late{k}")
                    await w.meta()
                    await w.append(start(w.sid), done(w.sid, 2), full=True)
                    f = Follower(base, w.sid)
                    t0 = time.monotonic()
                    await f.run(http)
                    joins.append(round((time.monotonic() - t0) * 1000))
                    await asyncio.sleep(0.2)

            await asyncio.gather(feed_a(), feed_b(), late_join())
            await asyncio.wait_for(asyncio.gather(ta, tb), 10)
            for f in (fa, fb):
                seqs = [s for s, _, _ in f.got]
                ok = seqs == list(range(1, len(seqs) + 1))
                print(f"{f.sid}: {len(seqs)} events, in order without loss/dup: {ok}")
            lat = [recv - ts for s, recv, ts in fb.got[2:]]
            lat.sort()
            print(f"full-stream latency ms: n={len(lat)} p50={statistics.median(lat):.0f} "
                  f"p90={lat[int(len(lat)*0.9)]:.0f} max={max(lat):.0f}")
            lata = sorted(recv - ts for s, recv, ts in fa.got[2:])
            print(f"seq-only latency ms: p50={statistics.median(lata):.0f} max={max(lata):.0f}")
            print(f"late joiners (complete stream, ms): {joins}")
        await r.aclose()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])))
