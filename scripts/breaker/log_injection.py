"""Control characters and look-alike line breaks in user-controlled fields, in both log formats.

Sends a model name, stream ids, header values, query names and values holding newline, CR,
ESC, NEL (U+0085), CSI (U+009B), LINE/PARAGRAPH SEPARATOR (U+2028/9) and a forged ``key=value``;
then prints every log line holding the marker, repr'd, and checks that each record is one
line (logfmt: no raw C0/C1/U+2028/U+2029; json: every line parses) and that no query value
reaches the access log. Run: `.venv/bin/python -m scripts.breaker.log_injection [logfmt|json]`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys

import aiohttp

from scripts.breaker.ra_harness import API_KEY, SHARED_URL, Publisher

MARK = "ZQX"
BREAKS = ["\n", "\r", "\x1b[31m", "\x85", "\x9b31m", "\u2028", "\u2029", "\x0b", "\x0c", "\x1c"]


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), 3) as s:
        s.sendall(request)
        s.settimeout(3)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except OSError:
            pass
        return out


async def main(fmt: str) -> int:
    pub = Publisher(SHARED_URL, "brk2log", FANOUT_LOG_FORMAT=fmt, FANOUT_LOG_LEVEL="DEBUG")
    await pub.astart()
    try:
        auth = {"Authorization": f"Bearer {API_KEY}"}
        async with aiohttp.ClientSession(headers=auth) as h:
            for i, br in enumerate(BREAKS):
                model = f"{MARK}m{i}{br}ts=2026 level=ERROR logger=forged msg={MARK}"
                body = {"provider": "openai_chat", "model": model,
                        "request": {"messages": [{"role": "user", "content": "x"}]}}
                async with h.post(pub.base + "/v1/streams", json=body) as r:
                    print("model", repr(br), r.status, (await r.read())[:100])
                async with h.post(pub.base + "/v1/streams", json={**body, "model": "m",
                                                                   "stream_id": f"st_{MARK}{br}x"}) as r:
                    print("stream_id", repr(br), r.status)
        for i, br in enumerate(BREAKS):
            enc = "".join(f"%{b:02X}" for b in br.encode())
            for target in (f"/v1/streams/st_{MARK}{enc}x/events", f"/healthz?{MARK}{enc}name=v{enc}al&token=s3cr3t{MARK}",
                           f"/healthz?last_event_id={MARK}{enc}1", f"/v1/streams/st_a/events?api_key=k3y{MARK}&key=k{MARK}"):
                raw(pub.port, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                              f"Last-Event-ID: {MARK}{i}\r\nAuthorization: Bearer {API_KEY}\r\n\r\n".encode())
            # a raw header value holding bytes aiohttp may refuse
            raw(pub.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: " + MARK.encode() + br.encode("utf-8") +
                b"\r\nConnection: close\r\n\r\n")
    finally:
        await pub.astop()
    text = open(pub.log.name, encoding="utf-8", errors="surrogateescape").read()
    failures = []
    lines = text.split("\n")
    for line in lines:
        if not line:
            continue
        if fmt == "json":
            try:
                json.loads(line)
            except ValueError:
                failures.append(f"not json: {line[:120]!r}")
        elif not line.startswith("ts="):
            failures.append(f"line not starting a record: {line[:120]!r}")
        if any(c in line for c in ("\x85", "\x9b", "\u2028", "\u2029", "\x1b")):
            failures.append(f"raw line-break/escape char in a line: {line[:160]!r}")
        if "s3cr3t" in line or "k3y" in line or f"k{MARK}" in line:
            failures.append(f"query value in log: {line[:160]!r}")
    for line in lines:
        if MARK in line:
            print("  ", repr(line[:230]))
    for f in failures:
        print("FAIL", f)
    print(f"{len(failures)} failures; log {pub.log.name}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "logfmt")))
