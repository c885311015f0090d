"""Shared bits for breaker3 experiments (not run by CI)."""
from __future__ import annotations

import json
import subprocess
import time
from contextlib import contextmanager

import aiohttp
import redis as syncredis

from tests.publisher.helpers import bearer, token_for


@contextmanager
def private_redis(port: int, *extra: str):
    subprocess.run(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                    "--daemonize", "yes", "--pidfile", f"/tmp/breaker3-redis-{port}.pid", *extra], check=True)
    client = syncredis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except Exception:
            time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        try:
            client.shutdown(nosave=True)
        except Exception:
            pass


class Follower:
    """Follows one stream over SSE, recording (seq, receipt ms, event ts)."""

    def __init__(self, base: str, sid: str) -> None:
        self.base, self.sid = base, sid
        self.got: list[tuple[int, float, int]] = []
        self.status: int | None = None
        self.ended = False

    async def run(self, http: aiohttp.ClientSession, last_id: int | None = None) -> None:
        headers = bearer(token_for(self.sid))
        if last_id is not None:
            headers["Last-Event-ID"] = str(last_id)
        async with http.get(f"{self.base}/v1/streams/{self.sid}/events", headers=headers) as resp:
            self.status = resp.status
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n\n" in buf:
                    msg, buf = buf.split(b"\n\n", 1)
                    fields = {}
                    for line in msg.split(b"\n"):
                        k, _, v = line.partition(b":")
                        fields[k] = v.strip()
                    if b"id" in fields and b"data" in fields:
                        ev = json.loads(fields[b"data"])
                        self.got.append((int(fields[b"id"]), time.time() * 1000, ev.get("ts", 0)))
        self.ended = True
