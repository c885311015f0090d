"""Many readers (public and internal) at random positions while a fake worker appends fast.

Every internal reader must get exactly position+1..last, public readers exactly that minus the
internal reasoning blocks; no bad line, no stream.gap, terminal last. Readers also drop and
resume mid-stream. Exit 1 on any violation.
"""

from __future__ import annotations

import asyncio
import random
import sys

import aiohttp
import redis.asyncio as aioredis

from schema.keys import Keys
from scripts.breaker.harness import API_KEY, PREFIX, Publisher, Redis, Worker, make_stream, read_sse, token


async def run(seed: int, streams: int, readers: int, env: dict[str, str]) -> int:
    rng = random.Random(seed)
    redis = Redis()
    redis.start()
    pub = Publisher(redis.url, **env)
    pub.start()
    client = aioredis.from_url(redis.url, max_connections=2000)
    keys = Keys(PREFIX)
    worker = Worker(client, keys)
    failures: list[str] = []
    try:
        scripts = [make_stream(f"st_brk{seed}_{i}", rng.randint(3, 30), rng, deltas=rng.choice([3, 40])) for i in range(streams)]
        for s in scripts:
            await worker.meta(s.sid)
            await worker.write(s.sid, 1, s.events[:1], terminal=False)

        async def write_all(s) -> None:
            seq = 2
            while seq <= len(s.events):
                n = rng.choice([1, 1, 2, 5, 17, 60])
                batch = s.events[seq - 1: seq - 1 + n]
                await worker.write(s.sid, seq, batch, terminal=seq - 1 + len(batch) == len(s.events),
                                   live_max=rng.choice([1 << 16, 1 << 16, 0, 300]))
                seq += len(batch)
                if rng.random() < 0.3:
                    await asyncio.sleep(rng.random() * 0.01)

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            async def one_reader(k: int) -> None:
                s = rng.choice(scripts)
                scope = rng.choice(["public", "internal", "api"])
                cred = API_KEY if scope == "api" else token(s.sid, scope)
                await asyncio.sleep(rng.random() * 0.3)
                top = int((await client.hget(keys.meta(s.sid), "last_seq")) or 0)
                position = rng.randint(0, max(0, top))
                total = len(s.events)
                got: list[int] = []
                pos = position
                hops = 0
                while True:
                    stop_after = rng.choice([None, None, 3, 50])
                    res = await read_sse(http, pub.base, s.sid, cred=cred, position=pos, stop_after=stop_after)
                    if res.status == 204:
                        break
                    if res.status != 200:
                        failures.append(f"reader {k} {s.sid} pos {pos}: status {res.status} {res.body[:200]!r}")
                        return
                    if res.bad_lines:
                        failures.append(f"reader {k}: bad lines {res.bad_lines[:3]}")
                    if res.gap:
                        failures.append(f"reader {k} {s.sid} pos {pos}: stream.gap")
                        return
                    if scope == "public":
                        for d in res.datas:
                            if b"SECRET" in d:
                                failures.append(f"reader {k}: internal reasoning leaked to a public token: {d[:120]!r}")
                                break
                    got += res.ids
                    if res.ids:
                        pos = res.ids[-1]
                    hops += 1
                    if pos == total:
                        break
                    if hops > 200:
                        failures.append(f"reader {k}: no progress")
                        return
                want = [q for q in range(position + 1, total + 1) if scope != "public" or q not in s.hidden]
                # a response cut by stop_after may have been cut after a partial message: ids only of whole ones
                if got != want:
                    missing = sorted(set(want) - set(got))[:10]
                    extra = sorted(set(got) - set(want))[:10]
                    dups = len(got) - len(set(got))
                    failures.append(f"reader {k} {scope} {s.sid} from {position}: missing {missing} extra {extra} dups {dups}")

            await asyncio.gather(*(write_all(s) for s in scripts), *(one_reader(k) for k in range(readers)))
    finally:
        await client.aclose()
        pub.stop()
        redis.kill()
    log = pub.logtext()
    for line in log.splitlines():
        if "Traceback" in line or "ERROR" in line or "unexpected" in line:
            failures.append("log: " + line[:200])
    for f in failures[:40]:
        print("FAIL", f)
    print(f"seed {seed}: {len(failures)} failures; publisher log {pub.log.name}")
    return 1 if failures else 0


if __name__ == "__main__":
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    env = dict(arg.split("=", 1) for arg in sys.argv[2:])
    sys.exit(asyncio.run(run(seed, streams=4, readers=120, env=env)))
