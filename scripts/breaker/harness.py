"""Adversarial harness: a private redis-server, a real `fanout publisher` process, a fake worker, SSE readers.

Shared by the breaker scripts; not part of the test suite. Run from the repository root with
`.venv/bin/python -m scripts.breaker.<script>`.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from publisher.live import encode_notification
from publisher.tokens import issue
from schema.contract import encode_event
from schema.keys import Keys
from tests.publisher.helpers import block_start, delta, done, start, stop

API_KEY = "breaker-api-key-0123456789"
SECRET = "breaker-secret-" + "y" * 40
PREFIX = "brk"

# XADD every entry, HSET meta, PUBLISH the batch: the shape of worker.appender.APPEND_LUA, without fencing.
WRITE_LUA = """
local n = tonumber(ARGV[1])
local first = tonumber(ARGV[2])
for i = 1, n do redis.call('XADD', KEYS[1], '0-' .. (first + i - 1), 'e', ARGV[2 + i]) end
redis.call('HSET', KEYS[2], 'last_seq', first + n - 1)
if ARGV[3 + n] == '1' then redis.call('HSET', KEYS[2], 'state', 'done', 'status', 'completed') end
redis.call('PUBLISH', KEYS[3], ARGV[4 + n])
return n
"""


def free_port() -> int:
    """A free loopback port in 40000-45000 (the range the helpers' private servers use)."""
    for _ in range(500):
        port = random.randint(40000, 45000)  # noqa: S311
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 40000-45000")


class Redis:
    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="brk-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--save", "", "--appendonly", "no",
                                      "--dir", self.dir, "--bind", "127.0.0.1", "--enable-debug-command", "yes"], stdout=subprocess.DEVNULL)
        self.wait_listening()

    def wait_listening(self) -> None:
        """Return once the server accepts a connection (at most about 4 s)."""
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.1):
                    return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class Publisher:
    def __init__(self, redis_url: str, **env: str) -> None:
        self.port = free_port()
        self.env = {**os.environ, "REDIS_URL": redis_url, "FANOUT_API_KEYS": API_KEY, "FANOUT_TOKEN_SECRET": SECRET,
                    "FANOUT_REDIS_PREFIX": PREFIX, "FANOUT_SHUTDOWN_WINDOW_S": "0", **env}
        self.log = tempfile.NamedTemporaryFile(prefix="brk-pub-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "fanout"), "publisher", "--host", "127.0.0.1",
                                      "--port", str(self.port)], env=self.env, stdout=self.log, stderr=self.log)
        for _ in range(300):
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("publisher did not start; log: " + self.log.name)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None

    def logtext(self) -> str:
        with open(self.log.name) as f:
            return f.read()


def token(sid: str, scope: str) -> str:
    return issue(SECRET, sid, scope, int(time.time()) + 3600)  # type: ignore[arg-type]


@dataclass
class Script:
    """One stream's events and which seqs a public reader may see."""

    sid: str
    events: list[bytes] = field(default_factory=list)
    hidden: set[int] = field(default_factory=set)


def make_stream(sid: str, n_blocks: int, rng: random.Random, deltas: int = 8, text: str = "x") -> Script:
    out = Script(sid)
    seq = 1

    def add(ev: Any, hide: bool = False) -> None:
        nonlocal seq
        out.events.append(encode_event(ev))
        if hide:
            out.hidden.add(seq)
        seq += 1

    add(start(sid, 1))
    for index in range(n_blocks):
        kind = rng.choice(["text", "reasoning", "reasoning"])
        vis = rng.choice(["internal", "public"]) if kind == "reasoning" else None
        hide = vis == "internal"
        add(block_start(sid, seq, index, kind, vis), hide)
        for i in range(rng.randint(0, deltas)):
            add(delta(sid, seq, index, f"{'SECRET' if hide else text}{i} ", kind), hide)
        add(stop(sid, seq, index, kind), hide)
    add(done(sid, seq))
    return out


class Worker:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self.script = client.register_script(WRITE_LUA)

    async def meta(self, sid: str) -> None:
        await self.client.hset(self.keys.meta(sid), mapping={"state": "running", "provider": "openai_chat",
                                                              "model": "m", "created_ms": int(time.time() * 1000),
                                                              "last_seq": 0})

    async def write(self, sid: str, first: int, events: list[bytes], *, terminal: bool, live_max: int = 1 << 16) -> None:
        payload = encode_notification(first, events, live_max)
        await self.script(keys=[self.keys.events(sid), self.keys.meta(sid), self.keys.live(sid)],
                          args=[len(events), first, *events, "1" if terminal else "0", payload])


@dataclass
class Result:
    status: int
    ids: list[int]
    body: bytes
    bad_lines: list[bytes]
    gap: bool
    datas: list[bytes]


async def read_sse(http: aiohttp.ClientSession, base: str, sid: str, *, cred: str, position: int | None,
                   stop_after: int | None = None, slow_s: float = 0.0) -> Result:
    headers = {"Authorization": f"Bearer {cred}"}
    if position is not None:
        headers["Last-Event-ID"] = str(position)
    async with http.get(f"{base}/v1/streams/{sid}/events", headers=headers) as resp:
        if resp.status != 200:
            return Result(resp.status, [], await resp.read(), [], False, [])
        buf = b""
        ids: list[int] = []
        count = 0
        while True:
            try:
                chunk = await resp.content.readany()
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
                break  # dropped (overflow, a stalled write, a fault): the reader resumes
            if not chunk:
                break
            buf += chunk
            if slow_s:
                await asyncio.sleep(slow_s)
            if stop_after is not None:
                count = buf.count(b"\nid: ") + buf.startswith(b"id: ")
                if count >= stop_after:
                    break
    return parse(resp.status, buf)


def parse(status: int, buf: bytes) -> Result:
    ids: list[int] = []
    bad: list[bytes] = []
    datas: list[bytes] = []
    gap = False
    messages = buf.split(b"\n\n")
    for message in messages[:-1]:  # the last part is what follows the final blank line (partial, or empty)
        for line in message.split(b"\n"):
            if line.startswith(b"id: "):
                if not line[4:].isdigit():
                    bad.append(line)
                else:
                    ids.append(int(line[4:]))
            elif line.startswith(b"event: "):
                if line == b"event: stream.gap":
                    gap = True
            elif line.startswith(b"data: "):
                datas.append(line[6:])
            elif line.startswith((b"retry: ", b": ")):
                pass
            else:
                bad.append(line)
        if b"\r" in message:
            bad.append(b"CR in " + message[:80])
    return Result(status, ids, buf, bad, gap, datas)
