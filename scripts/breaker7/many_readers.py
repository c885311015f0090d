"""Many readers of each stream dropping and resuming (two publishers), under Redis faults. Not run by CI.

Usage: .venv/bin/python -m scripts.breaker7.run_in_range scripts.breaker7.many_readers MODE [streams] [readers]
MODE: none | restart-keep (kill -9, AOF always) | restart-lose | kill (CLIENT KILL normal+pubsub, repeated) | stop (SIGSTOP B7_STOP_S=3 s, twice) | mix (both).
Each reader drops its connection after a random number of events (often mid-write, by closing the
socket), resumes with Last-Event-ID (header or query, at one of two publishers), and must end with
seq 1..last exactly once, in order, each event byte-equal to the stored one, the last a terminal.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time

import aiohttp
import redis

from publisher.stack import LocalStack, free_port, wait_for_port
from scripts.breaker5.stack_harness import Server, pick_cases, report, run, sse_frames, wait_ready

MODE = sys.argv[1] if len(sys.argv) > 1 else "none"
STREAMS = int(sys.argv[2]) if len(sys.argv) > 2 else 6
READERS = int(sys.argv[3]) if len(sys.argv) > 3 else 20


def body_for(provider: str, case: str) -> dict:
    req: dict = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
    if provider == "gemini":
        req = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    elif provider == "openai_responses":
        req = {"input": "hi"}
    elif provider == "openai_chat":
        req = {"messages": [{"role": "user", "content": "hi"}]}
    return {"provider": provider, "model": f"slow-{case}", "request": req}


async def follow(http: aiohttp.ClientSession, bases: list[str], sid: str, tok: str, rng: random.Random) -> dict:
    pos, got, notes, terminal = 0, [], [], None
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and terminal is None:
        base = rng.choice(bases)
        headers = {"Authorization": f"Bearer {tok}"}
        url = f"{base}/v1/streams/{sid}/events"
        if pos:
            if rng.random() < 0.5:
                headers["Last-Event-ID"] = str(pos)
            else:
                url += f"?last_event_id={pos}"
        drop_after = rng.choice([1, 1, 2, 3, 5, 100000])
        n = 0
        try:
            async with http.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=None, sock_read=15)) as resp:
                if resp.status != 200:
                    notes.append(f"{resp.status}")
                    if resp.status in (204, 404, 410):
                        notes.append((await resp.text())[:120])
                        break
                    await asyncio.sleep(0.2)
                    continue
                async for event, ident, data in sse_frames(resp):
                    if event == "stream.gap":
                        notes.append("gap:" + data[:100])
                    elif ident is not None:
                        got.append((int(ident), data))
                        pos = int(ident)
                        n += 1
                        if json.loads(data).get("type") in ("stream.done", "stream.error"):
                            terminal = json.loads(data)["type"]
                            break
                        if n >= drop_after:
                            break  # leaves the block: the connection is closed mid-stream
                    else:
                        notes.append(f"{event}:{data[:80]}")
                if terminal is None and n < drop_after:
                    notes.append(f"ended@{pos}")
        except (TimeoutError, aiohttp.ClientError) as exc:
            notes.append(type(exc).__name__)
            await asyncio.sleep(0.2)
    return {"got": got, "terminal": terminal, "notes": notes}


async def faults(server: Server, stop: asyncio.Event) -> None:
    await asyncio.sleep(2.0)
    rounds = 0
    while not stop.is_set() and rounds < 6:
        rounds += 1
        if MODE in ("kill", "mix"):
            server.cli("CLIENT", "KILL", "TYPE", "pubsub")
            server.cli("CLIENT", "KILL", "TYPE", "normal")
        if MODE in ("stop", "mix") and rounds in (2, 5):
            os.kill(server.proc.pid, signal.SIGSTOP)
            await asyncio.sleep(float(os.environ.get("B7_STOP_S", "3")))
            os.kill(server.proc.pid, signal.SIGCONT)
        if MODE in ("restart-keep", "restart-lose") and rounds == 2:
            server.kill9()
            await asyncio.sleep(1.5)
            server.start(keep=MODE == "restart-keep")
        await asyncio.sleep(1.3)


async def main() -> None:
    server = Server()
    server.start(keep=MODE == "restart-keep")
    cases = pick_cases()
    env = {"FANOUT_HEARTBEAT_S": "2", "FANOUT_REDIS_TIMEOUT_S": "1", "FANOUT_LEASE_S": "5",
           "FANOUT_LOG_LEVEL": "INFO", "FANOUT_CLIENT_QUEUE": "4"}
    with LocalStack(server.url, workers=2, slow_delay_ms=int(os.environ.get("B7_DELAY", "400")), env=env) as stack:
        stack.keep_logs = True
        port2 = free_port()
        stack_env = stack.env()
        stack._spawn("publisher-2", [sys.executable, "-m", "fanout_cli", "publisher", "--host", "127.0.0.1",
                                     "--port", str(port2)], stack_env)
        wait_for_port(port2)
        bases = [stack.base_url, f"http://127.0.0.1:{port2}"]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            for base in bases:
                await wait_ready(http, base)
            subs = []
            for i in range(STREAMS):
                provider, case = cases[i % len(cases)]
                async with http.post(f"{bases[0]}/v1/streams", json=body_for(provider, case),
                                     headers={"Authorization": f"Bearer {stack.api_key}"}) as r:
                    sub = await r.json()
                    assert r.status == 201, sub
                    subs.append((sub["stream_id"], sub["token"], f"{provider}/{case}"))
            rng = random.Random(int(os.environ.get("B7_SEED", "7")))
            stop = asyncio.Event()
            fault = asyncio.create_task(faults(server, stop))
            tasks = {(sid, n): asyncio.create_task(follow(http, bases, sid, tok, random.Random(rng.random())))
                     for sid, tok, _ in subs for n in range(READERS)}
            results = dict(zip(tasks, await asyncio.gather(*tasks.values()), strict=True))
            stop.set()
            await fault
        client = redis.Redis.from_url(server.url)
        failures = 0
        for (sid, n), res in sorted(results.items()):
            stored = {int(eid.decode().split("-")[1]): f[b"e"].decode()
                      for eid, f in client.xrange(f"{stack.prefix}:{{{sid}}}:events")}
            seqs = [s for s, _ in res["got"]]
            ok = seqs == list(range(1, len(seqs) + 1)) and res["terminal"] is not None \
                and all(stored.get(s) == d for s, d in res["got"])
            explicit = any(x.startswith(("gap:", "404", "410")) for x in res["notes"]) \
                and seqs == list(range(1, len(seqs) + 1))
            if not (ok or explicit):
                failures += 1
                print("BAD", sid, n, seqs[:40], res["terminal"], res["notes"][:12])
        print(f"{len(results)} readers, explicit-loss {sum(1 for r in results.values() if r['terminal'] is None)}")
        report(stack, ["publisher", "publisher-2", "worker-1", "worker-2", "upstream"], failures)
    server.kill9()


run(main)
