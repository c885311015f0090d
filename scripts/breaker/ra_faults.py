"""Read-ahead attack 2: Redis slowness and connection kills while read-aheads are in flight or held.

Usage: .venv/bin/python -m scripts.breaker.ra_faults <seed> <hold_ms> [FANOUT_X=..]

A private redis-server (port 40000-45000). Readers replay a big stored stream with stalls;
meanwhile ``DEBUG SLEEP`` and ``CLIENT KILL TYPE normal`` hit Redis, and some readers
disconnect mid-stall. Every reader that follows to the end (reconnecting with
Last-Event-ID after each ended response) must hold exactly 1..end. The pages gauge must
return to 0 and the log must hold no unretrieved exception.
"""

from __future__ import annotations

import asyncio
import random
import sys

import redis.asyncio as aioredis

from schema.keys import Keys
from scripts.breaker.ra_harness import (
    FreezeProxy,
    PrivateRedis,
    Publisher,
    StallClient,
    append_live,
    check_exact,
    metric,
    new_sid,
    scan_log,
    store_stream,
)


async def follow(rng: random.Random, port: int, sid: str, end: int, failures: list[str], tag: str,
                 *, quit_early: bool) -> None:
    ids: list[int] = []
    position: int | None = None
    for attempt in range(200):
        client = StallClient(port, sid, position=position)
        try:
            await client.connect()
        except OSError:
            await asyncio.sleep(0.1)
            continue
        stalls = rng.randint(0, 3)
        try:
            for _ in range(stalls):
                for _ in range(rng.randint(1, 100)):
                    if not await client.read_some():
                        break
                if client.eof:
                    break
                await asyncio.sleep(rng.choice([0.0, 0.005, 0.05, 0.3, 1.0, 2.0]))
                if quit_early and rng.random() < 0.3:
                    client.close()
                    return
            await client.read_until(lambda c: c.last() >= end, guard_s=60)
        except TimeoutError:
            failures.append(f"{tag}: guard expired at {client.last()}")
        client.close()
        got = client.got
        if got.bad:
            failures.append(f"{tag}: bad lines {got.bad[:3]}")
        if got.gap:
            failures.append(f"{tag}: gap frame {got.gap[0][:300]!r}")
            return
        if got.status not in (200, 0):
            failures.append(f"{tag}: status {got.status} {got.body[:200]!r}")
            return
        ids += got.ids
        if ids:
            position = ids[-1]
        if position == end:
            break
        await asyncio.sleep(0.05)
    check_exact(tag, ids, 1, end, failures)


async def faults(rng: random.Random, admin: aioredis.Redis, stop: asyncio.Event, log: list[str],
                 proxy: FreezeProxy) -> None:
    while not stop.is_set():
        await asyncio.sleep(rng.uniform(0.05, 0.8))
        kind = rng.choice(["sleep", "kill", "killpubsub", "none", "freeze", "freezecut", "cut"])
        log.append(kind)
        try:
            if kind == "freeze":
                proxy.freeze()
                await asyncio.sleep(rng.choice([0.01, 0.2, 1.0]))
                proxy.thaw()
            elif kind == "freezecut":
                proxy.freeze()
                await asyncio.sleep(rng.choice([0.01, 0.2, 1.0]))
                proxy.cut()
                proxy.thaw()
            elif kind == "cut":
                proxy.cut()
            elif kind == "sleep":
                await admin.execute_command("DEBUG", "SLEEP", str(rng.choice([0.05, 0.3, 1.2])))
            elif kind == "kill":
                await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            elif kind == "killpubsub":
                await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        except Exception as exc:
            log.append(f"admin error {exc!r}")


async def main(seed: int, hold_ms: str, extra: dict[str, str]) -> int:
    rng = random.Random(seed)
    redis = PrivateRedis()
    redis.start()
    prefix = "brkf"
    keys = Keys(prefix)
    client = aioredis.from_url(redis.url)
    admin = aioredis.from_url(redis.url)
    env = {"FANOUT_READ_FIRST_PAGE": "2", "FANOUT_READ_PAGE": "256", "FANOUT_READ_AHEAD_HOLD_MS": hold_ms,
           "FANOUT_WRITE_TIMEOUT_S": "20", "FANOUT_HEARTBEAT_S": "1", "FANOUT_REDIS_POOL_TIMEOUT_S": "2", **extra}
    proxy = FreezeProxy(redis.port)
    await proxy.start()
    pub = Publisher(proxy.url, prefix, **env)
    failures: list[str] = []
    fault_log: list[str] = []
    try:
        await pub.astart()
        sid = new_sid()
        top = 1500
        await store_stream(client, keys, sid, top, big=900, big_bytes=16_000)
        end = top + 30
        stop = asyncio.Event()
        injector = asyncio.create_task(faults(rng, admin, stop, fault_log, proxy))
        quitters = [asyncio.create_task(follow(rng, pub.port, sid, end, failures, f"q{i}", quit_early=True))
                    for i in range(4)]
        tasks = [asyncio.create_task(follow(rng, pub.port, sid, end, failures, f"r{i}", quit_early=False))
                 for i in range(6)]
        await asyncio.sleep(rng.uniform(1.0, 3.0))
        seq = top + 1
        while seq <= end:
            n = min(rng.randint(1, 5), end - seq + 1)
            for _ in range(20):
                try:
                    await append_live(client, keys, sid, seq, n, terminal=seq + n - 1 == end)
                    break
                except Exception:
                    await asyncio.sleep(0.05)
            seq += n
            await asyncio.sleep(0.05)
        await asyncio.gather(*tasks, *quitters)
        stop.set()
        await injector
        await asyncio.sleep(1.5)
        values = await pub.metrics()
        if (pages := metric(values, "fanout_sse_read_ahead_pages")) != 0:
            failures.append(f"pages gauge {pages}")
        if (open_ := metric(values, "fanout_sse_readers")) != 0:
            failures.append(f"readers gauge {open_}")
        print(f"seed={seed} hold={hold_ms} faults={len(fault_log)} cuts={proxy.cuts} started="
              f"{metric(values, 'fanout_sse_read_ahead_started_total')} "
              f"dropped={metric(values, 'fanout_sse_read_ahead_dropped_total')} "
              f"redis_errors={metric(values, 'fanout_redis_errors_total')} rss_kb={pub.rss_kb()}")
    finally:
        pub.stop()
        await proxy.close()
        await client.aclose()
        await admin.aclose()
        redis.stop()
    failures += [f for f in scan_log(pub.logtext()) if "ERROR" not in f]
    for f in failures:
        print("FAIL", f)
    print("log:", pub.log.name)
    return 1 if failures else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    extra = dict(a.split("=", 1) for a in args[2:])
    sys.exit(asyncio.run(main(int(args[0]), args[1], extra)))
