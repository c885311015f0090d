"""Publisher memory held by readers that replay one stream's history and never read it.

Runs the publisher in this process, stores one stream whose ``stream.start`` carries
``--event-kb`` of metadata plus ``--deltas`` small deltas, connects ``--readers`` raw
sockets from a child process that send the SSE request and then never read, waits
until the publisher has stopped writing, and prints the RSS growth: in all and per
reader. With shared reads (``Store.read_after(share=...)``) readers that replay from
the same place hold one copy of each page instead of one each. ``--spread`` has reader
``i`` resume after seq ``i`` (``Last-Event-ID``), so no two share a read: what readers that
do not replay from the same place hold each. The kernel takes up to a socket send buffer
of each stalled response (about 4 MB on loopback here, not in the RSS): only a stream
longer than that (``--deltas 20000``) leaves pages in the publisher. ``--stagger-ms``
pauses between connections: a stalled reader lets its read-ahead page go after
``FANOUT_READ_AHEAD_HOLD_MS`` (1 s), and readers that arrive later reuse that memory,
while readers that all arrive within the hold each hold both pages at once (the RSS
keeps that peak).

    .venv/bin/python bench/replay_memory.py --redis-port P [--readers 300] [--event-kb 1024] [--deltas 2000]
        [--spread] [--stagger-ms 0] [--trace]

``--trace`` prints what ``tracemalloc`` sees the stalled readers hold, per reader and by
allocating line (what ``publisher.live.reader_budget.ENTRY_BYTES`` estimates).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import subprocess
import sys
import tracemalloc
import uuid
from pathlib import Path

import msgspec
import psutil
import redis.asyncio as aioredis
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from publisher.api.edge import EdgeRunner
from publisher.app import RUNNER_KWARGS, create_app
from publisher.settings import PublisherSettings
from schema.keys import Keys

CLIENT = r"""
import socket, sys, time
host, port, n, sid, spread = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"
stagger_s = float(sys.argv[6]) / 1000
socks = []
for i in range(n):
    s = socket.create_connection((host, port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    position = f"Last-Event-ID: {i}\r\n" if spread and i else ""
    s.sendall(f"GET /v1/streams/{sid}/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer mem-key\r\n"
              f"{position}\r\n".encode())
    socks.append(s)
    time.sleep(stagger_s)
print("READY", flush=True)
sys.stdin.read()
"""


async def _settle(me: psutil.Process, seconds: float) -> int:
    await asyncio.sleep(seconds)
    gc.collect()
    return int(me.memory_info().rss)


def _print_traced(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, readers: int) -> None:
    """Print the Python memory the stalled readers hold, per reader: in all, and by allocating line."""
    diff = after.compare_to(before, "lineno")
    total = sum(stat.size_diff for stat in diff)
    print(f"traced: {total / readers / 1024:.0f} KB per reader (tracemalloc; its own bookkeeping inflates RSS)")
    for stat in diff[:8]:
        frame = stat.traceback[0]
        print(f"  {stat.size_diff / readers / 1024:7.1f} KB {stat.count_diff / readers:7.1f} blocks per reader  "
              f"{Path(frame.filename).name}:{frame.lineno}")


async def main(a: argparse.Namespace) -> None:
    keys = Keys(f"mem{uuid.uuid4().hex[:8]}")
    url = f"redis://127.0.0.1:{a.redis_port}/0"
    client = aioredis.Redis.from_url(url)
    sid = "st_mem"
    start = {"type": "stream.start", "stream_id": sid, "seq": 1, "ts": 1, "provider": "p", "model": "m",
             "metadata": {"blob": "x" * (a.event_kb * 1024)}}
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.meta(sid), mapping={"state": "running", "last_seq": a.deltas + 1})
    pipe.xadd(keys.events(sid), {"e": msgspec.json.encode(start)}, id="0-1")
    for seq in range(2, a.deltas + 2):
        delta = {"type": "block.delta", "stream_id": sid, "seq": seq, "ts": 1,
                 "block": {"id": "b0", "index": 0, "kind": "text"}, "delta": {"kind": "text", "text": "t" * 200}}
        pipe.xadd(keys.events(sid), {"e": msgspec.json.encode(delta)}, id=f"0-{seq}")
    await pipe.execute()
    settings = PublisherSettings(api_keys=["mem-key"], token_secret="m" * 48, max_connections=a.readers + 10,
                                 write_timeout_s=600.0)
    app = create_app(settings, keys=keys, redis_url=url)
    runner = EdgeRunner(app, **RUNNER_KWARGS, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, backlog=4096).start()
    host, port = runner.addresses[0][:2]
    me = psutil.Process()
    before = await _settle(me, 0.5)
    if a.trace:
        tracemalloc.start(1)
    traced = tracemalloc.take_snapshot() if a.trace else None
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CLIENT, host, str(port), str(a.readers), sid,
                                                "1" if a.spread else "0", str(a.stagger_ms),
                                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdin is not None
    await proc.stdout.readline()
    held = await _settle(me, a.settle_s)
    if traced is not None:
        _print_traced(traced, tracemalloc.take_snapshot(), a.readers)
        tracemalloc.stop()
    where = "each from its own position" if a.spread else "from the start"
    where += f", {a.stagger_ms:g} ms apart" if a.stagger_ms else ""
    print(f"{a.readers} stalled readers ({where}) of a {a.event_kb} KB stream.start + {a.deltas} deltas: "
          f"RSS {before / 2**20:.0f} -> {held / 2**20:.0f} MB, {(held - before) / a.readers / 1024:.0f} KB per reader")
    proc.stdin.close()
    await proc.wait()
    after = await _settle(me, 1.0)
    print(f"after they left: RSS {after / 2**20:.0f} MB")
    await runner.cleanup()
    await client.delete(keys.events(sid), keys.meta(sid))
    await client.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--redis-port", type=int, required=True)
    ap.add_argument("--readers", type=int, default=300)
    ap.add_argument("--event-kb", type=int, default=1024)
    ap.add_argument("--deltas", type=int, default=2000)
    ap.add_argument("--settle-s", type=float, default=3.0)
    ap.add_argument("--spread", action="store_true", help="reader i resumes after seq i: no shared reads")
    ap.add_argument("--stagger-ms", type=float, default=0.0, help="pause between two connections")
    ap.add_argument("--trace", action="store_true", help="also print the Python memory held per reader, by line")
    asyncio.run(main(ap.parse_args()))
