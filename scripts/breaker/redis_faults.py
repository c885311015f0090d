"""Redis faults under a real publisher: CLIENT KILL, DEBUG SLEEP, kill + restart, during replay and live.

Readers resume (Last-Event-ID) after every ended response; each must end with exactly 1..last
(or, after a restart that lost the data, a clean 404/410), never wrong data, and the publisher must
serve a fresh stream afterwards. Exit 1 on any violation.
"""

from __future__ import annotations

import asyncio
import random
import sys

import aiohttp
import redis.asyncio as aioredis

from schema.keys import Keys
from scripts.breaker.harness import API_KEY, PREFIX, Publisher, Redis, Worker, make_stream, read_sse


async def follow(http, base, sid, total, failures, tag, slow_s=0.0):
    pos, got, statuses = 0, [], []
    for _ in range(400):
        try:
            res = await read_sse(http, base, sid, cred=API_KEY, position=pos, slow_s=slow_s)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            statuses.append(type(exc).__name__)
            await asyncio.sleep(0.1)
            continue
        statuses.append(res.status)
        if res.bad_lines:
            failures.append(f"{tag}: bad lines {res.bad_lines[:2]}")
        if res.status == 204:
            break
        if res.status in (404, 410):
            return got, statuses, "gone"
        if res.status != 200:
            failures.append(f"{tag}: status {res.status} {res.body[:200]!r}")
            return got, statuses, "error"
        got += res.ids
        if res.ids:
            pos = res.ids[-1]
        if pos == total:
            break
        if b"busy" in res.body:
            await asyncio.sleep(0.2)
    else:
        failures.append(f"{tag}: no end after 400 responses, at {pos}: {statuses[-5:]}")
    if got != list(range(1, len(got) + 1)):
        failures.append(f"{tag}: not exact: {got[:5]}.. len {len(got)} dups {len(got) - len(set(got))}")
    return got, statuses, "ok"


async def main() -> int:
    rng = random.Random(7)
    redis = Redis()
    redis.start()
    pub = Publisher(redis.url, FANOUT_READ_PAGE="64", FANOUT_READ_FIRST_PAGE="8", FANOUT_HEARTBEAT_S="1",
                    FANOUT_REDIS_POOL_TIMEOUT_S="1", FANOUT_WRITE_TIMEOUT_S="5")
    pub.start()
    keys = Keys(PREFIX)
    failures: list[str] = []
    client = aioredis.from_url(redis.url)
    try:
        worker = Worker(client, keys)
        s = make_stream("st_fault", 400, rng, deltas=40)  # ~8000+ events
        await worker.meta(s.sid)
        half = len(s.events) // 2
        await worker.write(s.sid, 1, s.events[:half], terminal=False, live_max=0)
        total = len(s.events)

        async def append_rest():
            seq = half + 1
            while seq <= total:
                batch = s.events[seq - 1: seq + 9]
                try:
                    await worker.write(s.sid, seq, batch, terminal=seq + len(batch) - 1 == total)
                    seq += len(batch)
                except Exception:  # noqa: BLE001 - redis is being faulted: retry like a worker
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.002)

        async def faults():
            admin = aioredis.from_url(redis.url)
            for round_ in range(6):
                await asyncio.sleep(0.3)
                try:
                    if round_ % 2 == 0:
                        await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
                        await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
                    else:
                        await admin.execute_command("DEBUG", "SLEEP", "1.5")
                except Exception as exc:  # noqa: BLE001
                    print("fault cmd:", type(exc).__name__, exc)
            await admin.aclose()

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120, sock_read=20)) as http:
            results = await asyncio.gather(
                append_rest(), faults(),
                *(follow(http, pub.base, s.sid, total, failures, f"reader{k}", slow_s=0.004 * (k % 3))
                  for k in range(20)))
        for got, statuses, how in results[2:]:
            if how != "ok" or len(got) != total:
                failures.append(f"reader ended {how} with {len(got)}/{total}; statuses {statuses[-6:]}")
        counts = [len(r[1]) for r in results[2:]]
        print("responses per reader:", counts)

        # kill + restart (data lost: no persistence) in the middle of a replay
        s2 = make_stream("st_fault2", 300, rng, deltas=40)
        await worker.meta(s2.sid)
        await worker.write(s2.sid, 1, s2.events, terminal=True, live_max=0)

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60, sock_read=20)) as http:
            async def kill_restart():
                await asyncio.sleep(0.05)
                redis.kill()
                await asyncio.sleep(1.0)
                redis.start()
            res2 = await asyncio.gather(kill_restart(), *(follow(http, pub.base, s2.sid, len(s2.events), failures,
                                                                  f"killed{k}", slow_s=0.01) for k in range(5)))
            for got, statuses, how in res2[1:]:
                print("after kill:", how, len(got), "of", len(s2.events), statuses[-4:])
                if how == "ok" and len(got) != len(s2.events):
                    failures.append("after kill: incomplete but ok")
            # the publisher keeps serving: a fresh stream, end to end
            client2 = aioredis.from_url(redis.url)
            worker2 = Worker(client2, keys)
            s3 = make_stream("st_after", 5, rng)
            await worker2.meta(s3.sid)
            await worker2.write(s3.sid, 1, s3.events, terminal=True)
            got, statuses, how = await follow(http, pub.base, s3.sid, len(s3.events), failures, "after")
            if got != list(range(1, len(s3.events) + 1)):
                failures.append(f"publisher does not serve after the restart: {statuses} {len(got)}")
            # and live after the restart (pub/sub reconnected?)
            s4 = make_stream("st_live_after", 5, rng)
            await worker2.meta(s4.sid)
            await worker2.write(s4.sid, 1, s4.events[:1], terminal=False)
            task = asyncio.ensure_future(follow(http, pub.base, s4.sid, len(s4.events), failures, "live-after"))
            await asyncio.sleep(0.5)
            await worker2.write(s4.sid, 2, s4.events[1:], terminal=True)
            got, statuses, how = await asyncio.wait_for(task, 20)
            if len(got) != len(s4.events):
                failures.append(f"live after restart: {len(got)} {statuses}")
            await client2.aclose()
    finally:
        await client.aclose()
        pub.stop()
        redis.kill()
    log = pub.logtext()
    interesting = [line for line in log.splitlines() if "Traceback" in line or "ERROR" in line or "unexpected" in line]
    for line in interesting[:20]:
        print("LOG", line[:240])
    for f in failures[:30]:
        print("FAIL", f)
    print(f"{len(failures)} failures; publisher log {pub.log.name}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
