"""What one idle SSE reader costs the publisher: RSS and Python allocations, by source line.

Runs the publisher in this process (``EdgeRunner``), connects ``--readers`` idle SSE
readers of ``--streams`` streams from a child process (plain sockets, so the clients'
memory is not counted), waits until every reader is live, and prints the RSS growth per
reader and the top allocation sites (``tracemalloc`` snapshot difference) per reader.

    .venv/bin/python bench/reader_cost.py --redis-port P [--readers 2000] [--uvloop] [--no-trace]

``--no-trace`` leaves ``tracemalloc`` off and prints only the RSS growth: tracemalloc's
own bookkeeping inflates RSS, so the RSS figure to quote is the one without it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import subprocess
import sys
import time
import tracemalloc
import uuid
from pathlib import Path

import psutil
import redis.asyncio as aioredis
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from publisher.api.edge import EdgeRunner
from publisher.app import RUNNER_KWARGS, create_app
from publisher.settings import PublisherSettings
from publisher.state import HUB
from schema.keys import Keys

CLIENT = r"""
import socket, sys, time
host, port, n, streams, token = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
socks = []
for i in range(n):
    s = socket.create_connection((host, port))
    head = f"GET /v1/streams/st_cost{i % streams}/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
    s.sendall(head.encode() + b"\r\n")
    socks.append(s)
    if i % 200 == 199:
        time.sleep(0.05)
print("READY", flush=True)
sys.stdin.read()
"""


async def main(a: argparse.Namespace) -> None:
    keys = Keys(f"cost{uuid.uuid4().hex[:8]}")
    url = f"redis://127.0.0.1:{a.redis_port}/0"
    client = aioredis.Redis.from_url(url)
    for j in range(a.streams):
        sid = f"st_cost{j}"
        await client.hset(keys.meta(sid), mapping={"state": "running", "last_seq": 1})
        await client.xadd(keys.events(sid), {"e": b'{"type":"stream.start","seq":1,"ts":0}'}, id="0-1")
    settings = PublisherSettings(api_keys=["cost-key"], token_secret="c" * 48, max_connections=a.readers + 10,
                                 max_sockets=a.readers + 100, redis_pool_timeout_s=60.0)
    app = create_app(settings, keys=keys, redis_url=url)
    runner = EdgeRunner(app, **RUNNER_KWARGS, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, backlog=4096).start()
    host, port = runner.addresses[0][:2]
    me = psutil.Process()
    gc.collect()
    if a.trace:
        tracemalloc.start(1)
    before_snap = tracemalloc.take_snapshot() if a.trace else None
    before_rss = me.memory_info().rss
    tasks_before = len(asyncio.all_tasks())
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CLIENT, host, str(port), str(a.readers),
                                                str(a.streams), "cost-key", stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE)
    assert proc.stdout is not None
    await proc.stdout.readline()
    hub = app[HUB]
    deadline = time.monotonic() + 60
    while sum(len(t.live) for t in hub._topics.values()) < a.readers and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    live = sum(len(t.live) for t in hub._topics.values())
    gc.collect()
    after_rss = me.memory_info().rss
    print(f"readers live: {live}/{a.readers}; loop: {type(asyncio.get_running_loop()).__module__}; "
          f"tasks per reader: {(len(asyncio.all_tasks()) - tasks_before) / max(1, live):.2f}")
    print(f"RSS growth per reader: {(after_rss - before_rss) / max(1, live) / 1024:.1f} KB "
          f"({'with' if a.trace else 'without'} tracemalloc)")
    if before_snap is not None:
        _print_sites(before_snap, tracemalloc.take_snapshot(), live, a.top)
    assert proc.stdin is not None
    proc.stdin.close()
    await proc.wait()
    await runner.cleanup()
    async for key in client.scan_iter(match=f"{keys.prefix}:*"):
        await client.delete(key)
    await client.aclose()


def _print_sites(before_snap: tracemalloc.Snapshot, after_snap: tracemalloc.Snapshot, live: int, top: int) -> None:
    """Print the allocation growth per reader, by file and by line (``top`` lines)."""
    by_file = after_snap.compare_to(before_snap, "filename")
    print("per reader, by file:")
    for stat in by_file[:12]:
        name = stat.traceback[0].filename.removeprefix(sys.prefix + "/")
        print(f"  {stat.size_diff / max(1, live):8.0f} B  {name}")
    stats = after_snap.compare_to(before_snap, "lineno")
    total = sum(s.size_diff for s in stats)
    print(f"Python allocations per reader: {total / max(1, live) / 1024:.2f} KB; top sites:")
    for stat in stats[:top]:
        frame = stat.traceback[0]
        name = frame.filename.removeprefix(sys.prefix + "/")
        per = stat.size_diff / max(1, live)
        print(f"  {per:8.0f} B  {stat.count_diff / max(1, live):5.1f} objs  {name}:{frame.lineno}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--redis-port", type=int, required=True)
    ap.add_argument("--readers", type=int, default=2000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--uvloop", action="store_true")
    ap.add_argument("--no-trace", dest="trace", action="store_false", help="RSS only (no tracemalloc)")
    args = ap.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.run(main(args))
    else:
        asyncio.run(main(args))
