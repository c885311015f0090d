"""Hostile HTTP against a real publisher: duplicate headers, odd Last-Event-ID values, huge headers,
slowloris, the connection-limit answer. Prints one line per probe: what came back."""

from __future__ import annotations

import asyncio
import socket
import sys
import time

import redis.asyncio as aioredis

from schema.keys import Keys
from scripts.breaker.harness import API_KEY, PREFIX, Publisher, Redis, Worker, make_stream, token


def raw(port: int, request: bytes, wait_s: float = 2.0) -> bytes:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(wait_s)
    try:
        sock.sendall(request)
        out = b""
        while True:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                out += b"<RST>"
                break
            if not data:
                break
            out += data
        return out
    finally:
        sock.close()


def head(out: bytes) -> str:
    first = out.split(b"\r\n", 1)[0].decode(errors="replace")
    body = out.split(b"\r\n\r\n", 1)[1][:160] if b"\r\n\r\n" in out else b""
    return f"{first!r} body={body!r}"


async def main() -> None:
    redis = Redis()
    redis.start()
    pub = Publisher(redis.url, FANOUT_HEADER_TIMEOUT_S="2", FANOUT_MAX_CONNECTIONS="3")
    pub.start()
    client = aioredis.from_url(redis.url)
    worker = Worker(client, Keys(PREFIX))
    import random
    s = make_stream("st_http", 3, random.Random(1))
    await worker.meta(s.sid)
    await worker.write(s.sid, 1, s.events, terminal=True)
    total = len(s.events)
    path = f"/v1/streams/{s.sid}/events"
    base = f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\nConnection: close\r\n"
    probes = {
        "duplicate Last-Event-ID": base + "Last-Event-ID: 1\r\nLast-Event-ID: 2\r\n\r\n",
        "duplicate Authorization": base + f"Authorization: Bearer {token(s.sid, 'public')}\r\n\r\n",
        "Last-Event-ID ' 5 '": base + "Last-Event-ID:  5 \r\n\r\n",
        "Last-Event-ID +5": base + "Last-Event-ID: +5\r\n\r\n",
        "Last-Event-ID -1": base + "Last-Event-ID: -1\r\n\r\n",
        "Last-Event-ID 5.0": base + "Last-Event-ID: 5.0\r\n\r\n",
        "Last-Event-ID 65 digits": base + "Last-Event-ID: " + "9" * 65 + "\r\n\r\n",
        "Last-Event-ID 64 digits": base + "Last-Event-ID: " + "9" * 64 + "\r\n\r\n",
        "Last-Event-ID 0005": base + "Last-Event-ID: 0005\r\n\r\n",
        "Last-Event-ID arabic digit": base + "Last-Event-ID: \u0663\r\n\r\n",
        "Last-Event-ID total": base + f"Last-Event-ID: {total}\r\n\r\n",
        "Last-Event-ID empty, query 3": base.replace(path, path + "?last_event_id=3") + "Last-Event-ID: \r\n\r\n",
        "query twice": base.replace(path, path + "?last_event_id=3&last_event_id=1") + "\r\n",
        "Last-Event-ID with NUL": base + "Last-Event-ID: 5\x00\r\n\r\n",
        "token in query and header": base.replace(path, path + f"?token={token(s.sid, 'public')}") + "\r\n",
        "huge header 100 KB": base + "X-Big: " + "a" * 100_000 + "\r\n\r\n",
        "10k headers": base + "".join(f"X-{i}: v\r\n" for i in range(10_000)) + "\r\n",
        "header with bare LF": base.replace("\r\n", "\n") + "\n",
        "header with obs-fold": base + "Last-Event-ID: 1\r\n 2\r\n\r\n",
        "absolute-form target": base.replace(f"GET {path}", f"GET http://evil{path}") + "\r\n",
        "HTTP/1.0": base.replace("HTTP/1.1", "HTTP/1.0") + "\r\n",
        "stream id too long": base.replace("st_http", "s" * 300) + "\r\n",
        "path traversal id": base.replace("st_http", "..%2F..%2Fx") + "\r\n",
        "transfer-encoding on GET": base + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    }
    for name, request in probes.items():
        out = await asyncio.to_thread(raw, pub.port, request.encode("utf-8", "surrogateescape"))
        print(f"{name:32} {head(out)}")

    # slowloris: one header byte per 0.5 s: the socket must be closed after FANOUT_HEADER_TIMEOUT_S (2 s)
    def slowloris() -> str:
        sock = socket.create_connection(("127.0.0.1", pub.port))
        started = time.monotonic()
        try:
            for ch in (base + "X-Slow: " + "a" * 100).encode():
                sock.sendall(bytes([ch]))
                time.sleep(0.05)
                if time.monotonic() - started > 8:
                    return "still open after 8 s"
        except (BrokenPipeError, ConnectionResetError):
            return f"closed after {time.monotonic() - started:.1f} s"
        return "sent everything"
    print("slowloris (1 byte / 50 ms)      ", await asyncio.to_thread(slowloris))

    # the storm answer: 3 connections held, the 4th gets 200 + retry:
    holders = []
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", pub.port))
        await worker.meta("st_hold")
        sock.sendall(f"GET /v1/streams/st_hold/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n\r\n".encode())
        holders.append(sock)
    await asyncio.sleep(0.5)
    out = await asyncio.to_thread(raw, pub.port, (base + "\r\n").encode())
    print(f"{'4th SSE at max_connections=3':32} {head(out)}")
    for sock in holders:
        sock.close()
    await client.aclose()
    pub.stop()
    redis.kill()
    log = pub.logtext()
    for line in log.splitlines():
        if "ERROR" in line or "Traceback" in line:
            print("LOG", line[:200])


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
