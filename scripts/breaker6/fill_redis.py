"""Fill a private Redis (small maxmemory) while streams run under the real stack. Not run by CI.

Usage: .venv/bin/python -m scripts.breaker6.fill_redis POLICY [streams] [readers] [hold_s]
POLICY: noeviction | allkeys-lru. The filler writes 256 KB strings under 'fill:' until Redis
refuses (noeviction) or for a while (allkeys-lru), submits during the fill, holds it hold_s,
then (noeviction) deletes the filler and submits again. Each reader must end with seq 1..last
once, in order, with a terminal event, or an explicit stream.gap / 404 / 410. Under noeviction,
every event stored before the fill must still be stored afterwards.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import aiohttp
import redis

from publisher.stack import LocalStack
from scripts.breaker5.stack_harness import Server, follow, pick_cases, report, run, wait_ready

POLICY = sys.argv[1]
STREAMS = int(sys.argv[2]) if len(sys.argv) > 2 else 8
READERS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
HOLD_S = float(sys.argv[4]) if len(sys.argv) > 4 else 8


def body_for(provider: str, case: str) -> dict:
    request: dict = {"max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    if provider == "gemini":
        request = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    elif provider == "openai_responses":
        request = {"input": "hi"}
    elif provider == "openai_chat":
        request = {"messages": [{"role": "user", "content": "hi"}]}
    return {"provider": provider, "model": f"slow-{case}", "request": request}


async def submit(http, base, key, body):
    async with http.post(f"{base}/v1/streams", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        text = await r.text()
        return r.status, r.headers.get("Content-Type", ""), text


def snapshot(r: redis.Redis) -> dict[bytes, list]:
    out = {}
    for key in r.scan_iter(match=b"*:events", count=1000):
        out[key] = r.xrange(key)
    return out


async def main() -> None:
    server = Server()
    server.start(keep=False)
    server.cli("CONFIG", "SET", "maxmemory", os.environ.get("B6_MAXMEM", "20mb"))
    server.cli("CONFIG", "SET", "maxmemory-policy", POLICY)
    r = redis.Redis(port=server.port)
    cases = pick_cases()
    env = {"FANOUT_HEARTBEAT_S": "2", "FANOUT_REDIS_TIMEOUT_S": "1", "FANOUT_LEASE_S": "6",
           "FANOUT_APPEND_RETRY_S": os.environ.get("B6_RETRY_S", "4"), "FANOUT_LOG_LEVEL": "INFO"}
    with LocalStack(server.url, workers=2, slow_delay_ms=int(os.environ.get("B6_DELAY", "500")), env=env) as stack:
        stack.keep_logs = True
        base = stack.base_url
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, base)
            subs = []
            for i in range(STREAMS):
                provider, case = cases[i % len(cases)]
                status, ctype, text = await submit(http, base, stack.api_key, body_for(provider, case))
                assert status == 201, text
                sub = json.loads(text)
                subs.append((sub["stream_id"], sub["token"], f"{provider}/{case}"))
            result: dict[str, tuple] = {}
            tasks = [asyncio.create_task(follow(http, base, sid, tok, result, f"{sid}#{n} {name}"))
                     for sid, tok, name in subs for n in range(READERS)]
            await asyncio.sleep(2.0)
            before = snapshot(r)
            print("fill:", POLICY, "used", r.info("memory")["used_memory_human"], flush=True)
            blob = b"x" * (256 * 1024)
            n = 0
            refused = None
            t0 = time.monotonic()
            for size in (256 * 1024, 16 * 1024, 1024, 64):
                piece = b"x" * size
                while time.monotonic() - t0 < 8:
                    try:
                        r.set(f"fill:{n}", piece)
                        n += 1
                    except redis.ResponseError as exc:
                        refused = str(exc)
                        break
                    if POLICY != "noeviction" and size > 1024:
                        await asyncio.sleep(0.002)
            if POLICY == "noeviction" and os.environ.get("B6_PIN", "1") == "1":
                used = r.info("memory")["used_memory"]
                server.cli("CONFIG", "SET", "maxmemory", str(used - 2 * 1024 * 1024))  # hard OOM: every write refused
            print("filled", n, "refused:", refused, "used", r.info("memory")["used_memory_human"], flush=True)
            submits = []
            for i in range(3):
                provider, case = cases[i % len(cases)]
                submits.append(await submit(http, base, stack.api_key, body_for(provider, case)))
            for s in submits:
                print("submit during fill:", s[0], s[1], s[2][:300])
            async with http.get(f"{base}/readyz") as resp:
                print("readyz during fill:", resp.status, (await resp.text())[:300])
            # keep memory pinned (allkeys-lru: keep writing so eviction keeps hitting)
            t1 = time.monotonic()
            while time.monotonic() - t1 < HOLD_S:
                try:
                    r.set(f"fill:{n}", blob if POLICY != "noeviction" else b"y" * 64)
                    n += 1
                except redis.ResponseError as exc:
                    if POLICY != "noeviction":
                        print("lru refused", exc)
                await asyncio.sleep(0.02)
            print("errorstats during hold:", r.info("errorstats"), flush=True)
            if POLICY == "noeviction":
                after = snapshot(r)
                lost = []
                for key, entries in before.items():
                    now = dict(after.get(key, []))
                    for eid, fields in entries:
                        if now.get(eid) != fields:
                            lost.append((key, eid))
                print("stored-before entries lost:", len(lost), lost[:5])
                for key in r.scan_iter(match=b"fill:*", count=1000):
                    r.delete(key)
                print("freed; used", r.info("memory")["used_memory_human"], flush=True)
                for i in range(2):
                    provider, case = cases[i % len(cases)]
                    st, ct, tx = await submit(http, base, stack.api_key, body_for(provider, case))
                    print("submit after free:", st, tx[:120])
                    if st == 201:
                        sub = json.loads(tx)
                        tasks.append(asyncio.create_task(
                            follow(http, base, sub["stream_id"], sub["token"], result, f"{sub['stream_id']}#after")))
            await asyncio.gather(*tasks)
            failures = 0
            for tag, (seqs, terminal, notes) in sorted(result.items()):
                inorder = seqs == list(range(1, len(seqs) + 1))
                ok = inorder and terminal is not None
                explicit = inorder and any(x.startswith(("404", "410", "stream.gap")) for x in notes)
                if not (ok or explicit):
                    failures += 1
                print(("OK  " if ok else "EXPL" if explicit else "BAD ") + tag, len(seqs), terminal, notes[:8])
            for sid, tok, name in subs:
                async with http.get(f"{base}/v1/streams/{sid}", headers={"Authorization": f"Bearer {tok}"}) as resp:
                    js = await resp.json()
                    print("status", sid, resp.status, js.get("state"), js.get("status"), js.get("last_seq"),
                          (js.get("result") or {}).get("status"), ((js.get("result") or {}).get("error") or {}).get("message", "")[:80])
            print("errorstats end:", r.info("errorstats"), "evicted", r.info("stats")["evicted_keys"])
        report(stack, ["publisher", "worker-1", "worker-2", "upstream"], failures)
    server.kill9()


run(main)
