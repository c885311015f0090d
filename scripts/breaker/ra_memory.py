"""Read-ahead attack 5: publisher RSS across repeated stall/resume cycles (a count, not a timing).

Usage: .venv/bin/python -m scripts.breaker.ra_memory <cycles> <hold_ms> [parallel] [FANOUT_X=..]

Each cycle: ``parallel`` readers from 0 stall inside the 9.6 MB second page until the hold
let their read-ahead go (or 1.5 s with hold 0), then read to the top and disconnect; half of
the cycles also disconnect one reader mid-stall. RSS is printed after each cycle; the pages
gauge must be 0 at the end.
"""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio as aioredis

from schema.keys import Keys
from scripts.breaker.ra_harness import (
    SHARED_URL,
    Publisher,
    StallClient,
    check_exact,
    cleanup,
    metric,
    new_sid,
    scan_log,
    store_stream,
)

TOP = 700


async def cycle(pub: Publisher, sid: str, parallel: int, quit_one: bool, failures: list[str], hold: float) -> None:
    before = metric(await pub.metrics(), "fanout_sse_read_ahead_dropped_total")
    clients = [StallClient(pub.port, sid) for _ in range(parallel)]
    for c in clients:
        await c.connect()
        await c.read_some()
    if hold > 0:
        async with asyncio.timeout(30):
            while metric(await pub.metrics(), "fanout_sse_read_ahead_dropped_total") < before + parallel:
                await asyncio.sleep(0.05)
    else:
        await asyncio.sleep(1.5)
    if quit_one:
        clients[0].close()
        clients = clients[1:]
    for c in clients:
        await c.read_until(lambda k: k.last() >= TOP, 60)
        c.close()
        check_exact("cycle", c.got.ids, 1, TOP, failures)


async def main(cycles: int, hold_ms: str, parallel: int, extra: dict[str, str]) -> int:
    prefix = f"brk-rm-{new_sid()}"
    keys = Keys(prefix)
    client = aioredis.from_url(SHARED_URL)
    pub = Publisher(SHARED_URL, prefix, FANOUT_READ_FIRST_PAGE="2", FANOUT_READ_PAGE="256",
                    FANOUT_READ_AHEAD_HOLD_MS=hold_ms, FANOUT_WRITE_TIMEOUT_S="60", **extra)
    failures: list[str] = []
    try:
        await pub.astart()
        sid = new_sid()
        await store_stream(client, keys, sid, TOP, big=240, big_bytes=40_000)
        rss = []
        for i in range(cycles):
            await cycle(pub, sid, parallel, i % 2 == 1, failures, float(hold_ms))
            await asyncio.sleep(0.7)  # the topic's unsubscribe delay passes
            rss.append(pub.rss_kb())
            print(f"cycle {i + 1}: rss_kb={rss[-1]}", flush=True)
        values = await pub.metrics()
        if (pages := metric(values, "fanout_sse_read_ahead_pages")) != 0:
            failures.append(f"pages gauge {pages}")
        print(f"dropped={metric(values, 'fanout_sse_read_ahead_dropped_total')} "
              f"started={metric(values, 'fanout_sse_read_ahead_started_total')} "
              f"rss first/mid/last {rss[0]}/{rss[len(rss) // 2]}/{rss[-1]}")
    finally:
        pub.stop()
        await cleanup(client, prefix)
        await client.aclose()
    failures += scan_log(pub.logtext())
    for f in failures[:20]:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(asyncio.run(main(int(args[0]), args[1], int(args[2]) if len(args) > 2 else 2,
                              dict(a.split("=", 1) for a in args[3:]))))
