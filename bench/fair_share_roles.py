"""The client processes of bench/fair_share_bench.py: the victim and the three attackers.

Each role runs in its own process (``fair_share_bench.py --role <name> <args>``) and
prints one JSON line at the end (the attackers also when terminated: SIGTERM ends them).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp

PACE_S = 0.1
"""The victim's pause between two submits, and between two SSE reads: 10/s each."""
VICTIM_TIMEOUT_S = 10.0
"""The victim gives up on one request after this long (counted as an error)."""
CONNECTS_PER_TURN = 200
"""Connections the ``connections`` attacker starts per turn of its loop (a ramp of some thousands per second)."""
TCP_CLOSE_STATES = (7, 8)
"""``TCP_CLOSE`` and ``TCP_CLOSE_WAIT`` (``tcp_info.tcpi_state``): the publisher reset or closed the connection."""


async def _victim(base: str, key: str, sid: str, token: str, seconds: float) -> dict[str, Any]:
    seen: dict[str, Any] = {"submit": [], "first": [], "all": [], "submit_errors": 0, "sse_errors": 0}
    deadline = time.monotonic() + seconds
    body = {"provider": "openai_chat", "model": "m", "request": {"messages": [{"role": "user", "content": "hi"}]}}
    timeout = aiohttp.ClientTimeout(total=VICTIM_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def submits() -> None:
            while time.monotonic() < deadline:
                began = time.perf_counter()
                try:
                    async with http.post(f"{base}/v1/streams", json=body,
                                         headers={"Authorization": f"Bearer {key}"}) as resp:
                        await resp.read()
                        ok = resp.status == 201
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                if ok:
                    seen["submit"].append((time.perf_counter() - began) * 1000)
                else:
                    seen["submit_errors"] += 1
                await asyncio.sleep(PACE_S)

        async def reads() -> None:
            while time.monotonic() < deadline:
                began, first, done = time.perf_counter(), None, False
                try:
                    async with http.get(f"{base}/v1/streams/{sid}/events",
                                        headers={"Authorization": f"Bearer {token}"}) as resp:
                        async for line in resp.content:
                            if first is None and line.startswith(b"id: "):
                                first = time.perf_counter()
                            if line.startswith(b"event: stream.done"):
                                done = True
                except (aiohttp.ClientError, TimeoutError):
                    pass
                if first is not None and done:
                    seen["first"].append((first - began) * 1000)
                    seen["all"].append((time.perf_counter() - began) * 1000)
                else:
                    seen["sse_errors"] += 1
                await asyncio.sleep(PACE_S)

        await asyncio.gather(submits(), reads())
    return seen


def victim(base: str, key: str, sid: str, token: str, seconds: str) -> None:
    """Submit and read ``sid`` at 10/s each for ``seconds``; print every latency (ms)."""
    print(json.dumps(asyncio.run(_victim(base, key, sid, token, float(seconds)))), flush=True)


def _until_terminated() -> asyncio.Event:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    return stop


async def _status(base: str, token: str, readers: int, ignore_retry: bool) -> dict[str, Any]:
    counts: dict[str, int] = {}
    stop = _until_terminated()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as http:

        async def reader() -> None:
            while not stop.is_set():
                try:
                    async with http.get(f"{base}/v1/streams/st_big", headers={"Authorization": f"Bearer {token}"}) as r:
                        await r.read()
                        status, retry = str(r.status), float(r.headers.get("Retry-After", 0))
                except (aiohttp.ClientError, TimeoutError) as exc:
                    status, retry = type(exc).__name__, 0.0
                counts[status] = counts.get(status, 0) + 1
                if status == "429" and not ignore_retry:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), retry)

        tasks = [asyncio.create_task(reader()) for _ in range(readers)]
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return counts


def status(base: str, token: str, readers: str, ignore_retry: str) -> None:
    """``readers`` loops of ``GET /v1/streams/st_big``; a 429 waits its ``Retry-After`` unless ``ignore_retry``."""
    print(json.dumps(asyncio.run(_status(base, token, int(readers), ignore_retry == "1"))), flush=True)


