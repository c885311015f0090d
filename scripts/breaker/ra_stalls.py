"""Read-ahead attack 1: readers that stall and resume at random moments, many sharing reads.

Usage: .venv/bin/python -m scripts.breaker.ra_stalls <seed> <hold_ms> [readers] [FANOUT_X=..]

Each reader reads a stored stream (big entries, so writes stall) with random stalls, mixed
positions (most from 0: shared reads), then the stream grows live and ends. Every reader must
get exactly position+1..end in order, no gap frame; the pages gauge must return to 0; the
publisher log must be clean.
"""

from __future__ import annotations

import asyncio
import random
import sys

import redis.asyncio as aioredis

from schema.keys import Keys
from scripts.breaker.ra_harness import (
    SHARED_URL,
    Publisher,
    StallClient,
    append_live,
    check_exact,
    cleanup,
    metric,
    new_sid,
    scan_log,
    store_stream,
)


async def one_reader(rng: random.Random, port: int, sid: str, position: int | None, end: int,
                     failures: list[str], tag: str, stalls: int) -> None:
    client = StallClient(port, sid, position=position)
    await client.connect()
    for _ in range(stalls):
        burst = rng.randint(1, 200)
        for _ in range(burst):
            if not await client.read_some(rng.choice([512, 4096, 65536])):
                break
        if client.eof:
            break
        await asyncio.sleep(rng.choice([0.0, 0.001, 0.01, 0.05, 0.2, 0.5, 1.0, 1.5]))
    try:
        await client.read_until(lambda c: c.last() >= end, guard_s=90)
    except TimeoutError:
        failures.append(f"{tag}: guard expired at {client.last()} (want {end}) ended={client.got.ended}")
    client.close()
    got = client.got
    if got.status != 200:
        failures.append(f"{tag}: status {got.status} {got.body[:200]!r}")
        return
    if got.gap:
        failures.append(f"{tag}: false gap {got.gap[0][:300]!r}")
    if got.bad:
        failures.append(f"{tag}: bad lines {got.bad[:3]}")
    check_exact(tag, got.ids, (position or 0) + 1, end, failures)


async def main(seed: int, hold_ms: str, readers: int, extra: dict[str, str]) -> int:
    rng = random.Random(seed)
    prefix = f"brk-ra-{seed}-{rng.randrange(1 << 30)}"
    keys = Keys(prefix)
    client = aioredis.from_url(SHARED_URL)
    env = {"FANOUT_READ_FIRST_PAGE": "2", "FANOUT_READ_PAGE": "256", "FANOUT_READ_AHEAD_HOLD_MS": hold_ms,
           "FANOUT_WRITE_TIMEOUT_S": "30", "FANOUT_HEARTBEAT_S": "1", **extra}
    pub = Publisher(SHARED_URL, prefix, **env)
    pub.start()
    failures: list[str] = []
    try:
        sid = new_sid()
        top = 1500
        await store_stream(client, keys, sid, top, big=900, big_bytes=16_000)
        end = top + 50
        positions = [None if rng.random() < 0.6 else rng.choice([0, 1, 2, 100, 256, 257, 258, 500, 1000, top])
                     for _ in range(readers)]
        tasks = [asyncio.create_task(one_reader(rng, pub.port, sid, pos, end, failures, f"r{i}@{pos}",
                                                rng.randint(0, 6)))
                 for i, pos in enumerate(positions)]
        await asyncio.sleep(rng.uniform(0.2, 2.0))
        seq = top + 1
        while seq <= end:
            n = min(rng.randint(1, 10), end - seq + 1)
            await append_live(client, keys, sid, seq, n, terminal=seq + n - 1 == end)
            seq += n
            await asyncio.sleep(rng.choice([0, 0.01, 0.1]))
        await asyncio.gather(*tasks)
        await asyncio.sleep(1.0)
        values = await pub.metrics()
        pages = metric(values, "fanout_sse_read_ahead_pages")
        readers_open = metric(values, "fanout_sse_readers")
        if pages != 0:
            failures.append(f"pages gauge {pages} after every reader ended")
        if readers_open != 0:
            failures.append(f"readers gauge {readers_open}")
        print(f"seed={seed} hold={hold_ms} started={metric(values, 'fanout_sse_read_ahead_started_total')} "
              f"dropped={metric(values, 'fanout_sse_read_ahead_dropped_total')} "
              f"gaps={metric(values, 'fanout_sse_gaps_total')} overflows={metric(values, 'fanout_sse_overflows_total')} "
              f"rss_kb={pub.rss_kb()}")
    finally:
        pub.stop()
        await cleanup(client, prefix)
        await client.aclose()
    failures += scan_log(pub.logtext())
    for f in failures:
        print("FAIL", f)
    print("log:", pub.log.name)
    return 1 if failures else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    extra = dict(a.split("=", 1) for a in args[3:])
    sys.exit(asyncio.run(main(int(args[0]), args[1], int(args[2]) if len(args) > 2 else 8, extra)))
