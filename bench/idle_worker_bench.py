"""Commands an idle worker sends per second, per shard count, on a private node and a private 3-master cluster.

Run: ``PYTHONPATH=. .venv/bin/python bench/idle_worker_bench.py [--seconds 10] [--shards 1,16] [--block-ms 2000]``.
Starts its own ``redis-server`` processes (tests/redis_servers.py: loopback, free ports, no
persistence), runs one :class:`worker.runner.Worker` with no jobs for ``--seconds`` after a
warm-up, and prints the commands the servers counted meanwhile (``INFO commandstats``
summed over the masters, the ``INFO`` calls of the measurement itself excluded), per
second and per master. Bounded: ``--seconds`` per (topology, shard count).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import uuid
from collections.abc import Iterator

from infra.redis_client import RedisClient, RedisOptions, connect, primary_clients
from schema.keys import Keys
from tests.redis_servers import redis_cluster, redis_node
from worker.runner import Worker
from worker.settings import WorkerSettings
from worker.upstream import new_session


async def _calls(client: RedisClient) -> list[int]:
    out = []
    for node in await primary_clients(client):
        stats = await node.info("commandstats")
        await node.aclose()
        out.append(sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info"))
    return out


async def _measure(url: str, cluster: bool, shards: int, seconds: float, block_ms: int) -> list[float]:
    keys = Keys(f"fanoutbench-{uuid.uuid4().hex[:8]}")
    settings = WorkerSettings(redis_url=url, redis_cluster=cluster, redis_prefix=keys.prefix, job_shards=shards,
                              block_ms=block_ms)
    client = connect(url, RedisOptions(cluster=cluster))
    session = new_session(settings)
    worker = Worker.create(client, keys, settings, session=session)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await worker.ready.wait()
    await asyncio.sleep(block_ms / 1000 * 2)  # warm-up: every reader is blocking
    probe = connect(url, RedisOptions(cluster=cluster))
    before = await _calls(probe)
    await asyncio.sleep(seconds)
    after = await _calls(probe)
    stop.set()
    await task
    await session.close()
    await client.aclose()
    await probe.aclose()
    return [(a - b) / seconds for a, b in zip(after, before, strict=True)]


@contextlib.contextmanager
def _server(cluster: bool) -> Iterator[str]:
    if cluster:
        with redis_cluster(masters=3) as servers:
            yield servers.url
    else:
        with redis_node() as server:
            yield server.url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured idle time per run")
    parser.add_argument("--shards", type=lambda text: [int(p) for p in text.split(",")], default=[1, 16])
    parser.add_argument("--block-ms", type=int, default=2000, help="FANOUT_BLOCK_MS of the worker")
    args = parser.parse_args()
    for cluster in (False, True):
        with _server(cluster) as url:
            for shards in args.shards:
                rates = asyncio.run(_measure(url, cluster, shards, args.seconds, args.block_ms))
                per_node = " ".join(f"{r:.1f}" for r in rates)
                print(f"topology={'cluster' if cluster else 'single':<7} shards={shards:<3d} "
                      f"block_ms={args.block_ms} commands/s={sum(rates):.1f} per_master=[{per_node}]")


if __name__ == "__main__":
    main()
