"""Harness for the read-ahead attacks: a real publisher process, stored streams, clients that stall at will.

Normal traffic goes to the shared Redis (127.0.0.1:6379) under a unique prefix; faults use a
private ``redis-server`` on a port in 40000-45000. Not part of the test suite.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from publisher.live import encode_notification
from schema.contract import encode_event
from schema.keys import Keys
from tests.publisher.helpers import block_start, delta, done, start

API_KEY = "breaker-api-key-0123456789"
SECRET = "breaker-secret-" + "y" * 40
SHARED_URL = "redis://127.0.0.1:6379/0"


def free_port(low: int = 40000, high: int = 45000) -> int:
    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


class PrivateRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="brk-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--save", "", "--appendonly", "no",
                                      "--dir", self.dir, "--bind", "127.0.0.1", "--enable-debug-command", "yes"],
                                     stdout=subprocess.DEVNULL)
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.1):
                    return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
            self.proc = None


class Publisher:
    def __init__(self, redis_url: str, prefix: str, **env: str) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.env = {**os.environ, "REDIS_URL": redis_url, "FANOUT_API_KEYS": API_KEY, "FANOUT_TOKEN_SECRET": SECRET,
                    "FANOUT_REDIS_PREFIX": prefix, "FANOUT_SHUTDOWN_WINDOW_S": "0",
                    "OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
                    "OTEL_EXPORTER_PROMETHEUS_PORT": str(self.metrics_port), **env}
        self.log = tempfile.NamedTemporaryFile(prefix="brk-pub-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        fanout = os.path.join(os.path.dirname(sys.executable), "fanout")
        self.proc = subprocess.Popen([fanout, "publisher", "--host", "127.0.0.1", "--port", str(self.port)],
                                     env=self.env, stdout=self.log, stderr=self.log)
        for _ in range(300):
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("publisher did not start; log: " + self.log.name)

    async def astart(self) -> None:
        """Start without blocking the loop (a proxy in this process must answer meanwhile)."""
        fanout = os.path.join(os.path.dirname(sys.executable), "fanout")
        self.proc = subprocess.Popen([fanout, "publisher", "--host", "127.0.0.1", "--port", str(self.port)],
                                     env=self.env, stdout=self.log, stderr=self.log)
        for _ in range(300):
            try:
                _, w = await asyncio.open_connection("127.0.0.1", self.port)
                w.close()
                return
            except OSError:
                await asyncio.sleep(0.05)
        self.stop()
        raise RuntimeError("publisher did not start; log: " + self.log.name)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    async def astop(self, guard_s: float = 200.0) -> float | None:
        """SIGTERM, then wait without blocking the loop; return the seconds it took, None if it had to be killed."""
        if self.proc is None:
            return 0.0
        self.proc.terminate()
        started = time.monotonic()
        while self.proc.poll() is None and time.monotonic() - started < guard_s:
            await asyncio.sleep(0.05)
        took: float | None = time.monotonic() - started
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            took = None
        self.proc = None
        return took

    def logtext(self) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def rss_kb(self) -> int:
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    async def metrics(self) -> dict[str, float]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.metrics_port)
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        body = await reader.read()
        writer.close()
        out: dict[str, float] = {}
        for line in body.decode().splitlines():
            m = re.match(r"^(fanout_[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
            if m:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        return out


def metric(values: dict[str, float], name: str) -> float:
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


@dataclass
class Stream:
    sid: str
    top: int


async def store_stream(client: aioredis.Redis, keys: Keys, sid: str, n: int, *, big: int = 0, big_bytes: int = 32_000,
                       terminal: bool = False, small_text: str = "t") -> Stream:
    """Store seqs 1..n (seqs 3..3+big-1 of ``big_bytes`` each), meta last_seq=n; terminal at n when asked."""
    events = [start(sid), block_start(sid, 2, 0)]
    for seq in range(3, n + (0 if terminal else 1)):
        events.append(delta(sid, seq, 0, ("y" * big_bytes) if seq < 3 + big else f"{small_text}{seq} "))
    if terminal:
        events.append(done(sid, n))
    meta = {"state": "done" if terminal else "running", "provider": "openai_chat", "model": "m",
            "created_ms": int(time.time() * 1000), "last_seq": n}
    if terminal:
        meta["status"] = "completed"
    await client.hset(keys.meta(sid), mapping=meta)
    for i in range(0, len(events), 200):
        async with client.pipeline(transaction=False) as pipe:
            for event in events[i:i + 200]:
                pipe.xadd(keys.events(sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
            await pipe.execute()
    return Stream(sid, n)


async def append_live(client: aioredis.Redis, keys: Keys, sid: str, first: int, count: int, *,
                      terminal: bool = False) -> None:
    """Append seqs first..first+count-1 as a worker would (XADD, HSET, PUBLISH with the events)."""
    events = [delta(sid, seq, 0, f"live{seq} ") for seq in range(first, first + count - (1 if terminal else 0))]
    if terminal:
        events.append(done(sid, first + count - 1))
    raws = [encode_event(e) for e in events]
    async with client.pipeline(transaction=True) as pipe:
        for event, raw in zip(events, raws, strict=True):
            pipe.xadd(keys.events(sid), {"e": raw}, id=f"0-{event.seq}")
        fields: dict[str, Any] = {"last_seq": first + count - 1}
        if terminal:
            fields.update(state="done", status="completed")
        pipe.hset(keys.meta(sid), mapping=fields)
        pipe.publish(keys.live(sid), encode_notification(first, raws, 1 << 16))
        await pipe.execute()


def new_sid() -> str:
    return "st_brk" + uuid.uuid4().hex[:20]


@dataclass
class Got:
    status: int = 0
    ids: list[int] = field(default_factory=list)
    gap: list[bytes] = field(default_factory=list)
    bad: list[bytes] = field(default_factory=list)
    ended: str = ""
    body: bytes = b""


class StallClient:
    """One SSE request over a raw socket with a small receive buffer; the caller decides when it reads.

    Parses the chunked body and SSE messages incrementally; keeps only ids and gap frames.
    """

    def __init__(self, port: int, sid: str, *, position: int | None = None, cred: str = API_KEY,
                 rcvbuf: int = 4096) -> None:
        self.port, self.sid, self.position, self.cred, self.rcvbuf = port, sid, position, cred, rcvbuf
        self.got = Got()
        self._raw = b""
        self._body = b""
        self._headers_done = False
        self._chunked = False
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.eof = False

    async def connect(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        self.reader, self.writer = await asyncio.open_connection(sock=sock, limit=self.rcvbuf)
        lines = [f"GET /v1/streams/{self.sid}/events HTTP/1.1", "Host: x", f"Authorization: Bearer {self.cred}"]
        if self.position is not None:
            lines.append(f"Last-Event-ID: {self.position}")
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await self.writer.drain()

    async def read_some(self, n: int = 65536) -> bool:
        """Read once (waits for data); False at EOF or reset."""
        assert self.reader is not None
        try:
            data = await self.reader.read(n)
        except (ConnectionError, OSError) as exc:
            self.got.ended = type(exc).__name__
            self.eof = True
            return False
        if not data:
            self.got.ended = self.got.ended or "eof"
            self.eof = True
            return False
        self._feed(data)
        return True

    async def read_until(self, pred: Any, guard_s: float = 60.0) -> None:
        async with asyncio.timeout(guard_s):
            while not pred(self) and not self.eof:
                await self.read_some()

    async def read_to_end(self, guard_s: float = 120.0) -> Got:
        await self.read_until(lambda c: False, guard_s)
        return self.got

    def last(self) -> int:
        return self.got.ids[-1] if self.got.ids else (self.position or 0)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()

    def _feed(self, data: bytes) -> None:
        if not self._headers_done:
            self._raw += data
            head, sep, rest = self._raw.partition(b"\r\n\r\n")
            if not sep:
                return
            self._headers_done = True
            status_line = head.split(b"\r\n", 1)[0]
            self.got.status = int(status_line.split()[1])
            self._chunked = b"transfer-encoding: chunked" in head.lower()
            self._raw = b""
            data = rest
        if self._chunked:
            self._raw += data
            while True:
                line, sep, rest = self._raw.partition(b"\r\n")
                if not sep:
                    break
                size = int(line.split(b";")[0], 16)
                if len(rest) < size + 2:
                    break
                self._sse(rest[:size])
                self._raw = rest[size + 2:]
                if size == 0:
                    self.got.ended = "eof"
        else:
            self._sse(data)

    def _sse(self, data: bytes) -> None:
        self._body += data
        if self.got.status != 200:
            self.got.body += data
        *messages, self._body = self._body.split(b"\n\n")
        for message in messages:
            gap = False
            for line in message.split(b"\n"):
                if line.startswith(b"id: "):
                    if line[4:].isdigit():
                        self.got.ids.append(int(line[4:]))
                    else:
                        self.got.bad.append(line)
                elif line == b"event: stream.gap":
                    gap = True
                elif line.startswith((b"event: ", b"data: ", b"retry: ", b": ")):
                    pass
                elif line:
                    self.got.bad.append(line[:100])
            if gap:
                self.got.gap.append(message)


def check_exact(tag: str, ids: list[int], first: int, last: int, failures: list[str]) -> None:
    want = list(range(first, last + 1))
    if ids != want:
        dups = len(ids) - len(set(ids))
        missing = sorted(set(want) - set(ids))[:10]
        extra = sorted(set(ids) - set(want))[:10]
        failures.append(f"{tag}: ids not exact: len {len(ids)} want {len(want)} dups {dups} "
                        f"missing {missing} extra {extra} head {ids[:5]} tail {ids[-5:]}")


def scan_log(text: str) -> list[str]:
    bad = []
    for needle in ("never retrieved", "Traceback", "was never awaited", "Task was destroyed", "Unclosed",
                   "unexpected error", "ERROR"):
        if needle in text:
            lines = [ln for ln in text.splitlines() if needle in ln][:3]
            bad.append(f"log has {needle!r}: {lines}")
    return bad


async def cleanup(client: aioredis.Redis, prefix: str) -> None:
    async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        await client.delete(key)


class FreezeProxy:
    """A TCP proxy before Redis that can hold every reply (``freeze``) and reset every connection (``cut``)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.pairs: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._server: asyncio.Server | None = None
        self.cuts = 0
        self.down = False
        """New connections are reset at once (Redis unreachable)."""
        self.gate_pattern: bytes | None = None
        """The first request holding this pattern has its replies held until ``gate_open`` is set."""
        self.gate_entered = asyncio.Event()
        self.gate_open = asyncio.Event()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()

    def freeze(self) -> None:
        self.flowing.clear()

    def thaw(self) -> None:
        self.flowing.set()

    def cut(self) -> None:
        self.cuts += 1
        pairs, self.pairs = self.pairs, []
        for a, b in pairs:
            for w in (a, b):
                sock = w.get_extra_info("socket")
                try:
                    if sock is not None:
                        import struct
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
                w.transport.abort()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.down:
            import struct
            client_w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client_w.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.transport.abort()
            return
        self.pairs.append((client_w, up_w))
        held = asyncio.Event()
        held.set()

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter, gated: bool) -> None:
            try:
                while data := await r.read(65536):
                    if not gated and self.gate_pattern is not None and self.gate_pattern in data \
                            and not self.gate_entered.is_set():
                        held.clear()
                        self.gate_entered.set()
                        asyncio.get_running_loop().create_task(self._open_later(held))
                    if gated:
                        await self.flowing.wait()
                        await held.wait()
                    w.write(data)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                w.transport.abort()

        await asyncio.gather(pump(client_r, up_w, False), pump(up_r, client_w, True))

    async def _open_later(self, held: asyncio.Event) -> None:
        await self.gate_open.wait()
        held.set()
