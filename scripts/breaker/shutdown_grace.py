"""SIGTERM of a real `fanout publisher` under FANOUT_SHUTDOWN_WINDOW_S / FANOUT_SHUTDOWN_GRACE_S.

Per scenario: a private redis-server, a stored big stream (a stalled client mid-replay), a
live stream with readers, a submission whose body trickles in (in flight), then SIGTERM;
reports exit code, seconds to exit against window + grace, and log lines with a traceback
or ERROR. Run: `.venv/bin/python -m scripts.breaker.shutdown_grace [scenario ...]`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys

import redis.asyncio as aioredis

from schema.keys import Keys
from scripts.breaker.ra_harness import (
    API_KEY,
    PrivateRedis,
    Publisher,
    StallClient,
    append_live,
    new_sid,
    scan_log,
    store_stream,
)

PREFIX = "brk2sd"
BODY = json.dumps({"provider": "openai_chat", "model": "m", "request": {"messages": [
    {"role": "user", "content": "hi"}]}}).encode()


async def trickle_post(port: int) -> socket.socket:
    """A POST /v1/streams whose body is half sent: the handler waits in the body read."""
    sock = socket.create_connection(("127.0.0.1", port))
    head = (f"POST /v1/streams HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n").encode()
    sock.sendall(head + BODY[:10])
    return sock


async def scenario(name: str, window: str, grace: str, *, stalled: int, live: int, post: bool,
                   extra: dict[str, str] | None = None, freeze: bool = False) -> list[str]:
    failures: list[str] = []
    redis = PrivateRedis()
    redis.start()
    client = aioredis.from_url(redis.url)
    keys = Keys(PREFIX)
    pub = Publisher(redis.url, PREFIX, FANOUT_SHUTDOWN_WINDOW_S=window, FANOUT_SHUTDOWN_GRACE_S=grace,
                    FANOUT_WRITE_TIMEOUT_S="60", **(extra or {}))
    socks: list[socket.socket] = []
    clients: list[StallClient] = []
    try:
        big = await store_stream(client, keys, new_sid(), 240, big=230, big_bytes=48_000)
        livesid = new_sid()
        await store_stream(client, keys, livesid, 5)
        await pub.astart()
        for _ in range(stalled):
            c = StallClient(pub.port, big.sid)
            await c.connect()
            await c.read_until(lambda c: c.got.status != 0, 10)
            clients.append(c)  # never read again
        readers = []
        for _ in range(live):
            c = StallClient(pub.port, livesid, rcvbuf=1 << 20)
            await c.connect()
            await c.read_until(lambda c: len(c.got.ids) >= 4, 10)
            readers.append(c)
        await append_live(client, keys, livesid, 6, 3)
        if post:
            socks.append(await trickle_post(pub.port))
        await asyncio.sleep(0.5)
        if freeze:
            assert redis.proc is not None
            redis.proc.send_signal(19)  # SIGSTOP
        tasks = [asyncio.create_task(r.read_to_end(200)) for r in readers]
        proc = pub.proc
        assert proc is not None
        took = await pub.astop(guard_s=120)
        if freeze and redis.proc is not None:
            redis.proc.send_signal(18)
        bound = float(window) + float(grace) + 3.0
        rc = "killed" if took is None else f"exit {proc.returncode}"
        print(f"[{name}] window={window} grace={grace} {rc} after {took if took is None else round(took, 2)}s "
              f"(bound {bound:.1f}s)")
        if took is None or took > bound or proc.returncode != 0:
            failures.append(f"{name}: exit after {took}s, bound {bound}s ({rc})")
        for t in tasks:
            t.cancel()
        text = pub.logtext()
        for line in scan_log(text):
            failures.append(f"{name}: {line}")
        if "stopped" not in text.splitlines()[-1] if text else True:
            failures.append(f"{name}: last log line not 'stopped': {text.splitlines()[-3:]}")
    finally:
        for c in clients:
            c.close()
        for s in socks:
            s.close()
        if pub.proc is not None:
            pub.proc.kill()
        if redis.proc is not None:
            redis.proc.send_signal(18)
        await client.aclose()
        redis.stop()
    return failures


SCENARIOS = {
    "base": dict(window="1", grace="1", stalled=1, live=3, post=True),
    "grace0_stalled": dict(window="0.5", grace="0", stalled=1, live=0, post=False),
    "grace0_post": dict(window="0.5", grace="0", stalled=0, live=0, post=True),
    "grace3_stalled": dict(window="0", grace="3", stalled=1, live=0, post=False),
    "grace3_post": dict(window="0", grace="3", stalled=0, live=0, post=True),
    "window0": dict(window="0", grace="1", stalled=1, live=3, post=True),
    "both0": dict(window="0", grace="0", stalled=0, live=3, post=False),
    "huge_window_readers_gone": dict(window="100000", grace="1", stalled=0, live=0, post=False),
    "huge_grace_nothing": dict(window="0", grace="1e12", stalled=0, live=3, post=False),
    "huge_grace_stalled": dict(window="0", grace="1e12", stalled=1, live=0, post=False),
    "inf_grace_idle": dict(window="0", grace="inf", stalled=0, live=0, post=False),
    "frozen_redis": dict(window="1", grace="1", stalled=0, live=3, post=False, freeze=True,
                         extra={"FANOUT_REDIS_TIMEOUT_S": "1"}),
}


async def main(names: list[str]) -> int:
    failures: list[str] = []
    for name in names or list(SCENARIOS):
        failures += await scenario(name, **SCENARIOS[name])  # type: ignore[arg-type]
    for f in failures:
        print("FAIL", f)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
