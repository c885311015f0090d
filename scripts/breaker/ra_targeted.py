"""Read-ahead attack 3: faults placed exactly while the read-ahead of a stalled reader is in flight or held.

Usage: .venv/bin/python -m scripts.breaker.ra_targeted [scenario ...]

A private redis-server behind a proxy that holds the replies of the first ``XRANGE (0-258``
(the read ahead while the second page is written) until told; the second page is 9.6 MB, so
a reader with a 4 KB receive buffer that stops reading stalls inside its write. Each scenario
checks ids exactly once and in order (across reconnects), gap frames only where history
vanished, the pages gauge back at 0 and no exception left unretrieved in the log.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

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

TOP = 700
PREFIX = "brkt"
GATE = b"(0-258"


class Ctx:
    def __init__(self, redis: PrivateRedis, proxy: FreezeProxy, pub: Publisher, client: aioredis.Redis,
                 sid: str) -> None:
        self.redis, self.proxy, self.pub, self.client, self.sid = redis, proxy, pub, client, sid
        self.keys = Keys(PREFIX)
        self.failures: list[str] = []
        self.top = TOP

    async def until(self, name: str, pred: Callable[[float], bool], guard_s: float = 20.0) -> float:
        async with asyncio.timeout(guard_s):
            while True:
                value = metric(await self.pub.metrics(), name)
                if pred(value):
                    return value
                await asyncio.sleep(0.05)

    async def follow(self, client: StallClient, end: int, tag: str) -> list[int]:
        """Read ``client`` to ``end``, reconnecting with Last-Event-ID after each ended response."""
        ids: list[int] = []
        while True:
            try:
                await client.read_until(lambda c: c.last() >= end, guard_s=30)
            except TimeoutError:
                self.failures.append(f"{tag}: guard at {client.last()}")
                return ids
            client.close()
            if client.got.gap:
                self.failures.append(f"{tag}: gap {client.got.gap[0][:200]!r}")
                return ids
            ids += client.got.ids
            if client.got.status not in (200,):
                self.failures.append(f"{tag}: status {client.got.status} {client.got.body[:200]!r}")
                return ids
            last = ids[-1] if ids else client.position
            if last is not None and last >= end:
                return ids
            await asyncio.sleep(0.3)
            client = StallClient(self.pub.port, self.sid, position=last)
            await client.connect()


async def stall_into_second_page(ctx: Ctx, position: int | None = None) -> StallClient:
    client = StallClient(ctx.pub.port, ctx.sid, position=position)
    await client.connect()
    await client.read_some()  # headers and the first bytes; then it stops reading
    await asyncio.wait_for(ctx.proxy.gate_entered.wait(), 20)
    return client


async def live_end(ctx: Ctx, first: int = TOP + 1, n: int = 5) -> int:
    await append_live(ctx.client, ctx.keys, ctx.sid, first, n, terminal=True)
    return first + n - 1


async def s_cut_after_letgo(ctx: Ctx) -> None:
    client = await stall_into_second_page(ctx)
    await ctx.until("fanout_sse_read_ahead_dropped_total", lambda v: v >= 1)
    ctx.proxy.cut()
    ctx.proxy.gate_open.set()
    end = await live_end(ctx)
    check_exact("reader", await ctx.follow(client, end, "reader"), 1, end, ctx.failures)


async def s_cut_while_held(ctx: Ctx) -> None:
    client = await stall_into_second_page(ctx)
    await asyncio.sleep(0.5)
    ctx.proxy.cut()
    ctx.proxy.gate_open.set()
    end = await live_end(ctx)
    check_exact("reader", await ctx.follow(client, end, "reader"), 1, end, ctx.failures)


async def s_down_while_held(ctx: Ctx) -> None:
    client = await stall_into_second_page(ctx)
    ctx.proxy.down = True
    ctx.proxy.cut()
    ctx.proxy.gate_open.set()
    await asyncio.sleep(4.0)  # the read ahead's retries are spent: it failed, unawaited
    reading = asyncio.create_task(ctx.follow(client, TOP + 5, "reader"))
    await asyncio.sleep(2.0)
    ctx.proxy.down = False
    await asyncio.sleep(1.0)
    end = await live_end(ctx)
    check_exact("reader", await reading, 1, end, ctx.failures)


async def s_down_after_letgo(ctx: Ctx) -> None:
    client = await stall_into_second_page(ctx)
    await ctx.until("fanout_sse_read_ahead_dropped_total", lambda v: v >= 1)
    ctx.proxy.down = True
    ctx.proxy.cut()
    ctx.proxy.gate_open.set()
    await asyncio.sleep(4.0)
    ctx.proxy.down = False
    end = await live_end(ctx)
    check_exact("reader", await ctx.follow(client, end, "reader"), 1, end, ctx.failures)


async def s_disconnect_while_held(ctx: Ctx) -> None:
    client = await stall_into_second_page(ctx)
    await asyncio.sleep(0.3)
    client.close()
    await ctx.until("fanout_sse_readers", lambda v: v == 0)
    ctx.proxy.gate_open.set()


async def s_disconnect_after_letgo(ctx: Ctx) -> None:
    client = await stall_into_second_page(ctx)
    await ctx.until("fanout_sse_read_ahead_dropped_total", lambda v: v >= 1)
    client.close()
    await ctx.until("fanout_sse_readers", lambda v: v == 0)
    ctx.proxy.gate_open.set()


async def s_shared_mixed(ctx: Ctx) -> None:
    stalled = await stall_into_second_page(ctx)
    fast = StallClient(ctx.pub.port, ctx.sid, position=256)  # 257..258 then the same read ahead
    await fast.connect()
    await fast.read_until(lambda c: c.last() >= 258, 10)
    await ctx.until("fanout_sse_read_ahead_dropped_total", lambda v: v >= 1)
    ctx.proxy.gate_open.set()
    await fast.read_until(lambda c: c.last() >= TOP, 20)
    end = await live_end(ctx)
    fast_ids = await ctx.follow(fast, end, "fast")
    check_exact("fast", fast_ids, 257, end, ctx.failures)
    check_exact("stalled", await ctx.follow(stalled, end, "stalled"), 1, end, ctx.failures)


async def s_shared_cut(ctx: Ctx) -> None:
    stalled = await stall_into_second_page(ctx)
    fast = StallClient(ctx.pub.port, ctx.sid, position=256)
    await fast.connect()
    await fast.read_until(lambda c: c.last() >= 258, 10)
    await ctx.until("fanout_sse_read_ahead_dropped_total", lambda v: v >= 1)
    ctx.proxy.down = True
    ctx.proxy.cut()
    ctx.proxy.gate_open.set()
    await asyncio.sleep(4.0)  # the shared read fails for the fast reader (awaiting it) only
    ctx.proxy.down = False
    end = await live_end(ctx)
    check_exact("fast", await ctx.follow(fast, end, "fast"), 257, end, ctx.failures)
    check_exact("stalled", await ctx.follow(stalled, end, "stalled"), 1, end, ctx.failures)


async def _trim_case(ctx: Ctx, *, wait_letgo: bool, delete: bool) -> None:
    client = await stall_into_second_page(ctx)
    if wait_letgo:
        await ctx.until("fanout_sse_read_ahead_dropped_total", lambda v: v >= 1)
    ctx.proxy.gate_open.set()
    await asyncio.sleep(0.3)  # the held read (if still held) has landed
    if delete:
        await ctx.client.delete(ctx.keys.events(ctx.sid))
    else:
        await ctx.client.execute_command("XTRIM", ctx.keys.events(ctx.sid), "MINID", "0-401")
    if wait_letgo or delete:
        await client.read_to_end(30)
    else:
        await client.read_until(lambda c: c.last() >= TOP, 30)
    client.close()
    got = client.got
    if wait_letgo:  # read again after the trim: the gap is real, right after the stalled page
        check_exact("reader", got.ids, 1, 258, ctx.failures)
        if len(got.gap) != 1:
            ctx.failures.append(f"want one gap frame, got {got.gap}")
        elif (b'"after_seq":258' not in got.gap[0]) or (
                (b'"next_seq":null' if delete else b'"next_seq":401') not in got.gap[0]):
            ctx.failures.append(f"gap frame {got.gap[0]!r}")
    else:  # the page read ahead (before the trim) is sent; the gap is after it
        if got.ids[:514] != list(range(1, 515)):
            ctx.failures.append(f"held page not sent whole: {got.ids[250:260]} .. len {len(got.ids)}")
        if delete:
            if len(got.gap) != 1 or b'"after_seq":514' not in got.gap[0]:
                ctx.failures.append(f"gap {got.gap} ids tail {got.ids[-3:]}")
        else:  # 515.. still stored: no gap, every event
            if got.gap:
                ctx.failures.append(f"false gap {got.gap}")
            check_exact("reader", got.ids, 1, TOP, ctx.failures)


async def s_trim_after_letgo(ctx: Ctx) -> None:
    await _trim_case(ctx, wait_letgo=True, delete=False)


async def s_trim_while_held(ctx: Ctx) -> None:
    await _trim_case(ctx, wait_letgo=False, delete=False)


async def s_del_after_letgo(ctx: Ctx) -> None:
    await _trim_case(ctx, wait_letgo=True, delete=True)


async def s_del_while_held(ctx: Ctx) -> None:
    await _trim_case(ctx, wait_letgo=False, delete=True)


async def s_grow_while_stalled(ctx: Ctx) -> None:
    client = await stall_into_second_page(ctx)
    seq = TOP + 1
    for _ in range(40):
        await append_live(ctx.client, ctx.keys, ctx.sid, seq, 7)
        seq += 7
        await asyncio.sleep(0.02)
    await ctx.until("fanout_sse_read_ahead_dropped_total", lambda v: v >= 1)
    ctx.proxy.gate_open.set()
    for _ in range(20):
        await append_live(ctx.client, ctx.keys, ctx.sid, seq, 3)
        seq += 3
    end = await live_end(ctx, seq)
    check_exact("reader", await ctx.follow(client, end, "reader"), 1, end, ctx.failures)


async def s_shutdown_while_held(ctx: Ctx) -> None:
    clients = [await stall_into_second_page(ctx)]
    for position in (256, 100):  # one more on the same shared read ahead, one elsewhere
        extra = StallClient(ctx.pub.port, ctx.sid, position=position)
        await extra.connect()
        await extra.read_some()
        clients.append(extra)
    await asyncio.sleep(0.5)
    took = await ctx.pub.astop()  # SIGTERM while the read ahead is in flight and held (Redis not answering it)
    print(f"  stopped after {took} s (None: killed)")
    if took is None:
        ctx.failures.append("the publisher did not stop within the guard")
    ctx.proxy.gate_open.set()


async def s_shutdown_after_letgo(ctx: Ctx) -> None:
    client = await stall_into_second_page(ctx)  # kept: a collected client closes its socket
    await ctx.until("fanout_sse_read_ahead_dropped_total", lambda v: v >= 1)
    took = await ctx.pub.astop()
    print(f"  stopped after {took} s (None: killed)")
    if took is None:
        ctx.failures.append("the publisher did not stop within the guard")
    ctx.proxy.gate_open.set()
    client.close()


async def s_golive_race(ctx: Ctx) -> None:
    """The page read ahead is the last, short one; live entries arrive (another reader is live) while held."""
    top = ctx.top
    stalled = await stall_into_second_page(ctx)
    fast = StallClient(ctx.pub.port, ctx.sid, position=top - 5)
    await fast.connect()
    await fast.read_until(lambda c: c.last() >= top, 10)
    seq = top + 1
    for _ in range(10):
        await append_live(ctx.client, ctx.keys, ctx.sid, seq, 5)
        seq += 5
    await fast.read_until(lambda c: c.last() >= seq - 1, 10)  # fast is live: the topic is past top
    ctx.proxy.gate_open.set()
    await asyncio.sleep(0.3)
    reading = asyncio.create_task(ctx.follow(stalled, seq + 9, "stalled"))
    await asyncio.sleep(0.2)
    for _ in range(2):
        await append_live(ctx.client, ctx.keys, ctx.sid, seq, 4)
        seq += 4
    end = await live_end(ctx, seq, 2)
    check_exact("stalled", await reading, 1, end, ctx.failures)
    check_exact("fast", await ctx.follow(fast, end, "fast"), top - 4, end, ctx.failures)


SCENARIOS: dict[str, tuple[Callable[[Ctx], Awaitable[None]], str]] = {
    "cut_after_letgo": (s_cut_after_letgo, "200"),
    "cut_while_held": (s_cut_while_held, "60000"),
    "down_while_held": (s_down_while_held, "60000"),
    "down_after_letgo": (s_down_after_letgo, "200"),
    "disconnect_while_held": (s_disconnect_while_held, "60000"),
    "disconnect_after_letgo": (s_disconnect_after_letgo, "200"),
    "shared_mixed": (s_shared_mixed, "200"),
    "shared_cut": (s_shared_cut, "200"),
    "trim_after_letgo": (s_trim_after_letgo, "200"),
    "trim_while_held": (s_trim_while_held, "60000"),
    "del_after_letgo": (s_del_after_letgo, "200"),
    "del_while_held": (s_del_while_held, "60000"),
    "grow_while_stalled": (s_grow_while_stalled, "200"),
    "shutdown_while_held": (s_shutdown_while_held, "60000"),
    "golive_race_held": (s_golive_race, "60000"),
    "golive_race_letgo": (s_golive_race, "200"),
    "shutdown_after_letgo": (s_shutdown_after_letgo, "200"),
}


async def run(name: str, extra: dict[str, Any]) -> list[str]:
    scenario, hold = SCENARIOS[name]
    redis = PrivateRedis()
    redis.start()
    proxy = FreezeProxy(redis.port)
    proxy.gate_pattern = GATE
    await proxy.start()
    client = aioredis.from_url(redis.url)
    env = {"FANOUT_READ_FIRST_PAGE": "2", "FANOUT_READ_PAGE": "256", "FANOUT_READ_AHEAD_HOLD_MS": hold,
           "FANOUT_WRITE_TIMEOUT_S": "60", "FANOUT_HEARTBEAT_S": "1", **extra}
    pub = Publisher(proxy.url, PREFIX, **env)
    sid = new_sid()
    ctx = Ctx(redis, proxy, pub, client, sid)
    try:
        await pub.astart()
        if name.startswith("golive"):
            ctx.top = 400
        await store_stream(client, ctx.keys, sid, ctx.top, big=240, big_bytes=40_000)
        await scenario(ctx)
        if pub.proc is None:  # the scenario stopped the publisher
            print(f"{name}: publisher stopped by the scenario")
            return [f"{name}: {f} (log {pub.log.name})" for f in ctx.failures + scan_log(pub.logtext())]
        await asyncio.sleep(1.0)
        values = await pub.metrics()
        if (pages := metric(values, "fanout_sse_read_ahead_pages")) != 0:
            ctx.failures.append(f"pages gauge {pages}")
        await ctx.until("fanout_sse_readers", lambda v: v == 0)
        print(f"{name}: dropped={metric(values, 'fanout_sse_read_ahead_dropped_total')} "
              f"started={metric(values, 'fanout_sse_read_ahead_started_total')} "
              f"gaps={metric(values, 'fanout_sse_gaps_total')} cuts={proxy.cuts}")
    except Exception as exc:
        ctx.failures.append(f"scenario raised {exc!r}")
    finally:
        pub.stop()
        await proxy.close()
        await client.aclose()
        redis.stop()
    ctx.failures += [f for f in scan_log(pub.logtext()) if "ERROR" not in f or "unexpected" in f]
    return [f"{name}: {f} (log {pub.log.name})" for f in ctx.failures]


async def main(names: list[str], extra: dict[str, str]) -> int:
    failures: list[str] = []
    for name in names or list(SCENARIOS):
        failures += await run(name, extra)
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(asyncio.run(main([a for a in args if "=" not in a], dict(a.split("=", 1) for a in args if "=" in a))))
