"""Redis faults under the real stack (upstream, 2 workers, publisher) with live SSE readers. Not run by CI.

Usage: .venv/bin/python -m scripts.breaker5.stack_faults MODE [streams] [readers_per_stream]
MODE: stop (SIGSTOP 3 s) | kill (CLIENT KILL TYPE normal + pubsub, 5x) | restart-keep (kill -9, AOF always,
restart) | restart-lose (kill -9, restart empty) | none.
Each reader follows its stream with Last-Event-ID resume; it must end with seq 1..last exactly once, in order,
the last a terminal event (or, after restart-lose, a 404/410). Tracebacks in any log are findings.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import aiohttp

from publisher.stack import LocalStack
from scripts.breaker.harness import free_port

MODE = sys.argv[1]
STREAMS = int(sys.argv[2]) if len(sys.argv) > 2 else 6
READERS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
CASES = [("anthropic", "thinking_with_signature"), ("openai_chat", "simple_text_greek_usage_chunk"),
         ("openai_responses", None), ("gemini", None)]
DIRS = {"gemini": "gemini_sse"}


def pick_cases() -> list[tuple[str, str]]:
    out = []
    for provider, case in CASES:
        if case is None:
            names = sorted(p[:-4] for p in os.listdir(f"transcripts/{DIRS.get(provider, provider)}") if p.endswith(".sse"))
            case = names[0]
        out.append((provider, case))
    return out


SERVERS: list[subprocess.Popen[bytes]] = []


class Server:
    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="b5redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, keep: bool) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always"] if keep else ["--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        SERVERS.append(self.proc)
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.1):
                    return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis did not start")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def cli(self, *args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True).stdout.decode()


async def follow(http, base, sid, tok, result, tag):
    pos, seqs, notes, terminal = 0, [], [], None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        headers = {"Authorization": f"Bearer {tok}"}
        if pos:
            headers["Last-Event-ID"] = str(pos)
        try:
            async with http.get(f"{base}/v1/streams/{sid}/events", headers=headers,
                                timeout=aiohttp.ClientTimeout(total=None, sock_read=20)) as resp:
                if resp.status != 200:
                    notes.append(f"{resp.status}:{(await resp.text())[:100]}")
                    if resp.status == 204:
                        break
                    if resp.status in (404, 410):
                        break
                    await asyncio.sleep(0.3)
                    continue
                event, data, ident = None, [], None
                async for raw in resp.content:
                    line = raw.decode().rstrip("\n")
                    if line == "":
                        if data:
                            if event in ("stream.gap",) or (event or "").startswith("error"):
                                notes.append(f"{event}:{''.join(data)[:80]}")
                            elif ident is not None:
                                payload = json.loads("\n".join(data))
                                seqs.append(int(ident))
                                pos = int(ident)
                                if payload.get("type") in ("stream.done", "stream.error"):
                                    terminal = payload["type"]
                        event, data, ident = None, [], None
                        continue
                    if line.startswith(":"):
                        continue
                    name, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if name == "data":
                        data.append(value)
                    elif name == "id":
                        ident = value
                    elif name == "event":
                        event = value
                    elif name == "busy" or name == "retry":
                        pass
                if terminal:
                    break
                notes.append(f"ended@{pos}")
        except (TimeoutError, aiohttp.ClientError) as exc:
            notes.append(type(exc).__name__)
            await asyncio.sleep(0.3)
    result[tag] = (seqs, terminal, notes)


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
            for _ in range(100):
                try:
                    async with http.get(f"{base}/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
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
        problems = stack.stop()
        for name in ["publisher", "worker-1", "worker-2", "upstream"]:
            text = stack.logs(name)
            for line in text.splitlines():
                if "Traceback" in line or "level=error" in line or " ERROR " in line:
                    print(f"LOG {name}: {line[:400]}")
        print("problems:", problems, "logs:", stack.logdir)
        print("FAILURES", failures)
    server.kill9()


try:
    asyncio.run(main())
finally:
    for proc in SERVERS:
        if proc.poll() is None:
            proc.kill()
