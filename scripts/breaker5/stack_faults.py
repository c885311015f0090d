"""Redis faults under the real stack (upstream, 2 workers, publisher) with live SSE readers. Not run by CI.

Usage: .venv/bin/python -m scripts.breaker5.stack_faults MODE [streams] [readers_per_stream]
MODE: stop (SIGSTOP 3 s) | kill (CLIENT KILL TYPE normal + pubsub, 5x) | restart-keep (kill -9, AOF always,
restart) | restart-lose (kill -9, restart empty) | none.
Each reader follows its stream with Last-Event-ID resume; it must end with seq 1..last exactly once, in order,
the last a terminal event (or, after restart-lose, a 404/410). Tracebacks in any log are findings.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys

import aiohttp

from publisher.stack import LocalStack

MODE = sys.argv[1]
STREAMS = int(sys.argv[2]) if len(sys.argv) > 2 else 6
READERS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
from scripts.breaker5.stack_harness import Server, follow, pick_cases, report, run, wait_ready


async def main() -> None:
    server = Server()
    server.start(keep=MODE == "restart-keep")
    cases = pick_cases()
    env = {"FANOUT_HEARTBEAT_S": "2", "FANOUT_REDIS_TIMEOUT_S": "1", "FANOUT_LEASE_S": "5",
           "FANOUT_LOG_LEVEL": "INFO"}
    with LocalStack(server.url, workers=2, slow_delay_ms=int(os.environ.get("B5_DELAY", "600")), env=env) as stack:
        stack.keep_logs = True
        base = stack.base_url
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, base)
            subs = []
            for i in range(STREAMS):
                provider, case = cases[i % len(cases)]
                body = {"provider": provider, "model": f"slow-{case}",
                        "request": {"max_tokens": 100, "messages": [{"role": "user", "content": "hi"}],
                                    "contents": [], "input": "hi"}}
                if provider == "gemini":
                    body["request"] = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
                elif provider == "openai_responses":
                    body["request"] = {"input": "hi"}
                elif provider == "openai_chat":
                    body["request"] = {"messages": [{"role": "user", "content": "hi"}]}
                async with http.post(f"{base}/v1/streams", json=body,
                                     headers={"Authorization": f"Bearer {stack.api_key}"}) as r:
                    sub = await r.json()
                    assert r.status == 201, sub
                    subs.append((sub["stream_id"], sub["token"], f"{provider}/{case}"))
            result: dict[str, tuple] = {}
            tasks = [asyncio.create_task(follow(http, base, sid, tok, result, f"{sid}#{n} {name}"))
                     for sid, tok, name in subs for n in range(READERS)]
            await asyncio.sleep(2.5)
            print("fault:", MODE, flush=True)
            if MODE == "stop":
                os.kill(server.proc.pid, signal.SIGSTOP)
                await asyncio.sleep(3)
                os.kill(server.proc.pid, signal.SIGCONT)
            elif MODE == "kill":
                for _ in range(5):
                    server.cli("CLIENT", "KILL", "TYPE", "normal")
                    server.cli("CLIENT", "KILL", "TYPE", "pubsub")
                    await asyncio.sleep(0.7)
            elif MODE in ("restart-keep", "restart-lose"):
                server.kill9()
                await asyncio.sleep(1.5)
                server.start(keep=MODE == "restart-keep")
            try:
                await asyncio.gather(*tasks)
            finally:
                if server.proc is not None and server.proc.poll() is None:
                    os.kill(server.proc.pid, signal.SIGCONT)
            failures = 0
            for tag, (seqs, terminal, notes) in sorted(result.items()):
                ok = seqs == list(range(1, len(seqs) + 1)) and terminal is not None
                lost_ok = MODE == "restart-lose" and any(n.startswith(("404", "410")) for n in notes) \
                    and seqs == list(range(1, len(seqs) + 1))
                if not (ok or lost_ok):
                    failures += 1
                print(("OK  " if ok or lost_ok else "BAD ") + tag, len(seqs), terminal, notes[:8])
        report(stack, ["publisher", "worker-1", "worker-2", "upstream"], failures)
    server.kill9()


run(main)
