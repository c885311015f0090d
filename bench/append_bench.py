"""Fenced append throughput against the real Redis: events/s per batch size.

Run: ``.venv/bin/python bench/append_bench.py [--events N] [--batches 1,8,64] [--streams N]``. Uses
``REDIS_URL`` when set (a cluster seed with ``FANOUT_REDIS_CLUSTER=1``), else a private embedded
``redis-server``. For each batch size it claims
``--streams`` fresh streams and appends ``--events`` ``block.delta`` events (about 40 bytes of text
each) round-robin through :class:`worker.appender.StreamWriter`, one script call per batch, all
streams concurrently, then prints events/s and script calls/s. Bounded: ``--events`` per stream
per batch size; the keys it wrote are deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

from infra.redis_client import RedisClient, RedisOptions, connect, primary_clients
from schema.contract import BlockDelta, BlockRef, BlockStart, Delta, Event, StreamStart
from schema.keys import Keys
from tools.embedded_redis import redis_url
from worker.appender import Appender, StreamWriter
from worker.lease import Leases

TEXT = "The quick brown fox jumps over the lazy d"


async def _stream(appender: Appender, leases: Leases, sid: str) -> StreamWriter:
    claim = await leases.claim(stream_id=sid, provider="openai_chat", model="bench", entry_id="1-0", now_ms=1)
    writer = appender.writer(sid, token=claim.token, last_seq=claim.last_seq)
    start = StreamStart(stream_id=sid, seq=1, ts=1, provider="openai_chat", model="bench", metadata={})
    await writer.append([start, BlockStart(stream_id=sid, seq=2, ts=1, block=BlockRef(id="b0", index=0, kind="text"))])
    return writer


async def _fill(writer: StreamWriter, events: int, batch: int) -> None:
    ref = BlockRef(id="b0", index=0, kind="text")
    sent = 0
    while sent < events:
        size = min(batch, events - sent)
        first = writer.last_seq + 1
        deltas: list[Event] = [
            BlockDelta(stream_id=writer.stream_id, seq=first + i, ts=2, block=ref, delta=Delta(kind="text", text=TEXT))
            for i in range(size)
        ]
        await writer.append(deltas)
        sent += size


async def _measure(client: RedisClient, keys: Keys, *, events: int, batch: int, streams: int) -> tuple[float, float]:
    appender = Appender(client, keys)
    leases = Leases(client, keys, consumer="bench", lease_s=30)
    writers = [await _stream(appender, leases, f"st_bench{batch}_{n}") for n in range(streams)]
    started = time.perf_counter()
    await asyncio.gather(*(_fill(w, events, batch) for w in writers))
    elapsed = time.perf_counter() - started
    total = events * streams
    return total / elapsed, total / batch / elapsed


async def _main(args: argparse.Namespace, url: str) -> None:
    client = connect(url, RedisOptions(cluster=os.environ.get("FANOUT_REDIS_CLUSTER", "0") in ("1", "true")))
    keys = Keys(prefix=f"fanoutbench-{uuid.uuid4().hex[:8]}")
    try:
        print(f"redis={url.rsplit('@', maxsplit=1)[-1]} events_per_stream={args.events} streams={args.streams}")
        for batch in args.batches:
            per_s, calls_s = await _measure(client, keys, events=args.events, batch=batch, streams=args.streams)
            print(f"batch={batch:<4d} events/s={per_s:>10,.0f} script_calls/s={calls_s:>9,.0f}")
    finally:
        for node in await primary_clients(client):
            async for key in node.scan_iter(match=f"{keys.prefix}:*", count=500):
                await client.delete(key)
            await node.aclose()
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=4000, help="events per stream per batch size")
    parser.add_argument("--streams", type=int, default=8, help="streams appended concurrently")
    parser.add_argument("--batches", type=lambda text: [int(p) for p in text.split(",")], default=[1, 8, 64])
    args = parser.parse_args()
    with redis_url() as url:
        asyncio.run(_main(args, url))


if __name__ == "__main__":
    main()