class _Conn:
    __slots__ = ("data", "held", "sent", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.data, self.held, self.sent = sock, b"", False, False


class _Swarm:
    """``n`` SSE connections of one stream with one token, as that many EventSource clients would hold them."""

    def __init__(self, host_port: str, sid: str, token: str, n: int) -> None:
        host, port = host_port.split(":")
        self.address = (host, int(port))
        self.request = f"GET /v1/streams/{sid}/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n"
        self.n, self.sel, self.due, self.held = n, selectors.DefaultSelector(), [0.0] * n, 0
        self.stats = {"opened": 0, "held_now": 0, "held_max": 0, "busy": 0, "errors": 0, "connect_failed": 0}

    def connect_due(self) -> None:
        """Start the connections due now, at most :data:`CONNECTS_PER_TURN` (non-blocking connects)."""
        now, started = time.monotonic(), 0
        self.due.sort()
        while self.due and self.due[0] <= now and started < CONNECTS_PER_TURN:
            self.due.pop(0)
            sock = socket.socket()
            sock.setblocking(False)
            if sock.connect_ex(self.address) not in (0, errno.EINPROGRESS):
                sock.close()
                self.stats["connect_failed"] += 1
                self.due.append(now + 1.0)
                continue
            self.sel.register(sock, selectors.EVENT_WRITE, _Conn(sock))
            self.stats["opened"] += 1
            started += 1

    def ready(self, conn: _Conn) -> None:
        """Send the request once connected; read; hold a real event stream; reconnect after a busy answer."""
        if not conn.sent:
            if conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                conn.sent = True
                with contextlib.suppress(OSError):
                    conn.sock.send(self.request.encode())
                self.sel.modify(conn.sock, selectors.EVENT_READ, conn)
                return
            chunk = b""
        else:
            try:
                chunk = conn.sock.recv(65536)
            except OSError:
                chunk = b""
        if chunk and not conn.held:
            conn.data = (conn.data + chunk)[-4096:]
            if b"\nid: " in conn.data:
                conn.held, self.held = True, self.held + 1
        if not chunk:
            self.sel.unregister(conn.sock)
            conn.sock.close()
            self.held -= conn.held
            retry = _retry_ms(conn.data)
            self.stats["busy" if retry is not None else "errors"] += 1
            self.due.append(time.monotonic() + (retry or 1000) / 1000)


def connections(host_port: str, sid: str, token: str, n: str) -> None:
    """Hold ``n`` SSE connections of ``sid`` with one token; one turned away reconnects after its ``retry:``."""
    swarm = _Swarm(host_port, sid, token, int(n))
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    while not stopping:
        swarm.connect_due()
        for key, _ in swarm.sel.select(timeout=0.02):
            swarm.ready(key.data)
        stats = swarm.stats
        stats["held_now"], stats["held_max"] = swarm.held, max(stats["held_max"], swarm.held)
    swarm.stats["open_at_end"] = len(swarm.sel.get_map())
    print(json.dumps(swarm.stats), flush=True)


def _retry_ms(data: bytes) -> int | None:
    for line in data.split(b"\n"):
        if line.startswith(b"retry: "):
            return int(line[7:])
    return None


_GONE: Any = object()
"""A stalled reader that was dropped and does not reconnect."""


def stalled(host_port: str, sid: str, tokens: str, shape: str, reconnect: str) -> None:
    """``n`` readers of ``sid`` (``shape``: ``n/top seq``) from spread positions that never read.

    A dropped reader reconnects when ``reconnect`` is ``1``.

    A reader is seen dropped by its socket's TCP state (reset or closed), read without
    taking a byte; ``tokens`` holds one token per reader, or one for all.
    """
    host, port = host_port.split(":")
    keys = tokens.split(",")
    n, top = shape.split("/")
    keys += keys[-1:] * (int(n) - len(keys))
    count, spread = int(n), max(1, int(top) // (int(n) + 1))
    stats = {"opened": 0, "dropped": 0, "connect_failed": 0}
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))

    def connect(i: int) -> socket.socket | None:
        try:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((host, int(port)))
            sock.sendall(f"GET /v1/streams/{sid}/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {keys[i]}\r\n"
                         f"Last-Event-ID: {i * spread}\r\n\r\n".encode())
            sock.setblocking(False)
        except OSError:
            stats["connect_failed"] += 1
            return None
        stats["opened"] += 1
        return sock

    socks: list[socket.socket | None] = []
    for i in range(count):
        socks.append(connect(i))
        time.sleep(0.005)
    while not stopping:
        time.sleep(0.5)
        for i, sock in enumerate(socks):
            if sock is _GONE:
                continue
            if sock is None:
                socks[i] = connect(i)
                continue
            if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] not in TCP_CLOSE_STATES:
                continue  # still open (its state read without reading a byte)
            stats["dropped"] += 1
            sock.close()
            socks[i] = connect(i) if reconnect == "1" else None
            if socks[i] is None and reconnect != "1":
                socks[i] = _GONE
    print(json.dumps(stats), flush=True)


ROLES: dict[str, Callable[..., None]] = {"victim": victim, "status": status, "connections": connections,
                                         "stalled": stalled}
"""Role name → entry point taking the role's arguments as strings."""

if __name__ == "__main__":
    ROLES[sys.argv[1]](*sys.argv[2:])
