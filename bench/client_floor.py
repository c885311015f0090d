"""The reference client's floor: the `one` row served by an edge that does almost nothing.

`one` (1 stream x 1,000 readers, 100 events/s) measures publish-to-receipt latency as
seen by the reference client of ``fanout_bench.py``: 1,000 aiohttp coroutines in one
Python process. On a slow VM that client, not the edge, sets the figure: it visits each
socket once per pass of its event loop, so an event waits for the rest of the pass it
arrived in and then for its own socket's turn in the next one.

This script measures that floor. Run as ``client_floor.py publisher --host H --port P``
it is a *floor edge* that speaks just enough of the product's HTTP surface for
``fanout_bench.py --edge product`` (``/readyz``, ``GET /v1/streams/{id}/events``): it
replays the stored events, subscribes the stream's live channel, and for each
notification reads the new entries with one ``XRANGE`` and writes them, framed once, to
every reader's transport in one loop (no auth, no limits, no heartbeats, no resume, no
projection; not a server anyone should run). Run as
``client_floor.py run --redis-port P [--runs N]`` it runs the `one` row with the
reference benchmark for the floor edge and for the product, alternating, and prints both:
when the floor edge's p99 is above the goal too, the goal is out of this machine's reach
for that client.

    .venv/bin/python bench/client_floor.py run --redis-port 46379 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import uvloop

ONE = ["--clients", "1000", "--streams", "1", "--events", "500", "--rate", "100"]
"""The `one` row's arguments, as ``edge_check.py`` passes them."""


def _frame(entry_id: bytes, data: bytes) -> bytes:
    """One SSE message as one HTTP/1.1 chunk (the product's framing for HTTP/1.1 clients)."""
    body = b"id: %s\nevent: e\ndata: %s\n\n" % (entry_id.split(b"-")[-1], data)
    return b"%x\r\n%s\r\n" % (len(body), body)


class _Edge:
    """The floor edge's state: readers per stream id, last entry id written per stream id."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis, self.prefix = redis, prefix
        self.readers: dict[str, list[asyncio.Transport]] = {}
        self.last: dict[str, bytes] = {}

    def events_key(self, stream_id: str) -> str:
        return f"{self.prefix}:{{{stream_id}}}:events"

    async def open(self, transport: asyncio.Transport, stream_id: str) -> None:
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n")
        entries = await self.redis.xrange(self.events_key(stream_id))
        top = self.last.setdefault(stream_id, entries[-1][0] if entries else b"0-0")
        top_seq = int(top.split(b"-")[-1])
        replay = [(eid, fields) for eid, fields in entries if int(eid.split(b"-")[-1]) <= top_seq]
        transport.write(b"".join(_frame(eid, fields[b"e"]) for eid, fields in replay))
        self.readers.setdefault(stream_id, []).append(transport)

    async def tail(self) -> None:
        pubsub = self.redis.pubsub()
        await pubsub.psubscribe(f"{self.prefix}:*:live")
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is None or message["type"] != "pmessage":
                continue
            stream_id = message["channel"].decode().split("{", 1)[1].split("}", 1)[0]
            after = self.last.get(stream_id, b"0-0")
            entries = await self.redis.xrange(self.events_key(stream_id), b"(" + after, "+")
            if not entries:
                continue
            self.last[stream_id] = entries[-1][0]
            data = b"".join(_frame(eid, fields[b"e"]) for eid, fields in entries)
            for transport in self.readers.get(stream_id, []):
                transport.write(data)


class _Http(asyncio.Protocol):
    """Reads one request head; answers ``/readyz`` or starts an SSE response."""

    def __init__(self, edge: _Edge) -> None:
        self.edge = edge
        self.head = b""
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.task is not None or self.transport is None:
            return
        self.head += data
        if b"\r\n\r\n" not in self.head:
            return
        path = self.head.split(b" ", 2)[1].decode()
        if path.startswith("/readyz"):
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            self.transport.close()
            return
        self.task = asyncio.ensure_future(self.edge.open(self.transport, path.split("/")[3]))

    def connection_lost(self, exc: Exception | None) -> None:
        for transports in self.edge.readers.values():
            if self.transport in transports:
                transports.remove(self.transport)


def serve(host: str, port: int) -> None:
    """Run the floor edge on ``host:port`` against ``REDIS_URL`` under ``FANOUT_REDIS_PREFIX`` until killed."""
    async def main() -> None:
        pool = aioredis.BlockingConnectionPool.from_url(os.environ["REDIS_URL"], max_connections=50, timeout=60)
        edge = _Edge(aioredis.Redis(connection_pool=pool), os.environ["FANOUT_REDIS_PREFIX"])
        loop = asyncio.get_running_loop()
        await loop.create_server(lambda: _Http(edge), host, port, backlog=4096)
        await edge.tail()

    uvloop.run(main())


def _one(ref: Path, fanout_bin: str, port: int) -> dict[str, Any]:
    """Run the reference `one` row once against ``fanout_bin``; return its figures."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "one.json"
        subprocess.run([sys.executable, str(ref / "fanout_bench.py"), "--edge", "product", "--fanout-bin", fanout_bin,
                        "--redis-port", str(port), "--runs", "1", "--json-out", str(out), *ONE],
                       capture_output=True, text=True, timeout=900, check=False)
        if not out.exists():
            return {"error": "fanout_bench.py wrote no result"}
        run: dict[str, Any] = next(iter(json.loads(out.read_text())["runs"].values()))[0]
        return run


