"""Fenced appends by K worker processes on one Redis node and on a 3-master Redis Cluster, in one run.

Run: ``.venv/bin/python bench/cluster_append_bench.py [--procs 1,2,4] [--streams 16] [--events 2000]
[--batch 8]``. Starts a private single node and a private 3-master cluster on loopback (the
machine's ``redis-server``; persistence off), then for each K: K processes, each claiming
``--streams`` fresh streams and appending ``--events`` ``block.delta`` events per stream in
batches of ``--batch`` through :class:`worker.appender.StreamWriter` (the worker's own
append path: one fenced script call per batch), all streams of a process concurrently.
Prints events/s (all processes' events over the wall time from the first start to the
last end) and each node's share of the commands it served (``INFO commandstats``, reset
with ``CONFIG RESETSTAT`` on these private servers before each run). Bounded: K x
``--streams`` x ``--events`` events per row. The load average is printed: the machine is
shared, so figures are indicative.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.redis_servers starts the servers

from infra.redis_client import RedisOptions, connect
from schema.contract import BlockDelta, BlockRef, BlockStart, Delta, Event, StreamStart
from schema.keys import Keys
from tests.redis_servers import RedisServer, redis_cluster, redis_node
from worker.appender import Appender, StreamWriter
from worker.lease import Leases

TEXT = "The quick brown fox jumps over the lazy d"


async def _stream(appender: Appender, leases: Leases, sid: str) -> StreamWriter:
    claim = await leases.claim(stream_id=sid, provider="openai_chat", model="bench", entry_id="1-0", now_ms=1)
    writer = appender.writer(sid, token=claim.token, last_seq=claim.last_seq)
    ref = BlockRef(id="b0", index=0, kind="text")
    await writer.append([StreamStart(stream_id=sid, seq=1, ts=1, provider="openai_chat", model="bench", metadata={}),
                         BlockStart(stream_id=sid, seq=2, ts=1, block=ref)])
    return writer


async def _fill(writer: StreamWriter, events: int, batch: int) -> None:
    ref = BlockRef(id="b0", index=0, kind="text")
    sent = 0
    while sent < events:
        size = min(batch, events - sent)
        first = writer.last_seq + 1
        deltas: list[Event] = [BlockDelta(stream_id=writer.stream_id, seq=first + i, ts=2, block=ref,
                                          delta=Delta(kind="text", text=TEXT))
                               for i in range(size)]
        await writer.append(deltas)
        sent += size


async def _process(url: str, cluster: bool, streams: int, events: int, batch: int) -> tuple[float, float, int]:
    client = connect(url, RedisOptions(cluster=cluster))
    keys = Keys(f"bench-{uuid.uuid4().hex[:8]}")
    try:
        appender, leases = Appender(client, keys), Leases(client, keys, consumer="bench", lease_s=30)
        writers = [await _stream(appender, leases, f"st_{uuid.uuid4().hex}") for _ in range(streams)]
        started = time.time()
        await asyncio.gather(*(_fill(w, events, batch) for w in writers))
        return started, time.time(), events * streams
    finally:
        await client.aclose()


def _run_process(args: tuple[str, bool, int, int, int]) -> tuple[float, float, int]:
    return asyncio.run(_process(*args))


def _commands(nodes: list[RedisServer]) -> dict[int, int]:
    """Calls served per primary port since the last reset (INFO commandstats, INFO and CONFIG excluded)."""
    out = {}
    for node in nodes:
        with node.client() as client:
            stats = client.info("commandstats")
            out[node.port] = sum(int(v["calls"]) for k, v in stats.items()
                                 if k not in ("cmdstat_info", "cmdstat_config", "cmdstat_cluster", "cmdstat_ping"))
    return out


def _row(name: str, url: str, *, cluster: bool, nodes: list[RedisServer], procs: int, args: argparse.Namespace) -> str:
    for node in nodes:
        with node.client() as client:
            client.config_resetstat()
    job = (url, cluster, args.streams, args.events, args.batch)
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        results = pool.map(_run_process, [job] * procs)
    wall = max(end for _s, end, _n in results) - min(start for start, _e, _n in results)
    total = sum(n for _s, _e, n in results)
    calls = _commands(nodes)
    share = " / ".join(f"{100 * c / max(1, sum(calls.values())):.0f}%" for c in calls.values())
    return (f"| {name} | {procs} | {total} | {total / wall:,.0f} | {total / args.batch / wall:,.0f} | "
            f"{share} |")


def main() -> None:
    """Parse arguments, start both topologies, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", default="1,2,4", help="comma-separated process counts K")
    parser.add_argument("--streams", type=int, default=16, help="concurrent streams per process")
    parser.add_argument("--events", type=int, default=2000, help="events per stream")
    parser.add_argument("--batch", type=int, default=8, help="events per script call")
    args = parser.parse_args()
    procs = [int(p) for p in args.procs.split(",")]
    print(f"cores: {os.cpu_count()}, load average before: {os.getloadavg()[0]:.2f}")
    print("| topology | K processes | events | events/s | script calls/s | share of commands per node |")
    print("| --- | --- | --- | --- | --- | --- |")
    with redis_node() as node, redis_cluster(masters=3) as cluster:
        for k in procs:
            print(_row("single node", node.url, cluster=False, nodes=[node], procs=k, args=args), flush=True)
            print(_row("cluster 3 masters", cluster.url, cluster=True, nodes=cluster.primaries(), procs=k, args=args),
                  flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
