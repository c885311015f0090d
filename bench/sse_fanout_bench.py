"""SSE fan-out benchmark: N concurrent readers of one stream while events are appended.

Starts the publisher as a ``fanout publisher`` child process on a loopback port (or
in-process with ``--in-process``; Redis: ``REDIS_URL`` or the embedded server), connects
``--readers`` SSE clients to one stream, then appends ``--events``
``block.delta`` events as a worker would (XADD ``0-<seq>`` + HSET meta + PUBLISH), each
carrying its append time in nanoseconds in the delta text, and a final ``stream.done``.
Prints delivered events per second (all readers together) and the p50/p99
publish-to-delivery latency. Bounded: it ends when every reader has the terminal event.

    .venv/bin/python bench/sse_fanout_bench.py --readers 100 --events 1000 [--rate 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import statistics
import sys
import time
import uuid

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web

from publisher.app import RUNNER_KWARGS, create_app
from publisher.settings import PublisherSettings
from schema.contract import BlockDelta, BlockRef, BlockStart, Delta, StreamDone, StreamStart, encode_event
from schema.keys import Keys
from tools.embedded_redis import redis_url

API_KEY = "bench-key"
SID = "st_bench"


async def append(redis: aioredis.Redis, keys: Keys, event) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        pipe.xadd(keys.events(SID), {"e": encode_event(event)}, id=f"0-{event.seq}")
        pipe.hset(keys.meta(SID), mapping={"last_seq": event.seq, "state": "running"})
        pipe.publish(keys.live(SID), str(event.seq))
        await pipe.execute()


async def reader(session: aiohttp.ClientSession, url: str, ready: asyncio.Event, latencies: list[float]) -> int:
    """Read the stream to its end; record latency of every delta; return the events received."""
    received = 0
    async with session.get(url, headers={"Authorization": f"Bearer {API_KEY}"}) as resp:
        assert resp.status == 200, resp.status
        event_name = ""
        while line := await resp.content.readline():
            if line.startswith(b"event: "):
                event_name = line[7:-1].decode()
            elif line.startswith(b"data: "):
                now_ns = time.time_ns()
                received += 1
                if event_name == "stream.start":
                    ready.set()
                elif event_name == "block.delta":
                    sent_ns = int(line.rsplit(b'"text":"', 1)[1].split(b'"', 1)[0])
                    latencies.append((now_ns - sent_ns) / 1e6)
                elif event_name == "stream.done":
                    break
    return received


async def start_in_process(stack: contextlib.AsyncExitStack, settings: PublisherSettings, keys: Keys,
                           url: str) -> str:
    runner = web.AppRunner(create_app(settings, keys=keys, redis_url=url), **RUNNER_KWARGS, access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return f"http://{host}:{port}"


async def start_child(stack: contextlib.AsyncExitStack, settings: PublisherSettings, keys: Keys, url: str) -> str:
    env = {**os.environ, "REDIS_URL": url, "FANOUT_REDIS_PREFIX": keys.prefix, "FANOUT_API_KEYS": API_KEY,
           "FANOUT_TOKEN_SECRET": settings.token_secret, "FANOUT_SHUTDOWN_WINDOW_S": "0",
           "FANOUT_CLIENT_QUEUE": str(settings.client_queue), "FANOUT_MAX_CONNECTIONS": str(settings.max_connections)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fanout_cli", "publisher", "--host", "127.0.0.1", "--port", "0",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )

    async def stop() -> None:
        proc.send_signal(signal.SIGTERM)
        await proc.wait()

    stack.push_async_callback(stop)
    assert proc.stderr is not None
    while line := (await proc.stderr.readline()).decode():
        if match := re.search(r"listening on (http://[\d.]+:\d+)", line):
            asyncio.create_task(proc.stderr.read())  # keep draining the access log  # noqa: RUF006
            return match.group(1)
    raise RuntimeError("the publisher did not start")


async def run(args: argparse.Namespace) -> None:
    keys = Keys(prefix=f"fanoutbench-{uuid.uuid4().hex[:8]}")
    settings = PublisherSettings(api_keys=[API_KEY], token_secret="b" * 48, shutdown_window_s=0,
                                 client_queue=args.queue, max_connections=args.readers + 10)
    async with contextlib.AsyncExitStack() as stack:
        url = stack.enter_context(redis_url())
        redis = aioredis.Redis.from_url(url)
        start = start_in_process if args.in_process else start_child
        base = await start(stack, settings, keys, url)
        events_url = f"{base}/v1/streams/{SID}/events"
        try:
            await redis.hset(keys.meta(SID), mapping={"state": "running", "last_seq": 0})
            now = int(time.time() * 1000)
            await append(redis, keys, StreamStart(stream_id=SID, seq=1, ts=now, provider="anthropic", model="m"))
            block = BlockRef(id="b0", index=0, kind="text")
            await append(redis, keys, BlockStart(stream_id=SID, seq=2, ts=now, block=block))
            latencies: list[float] = []
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
                readies = [asyncio.Event() for _ in range(args.readers)]
                tasks = [asyncio.create_task(reader(session, events_url, r, latencies)) for r in readies]
                await asyncio.gather(*(r.wait() for r in readies))
                started = time.perf_counter()
                pause_s = 1.0 / args.rate if args.rate else 0.0
                for i in range(args.events):
                    seq = 3 + i
                    ts_ns = time.time_ns()
                    delta = Delta(kind="text", text=str(ts_ns))
                    await append(redis, keys, BlockDelta(stream_id=SID, seq=seq, ts=ts_ns // 1_000_000,
                                                         block=block, delta=delta))
                    if pause_s:
                        await asyncio.sleep(pause_s)
                last = 3 + args.events
                await append(redis, keys, StreamDone(stream_id=SID, seq=last, ts=int(time.time() * 1000),
                                                     status="completed", finish_reason="stop",
                                                     provider_finish_reason="end_turn", usage=None,
                                                     response_id=None, model="m"))
                counts = await asyncio.gather(*tasks)
                elapsed_s = time.perf_counter() - started
            delivered = sum(counts) - 2 * args.readers  # without the start and block.start replayed
            quantiles = statistics.quantiles(latencies, n=100)
            where = "in-process" if args.in_process else "child process"
            print(f"readers={args.readers} events={args.events} rate={'max' if not args.rate else args.rate}/s "
                  f"queue={args.queue} publisher={where}")
            print(f"delivered {delivered} events in {elapsed_s:.2f}s: {delivered / elapsed_s:,.0f} events/s")
            print(f"publish-to-delivery latency: p50 {quantiles[49]:.2f} ms, p99 {quantiles[98]:.2f} ms, "
                  f"max {max(latencies):.2f} ms ({len(latencies)} samples)")
        finally:
            async for key in redis.scan_iter(match=f"{keys.prefix}:*"):
                await redis.delete(key)
            await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readers", type=int, default=100, help="concurrent SSE readers (default 100)")
    parser.add_argument("--events", type=int, default=1000, help="events appended (default 1000)")
    parser.add_argument("--rate", type=float, default=0, help="appends per second; 0 = as fast as possible")
    parser.add_argument("--queue", type=int, default=1024, help="FANOUT_CLIENT_QUEUE (default 1024)")
    parser.add_argument("--in-process", action="store_true", help="run the publisher in this process")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
