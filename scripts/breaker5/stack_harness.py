"""What the Redis-fault breakers under the real stack share: a private Redis server, the cases, an SSE follower.

Not run by CI. Used by ``scripts.breaker5.stack_faults`` and ``scripts.breaker6.fill_redis``.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import aiohttp

from scripts.breaker.harness import Redis

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


class Server(Redis):
    """A private redis-server; ``start(keep=True)`` persists with AOF (fsync always) across a kill -9."""

    def start(self, keep: bool = False) -> None:  # type: ignore[override]
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always"] if keep else ["--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        SERVERS.append(self.proc)
        self.wait_listening()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def cli(self, *args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True).stdout.decode()


async def sse_frames(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str | None, str | None, str]]:
    """Yield (event, id, data) of each SSE frame with data in ``resp``; comments and other fields skipped."""
    event, data, ident = None, [], None
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line == "":
            if data:
                yield event, ident, "\n".join(data)
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


async def wait_ready(http: aiohttp.ClientSession, base: str) -> None:
    """Poll ``base``/readyz until it answers 200 (at most about 10 s)."""
    for _ in range(100):
        try:
            async with http.get(f"{base}/readyz") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)


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
                async for event, ident, data in sse_frames(resp):
                    if event == "stream.gap" or (event or "").startswith("error"):
                        notes.append(f"{event}:{data[:80]}")
                    elif ident is not None:
                        seqs.append(int(ident))
                        pos = int(ident)
                        if json.loads(data).get("type") in ("stream.done", "stream.error"):
                            terminal = json.loads(data)["type"]
                if terminal:
                    break
                notes.append(f"ended@{pos}")
        except (TimeoutError, aiohttp.ClientError) as exc:
            notes.append(type(exc).__name__)
            await asyncio.sleep(0.3)
    result[tag] = (seqs, terminal, notes)


def report(stack: object, names: list[str], failures: int) -> None:
    """Stop ``stack``; print its problems, every ERROR or traceback line of its processes' logs, and FAILURES."""
    problems = stack.stop()  # type: ignore[attr-defined]
    for name in names:
        for line in stack.logs(name).splitlines():  # type: ignore[attr-defined]
            if "Traceback" in line or "level=ERROR" in line or " ERROR " in line:
                print(f"LOG {name}: {line[:400]}")
    print("problems:", problems, "logs:", stack.logdir)  # type: ignore[attr-defined]
    print("FAILURES", failures)


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main`` and kill every private Redis server left running."""
    try:
        asyncio.run(main())
    finally:
        for proc in SERVERS:
            if proc.poll() is None:
                proc.kill()