def compare(ref: Path, product_bin: str, port: int, runs: int) -> None:
    """Alternate the floor edge and the product on the `one` row; print one line per run and a summary."""
    floor_bin = Path(tempfile.gettempdir()) / f"fanout-floor-edge-{os.getpid()}"
    floor_bin.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} \"$@\"\n")
    floor_bin.chmod(0o755)
    figures: dict[str, list[float]] = {"floor": [], "product": []}
    try:
        for index in range(runs):
            for name, binary in (("floor", str(floor_bin)), ("product", product_bin)):
                run = _one(ref, binary, port)
                if "error" in run:
                    print(f"run {index + 1} {name}: {run['error']}")
                    continue
                figures[name].append(run["lat_p99_ms"])
                print(f"run {index + 1} {name:7s}: p50 {run['lat_p50_ms']:6.1f} ms  p99 {run['lat_p99_ms']:6.1f} ms  "
                      f"edge CPU {run['edge_cpu_pct']:3.0f}%  client CPU {run['clients_cpu_pct']:3.0f}%  "
                      f"complete {run['complete_fraction']:.3f}", flush=True)
    finally:
        with contextlib.suppress(OSError):
            floor_bin.unlink()
    for name, values in figures.items():
        if values:
            print(f"{name}: p99 {min(values):.1f}-{max(values):.1f} ms over {len(values)} runs")


def main() -> None:
    """Parse the command line: ``publisher --host H --port P`` (the floor edge) or ``run`` (the comparison)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    edge = sub.add_parser("publisher", help="serve as the floor edge (fanout_bench.py starts it)")
    edge.add_argument("--host", default="127.0.0.1")
    edge.add_argument("--port", type=int, required=True)
    run = sub.add_parser("run", help="alternate the floor edge and the product on the `one` row")
    run.add_argument("--redis-port", type=int, required=True, help="a private Redis: the benchmark writes to it")
    run.add_argument("--runs", type=int, default=3)
    run.add_argument("--ref", type=Path, default=Path("/work/shared/bench"), help="where fanout_bench.py is")
    run.add_argument("--fanout", default=str(Path(sys.executable).with_name("fanout")), help="the product's CLI")
    args = parser.parse_args()
    if args.command == "publisher":
        serve(args.host, args.port)
    else:
        compare(args.ref, args.fanout, args.redis_port, args.runs)


if __name__ == "__main__":
    main()
