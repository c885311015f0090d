"""FANOUT_REDIS_TIMEOUT_S against a frozen (SIGSTOP) private redis-server.

A real `fanout publisher`; resuming SSE readers (live and mid-replay) follow streams while
Redis is frozen and thawed; during the freeze, a new SSE request, a status read, a
submission and /readyz are made and their answers and durations reported. After the thaw
the streams grow and end; every reader must hold exactly seqs 1..N (no loss, no duplicate).
The log must hold no traceback and no ERROR.

Run: `.venv/bin/python -m scripts.breaker.redis_freeze [timeout_s] [freeze_s]`.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time

import aiohttp
import redis.asyncio as aioredis

from schema.keys import Keys
from scripts.breaker.ra_harness import (
    API_KEY,
    PrivateRedis,
    Publisher,
    append_live,
    check_exact,
    new_sid,
    scan_log,
    store_stream,
)

PREFIX = "brk2fz"
BODY = {"provider": "openai_chat", "model": "m", "request": {"messages": [{"role": "user", "content": "hi"}]}}


class Follower:
    """Follows one stream to its end, resuming with Last-Event-ID after every end of a response."""

    def __init__(self, base: str, sid: str, last: int, slow_s: float = 0.0) -> None:
        self.base, self.sid, self.last, self.slow_s = base, sid, last, slow_s
        self.ids: list[int] = []
        self.responses: list[str] = []
        self.done = False

    async def run(self, http: aiohttp.ClientSession) -> None:
        while not self.done:
            headers = {"Authorization": f"Bearer {API_KEY}"}
            if self.ids:
                headers["Last-Event-ID"] = str(self.ids[-1])
            try:
                async with http.get(f"{self.base}/v1/streams/{self.sid}/events", headers=headers) as resp:
                    if resp.status == 204:
                        self.responses.append("204")
                        self.done = True
                        return
                    buf = b""
                    n = 0
                    while True:
                        try:
                            chunk = await resp.content.readany()
                        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
                            self.responses.append(f"{resp.status} cut {type(exc).__name__}")
                            break
                        if not chunk:
                            self.responses.append(f"{resp.status} end ids={n} {buf[-60:]!r}")
                            break
                        buf += chunk
                        *msgs, buf = buf.split(b"\n\n")
                        for m in msgs:
                            for line in m.split(b"\n"):
                                if line.startswith(b"id: "):
                                    self.ids.append(int(line[4:]))
                                    n += 1
                                if line.startswith(b"data: ") and b'"stream.end"' in line:
                                    self.done = True
                        if self.slow_s:
                            await asyncio.sleep(self.slow_s)
            except aiohttp.ClientError as exc:
                self.responses.append(f"connect {type(exc).__name__}")
            if not self.done:
                await asyncio.sleep(0.3)


async def timed(coro: object) -> str:
    began = time.monotonic()
    try:
        out = await asyncio.wait_for(coro, 120)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - reported
        out = f"raised {type(exc).__name__}: {exc}"
    return f"{out} in {time.monotonic() - began:.2f}s"


async def main(timeout_s: str, freeze_s: float) -> int:
    failures: list[str] = []
    redis = PrivateRedis()
    redis.start()
    assert redis.proc is not None
    client = aioredis.from_url(redis.url)
    keys = Keys(PREFIX)
    pub = Publisher(redis.url, PREFIX, FANOUT_REDIS_TIMEOUT_S=timeout_s, FANOUT_HEARTBEAT_S="2")
    try:
        live_sid, big_sid = new_sid(), new_sid()
        await store_stream(client, keys, live_sid, 5)
        await store_stream(client, keys, big_sid, 3000, small_text="p" * 2000)
        await pub.astart()
        async with aiohttp.ClientSession() as http:
            live = [Follower(pub.base, live_sid, 0) for _ in range(4)]
            replay = [Follower(pub.base, big_sid, 0, slow_s=0.05) for _ in range(2)]
            tasks = [asyncio.create_task(f.run(http)) for f in live + replay]
            await asyncio.sleep(1.0)
            print("replay progress before freeze:", [len(f.ids) for f in replay])
            redis.proc.send_signal(signal.SIGSTOP)
            frozen_at = time.monotonic()
            auth = {"Authorization": f"Bearer {API_KEY}"}

            async def get(path: str) -> str:
                async with http.get(pub.base + path, headers=auth) as r:
                    body = await r.read()
                    return f"{r.status} {body[:140]!r}"

            async def post() -> str:
                async with http.post(pub.base + "/v1/streams", headers=auth, json=BODY) as r:
                    return f"{r.status} {(await r.read())[:160]!r}"

            answers = await asyncio.gather(
                timed(get(f"/v1/streams/{live_sid}")), timed(get(f"/v1/streams/{new_sid()}/events")),
                timed(post()), timed(get("/readyz")), timed(get("/healthz")))
            for name, a in zip(["status", "sse-new", "submit", "readyz", "healthz"], answers, strict=True):
                print(f"  frozen {name}: {a}")
                if "Traceback" in a or " 500 " in f" {a}":
                    failures.append(f"frozen {name}: {a}")
            await asyncio.sleep(max(0.0, freeze_s - (time.monotonic() - frozen_at)))
            print("live responses during freeze:", [f.responses[-3:] for f in live])
            redis.proc.send_signal(signal.SIGCONT)
            print(f"thawed after {time.monotonic() - frozen_at:.1f}s")
            await asyncio.sleep(1.0)
            await append_live(client, keys, live_sid, 6, 20)
            await asyncio.sleep(0.5)
            await append_live(client, keys, live_sid, 26, 5, terminal=True)
            await append_live(client, keys, big_sid, 3001, 1, terminal=True)
            try:
                await asyncio.wait_for(asyncio.gather(*tasks), 120)
            except TimeoutError:
                failures.append("followers did not finish in 120 s: " +
                                str([(len(f.ids), f.responses[-3:]) for f in live + replay]))
            for i, f in enumerate(live):
                check_exact(f"live{i}", f.ids, 1, 30, failures)
            for i, f in enumerate(replay):
                check_exact(f"replay{i}", f.ids, 1, 3001, failures)
            print("responses:", [f.responses for f in live + replay])
            async with http.post(pub.base + "/v1/streams", headers=auth, json=BODY) as r:
                print("submit after thaw:", r.status)
                if r.status != 201 and r.status != 200:
                    failures.append(f"submit after thaw {r.status}")
        took = await pub.astop()
        print(f"stopped in {took}s")
        failures += scan_log(pub.logtext())
        print("log warnings:", sorted({ln.split("logger=")[1][:110] for ln in pub.logtext().splitlines()
                                       if "WARNING" in ln}))
    finally:
        redis.proc.send_signal(signal.SIGCONT)
        if pub.proc is not None:
            pub.proc.kill()
        await client.aclose()
        redis.stop()
    for f in failures:
        print("FAIL", f)
    print(f"{len(failures)} failures; log {pub.log.name}")
    return 1 if failures else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(asyncio.run(main(args[0] if args else "1", float(args[1]) if len(args) > 1 else 8.0)))
    _ = json
