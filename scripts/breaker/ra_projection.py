"""Read-ahead attack 4: public and internal readers that stall inside big reasoning blocks spanning pages.

Usage: .venv/bin/python -m scripts.breaker.ra_projection <seed> <hold_ms> [readers] [FANOUT_X=..]

Reasoning blocks (internal and public) and text blocks of big deltas span several pages, so a
public reader resuming inside a block searches its start while its read-ahead is held. Every
internal reader must get exactly position+1..end, every public one that minus the internal
blocks' seqs; no gap frame; the pages gauge back at 0; the log clean.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time

import redis.asyncio as aioredis

from publisher.tokens import issue
from schema.contract import encode_event
from schema.keys import Keys
from scripts.breaker.ra_harness import (
    SECRET,
    SHARED_URL,
    Publisher,
    StallClient,
    cleanup,
    metric,
    new_sid,
    scan_log,
)
from tests.publisher.helpers import block_start, delta, done, start, stop


async def store(client: aioredis.Redis, keys: Keys, sid: str, rng: random.Random) -> tuple[int, set[int]]:
    events = [start(sid)]
    hidden: set[int] = set()
    seq, index = 2, 0
    while seq < 1400:
        kind = rng.choice(["text", "reasoning", "reasoning"])
        vis = rng.choice(["internal", "public"]) if kind == "reasoning" else None
        hide = vis == "internal"
        events.append(block_start(sid, seq, index, kind, vis))
        if hide:
            hidden.add(seq)
        seq += 1
        for _ in range(rng.choice([3, 50, 300, 700])):
            events.append(delta(sid, seq, index, ("S" if hide else "y") * rng.choice([10, 20_000]), kind))
            if hide:
                hidden.add(seq)
            seq += 1
        events.append(stop(sid, seq, index, kind))
        if hide:
            hidden.add(seq)
        seq += 1
        index += 1
    events.append(done(sid, seq))
    await client.hset(keys.meta(sid), mapping={"state": "done", "status": "completed", "provider": "openai_chat",
                                               "model": "m", "created_ms": int(time.time() * 1000), "last_seq": seq})
    for i in range(0, len(events), 200):
        async with client.pipeline(transaction=False) as pipe:
            for event in events[i:i + 200]:
                pipe.xadd(keys.events(sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
            await pipe.execute()
    return seq, hidden


async def reader(rng: random.Random, port: int, sid: str, scope: str, position: int, end: int, hidden: set[int],
                 failures: list[str]) -> None:
    cred = issue(SECRET, sid, scope, int(time.time()) + 3600)  # type: ignore[arg-type]
    client = StallClient(port, sid, position=position, cred=cred)
    await client.connect()
    for _ in range(rng.randint(0, 5)):
        for _ in range(rng.randint(1, 100)):
            if not await client.read_some(rng.choice([1024, 65536])):
                break
        await asyncio.sleep(rng.choice([0.0, 0.005, 0.1, 0.5, 1.2]))
    try:
        await client.read_to_end(120)
    except TimeoutError:
        failures.append(f"{scope}@{position}: guard at {client.last()}")
    client.close()
    got = client.got
    want = [s for s in range(position + 1, end + 1) if scope == "internal" or s not in hidden]
    if got.status != 200:
        failures.append(f"{scope}@{position}: status {got.status} {got.body[:200]!r}")
    elif got.ids != want or got.gap or got.bad:
        failures.append(f"{scope}@{position}: len {len(got.ids)} want {len(want)} gap {got.gap[:1]} bad {got.bad[:1]} "
                        f"extra {sorted(set(got.ids) - set(want))[:5]} missing {sorted(set(want) - set(got.ids))[:5]}")


async def main(seed: int, hold_ms: str, readers: int, extra: dict[str, str]) -> int:
    rng = random.Random(seed)
    prefix = f"brk-rp-{seed}-{rng.randrange(1 << 30)}"
    keys = Keys(prefix)
    client = aioredis.from_url(SHARED_URL)
    pub = Publisher(SHARED_URL, prefix, FANOUT_READ_FIRST_PAGE="16", FANOUT_READ_PAGE="128",
                    FANOUT_READ_AHEAD_HOLD_MS=hold_ms, FANOUT_WRITE_TIMEOUT_S="60", **extra)
    failures: list[str] = []
    try:
        await pub.astart()
        sid = new_sid()
        end, hidden = await store(client, keys, sid, rng)
        tasks = [reader(rng, pub.port, sid, rng.choice(["public", "internal"]),
                        rng.choice([0, 0, rng.randint(0, end - 1)]), end, hidden, failures)
                 for _ in range(readers)]
        await asyncio.gather(*tasks)
        await asyncio.sleep(1.0)
        values = await pub.metrics()
        if (pages := metric(values, "fanout_sse_read_ahead_pages")) != 0:
            failures.append(f"pages gauge {pages}")
        print(f"seed={seed} hold={hold_ms} end={end} hidden={len(hidden)} "
              f"dropped={metric(values, 'fanout_sse_read_ahead_dropped_total')} "
              f"started={metric(values, 'fanout_sse_read_ahead_started_total')}")
    finally:
        pub.stop()
        await cleanup(client, prefix)
        await client.aclose()
    failures += scan_log(pub.logtext())
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(asyncio.run(main(int(args[0]), args[1], int(args[2]) if len(args) > 2 else 10,
                              dict(a.split("=", 1) for a in args[3:]))))
