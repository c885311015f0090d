"""Memory of non-reading SSE readers: N sockets that send the request and never read, each at its own position.

Prints the publisher's RSS before and after (its /proc status), per reader. Usage:
`.venv/bin/python -m scripts.breaker.slow_readers <readers> <events> [same|spread] [FANOUT_X=..]`.
"""

from __future__ import annotations

import asyncio
import random
import socket
import sys
import time

import redis.asyncio as aioredis

from schema.keys import Keys
from scripts.breaker.harness import API_KEY, PREFIX, Publisher, Redis, Worker, make_stream


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def main(readers: int, events: int, how: str, env: dict[str, str]) -> None:
    redis = Redis()
    redis.start()
    pub = Publisher(redis.url, FANOUT_MAX_CONNECTIONS="100000", FANOUT_MAX_SOCKETS="100000", **env)
    pub.start()
    client = aioredis.from_url(redis.url)
    worker = Worker(client, Keys(PREFIX))
    rng = random.Random(3)
    s = make_stream("st_slow", 1, rng, deltas=0)
    body = s.events[:-1]
    from tests.publisher.helpers import delta
    from schema.contract import encode_event
    evs = [*body, *(encode_event(delta(s.sid, 3 + i, 0, "z" * 150)) for i in range(events))]
    await worker.meta(s.sid)
    for i in range(0, len(evs), 5000):
        await worker.write(s.sid, i + 1, evs[i:i + 5000], terminal=False, live_max=0)
    assert pub.proc is not None
    time.sleep(1)
    before = rss_mb(pub.proc.pid)
    socks = []
    for k in range(readers):
        position = 0 if how == "same" else rng.randint(0, len(evs) - 20000)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", pub.port))
        sock.sendall(f"GET /v1/streams/{s.sid}/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
                     f"Last-Event-ID: {position}\r\n\r\n".encode())
        socks.append(sock)
    await asyncio.sleep(8)
    after = rss_mb(pub.proc.pid)
    print(f"{readers} non-reading readers ({how}) of {len(evs)} events: RSS {before:.0f} -> {after:.0f} MB, "
          f"{(after - before) * 1024 / readers:.0f} KiB per reader")
    for sock in socks:
        sock.close()
    await client.aclose()
    pub.stop()
    redis.kill()


if __name__ == "__main__":
    env = dict(arg.split("=", 1) for arg in sys.argv[4:])
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "spread", env))
