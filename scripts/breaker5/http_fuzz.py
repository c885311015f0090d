"""Hostile HTTP input against a real `fanout publisher` on a private redis-server. Not run by CI.

Usage: .venv/bin/python -m scripts.breaker5.http_fuzz
Prints every answer that is a 5xx, is not a problem document when >= 400, and any traceback in the log.
"""
from __future__ import annotations

import asyncio
import json

import aiohttp

from scripts.breaker.harness import API_KEY, Publisher, Redis, token

SID = "st_fuzz1"


async def raw(port: int, data: bytes) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(data)
    await w.drain()
    try:
        out = await asyncio.wait_for(r.read(65536), 5)
    except TimeoutError:
        out = b"<timeout>"
    w.close()
    return out


async def main() -> None:
    redis = Redis(); redis.start()
    pub = Publisher(redis.url, FANOUT_HEARTBEAT_S="2"); pub.start()
    bad: list[str] = []
    base = pub.base
    async with aiohttp.ClientSession() as http:
        async def check(method: str, path: str, **kw):
            async with http.request(method, base + path, **kw) as resp:
                if resp.status == 200 and "event-stream" in resp.headers.get("Content-Type", ""):
                    try:
                        body = await asyncio.wait_for(resp.content.read(200), 0.3)
                    except TimeoutError:
                        body = b"<open stream>"
                else:
                    body = await resp.read()
                ctype = resp.headers.get("Content-Type", "")
                tag = f"{method} {path} {kw.get('headers')} {str(kw.get('data'))[:80]} -> {resp.status} {body[:160]!r}"
                if resp.status >= 500 or (resp.status >= 400 and "problem+json" not in ctype):
                    bad.append(tag)
                return resp.status, body
        sub = {"provider": "openai_chat", "model": "m", "request": {"messages": []}, "stream_id": SID}
        print(await check("POST", "/v1/streams", json=sub, headers={"Authorization": f"Bearer {API_KEY}"}))
        tok = token(SID, "public")
        auth = {"Authorization": f"Bearer {tok}"}
        ev = f"/v1/streams/{SID}/events"
        for lei in ["-1", "1.0", "0x10", " 5", "１", "٣", "1e3", "9" * 64, "9" * 65, "0" * 64 + "1", "\t3\t", "abc",
                    "18446744073709551616", "9223372036854775808", "1 2", "+1"]:
            await check("GET", ev, headers={**auth, "Last-Event-ID": lei})
            await check("GET", ev + "?last_event_id=" + aiohttp.helpers.quote(lei, safe=""), headers=auth)
        for q in ["?last_event_id=1&last_event_id=2", "?last_event_id", "?last_event_id=%00", "?last_event_id=%ff",
                  "?%ff=1", "?scope=internal", "?token=" + tok, "?token=x&token=y", "?access_token=" + tok]:
            await check("GET", ev + q, headers=auth)
        for a in ["Bearer", "Bearer ", "bearer " + tok, "Basic abc", "Bearer " + tok + " x", "Bearer " + "a" * 8000,
                  "Bearer " + tok[:-1], "Bearer ..", "Bearer a.b.c", "Bearer \u00e9".encode("utf-8").decode("latin-1")]:
            await check("GET", ev, headers={"Authorization": a})
            await check("GET", f"/v1/streams/{SID}", headers={"Authorization": a})
        for path in [f"/v1/streams/{'a' * 129}", "/v1/streams/%00", "/v1/streams/a%2Fb/events", "/v1/streams/..%2F..",
                     f"/v1/streams/{SID}/ui", f"/v1/streams/{SID}/ui?token=x", f"/v1/streams/{SID}/ui?last_event_id=-1",
                     "/v1/streams/%e9", "/v1/streams/" + "%C3%A9" * 3, "/v1/streams/st_nope/ui"]:
            await check("GET", path, headers=auth)
        key = {"Authorization": f"Bearer {API_KEY}"}
        bodies = [b"", b"null", b"[]", b"{", b'{"provider":"openai_chat"}', b"\xff\xfe", b'"x"', b"1e999",
                  json.dumps({**sub, "stream_id": "st_x2", "model": "\u2028"}).encode(),
                  b'{"provider":"openai_chat","model":"m","request":{},"metadata":{"a":1e999}}',
                  b'{"provider":"openai_chat","model":"m","request":{"a":123456789012345678901234567890}}',
                  b'{"provider":"openai_chat","model":"m","request":{"stream_options":[]}}',
                  b'{"provider":"openai_chat","model":"m","request":{},"stream_id":null}',
                  b'{"provider":"openai_chat","model":"m","request":{},"reasoning_visibility":null}',
                  b'{"provider":"openai_chat","model":"m","request":{},"metadata":null}',
                  b'{"provider":"openai_chat","model":"m","request":{},"provider":"gemini"}',
                  b'{"provider":"openai_chat","model":"m","request":{"\\ud800":1}}',
                  b'{"provider":"openai_chat","model":"\\ud800","request":{}}',
                  b'{"provider":"openai_chat","model":"m","request":{}, "stream_id":"' + SID.encode() + b'"}',
                  b"[" * 100000, b'{"a":' * 5000]
        for body in bodies:
            for ctype in ["application/json", "text/plain", "application/json; charset=latin-1"]:
                await check("POST", "/v1/streams", data=body, headers={**key, "Content-Type": ctype})
        for body in [b"", b"{}", b'{"scope":"internal"}', b'{"scope":1}', b"[", b'{"scope":"public","x":1}', b"null"]:
            await check("POST", f"/v1/streams/{SID}/tokens", data=body, headers=key)
            await check("POST", f"/v1/streams/{SID}/cancel", data=body, headers=key)
        await check("POST", "/v1/streams", data=b"x" * 10, headers={**key, "Content-Length": "5"})
        for m in ["PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]:
            await check(m, ev, headers=auth)
            await check(m, "/v1/streams", headers=key)
    port = pub.port
    for data in [
        b"GET " + ev.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tok.encode() + b"\r\nLast-Event-ID: 1\r\nLast-Event-ID: 2\r\nConnection: close\r\n\r\n",
        b"GET " + ev.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tok.encode() + b"\r\nLast-Event-ID: \xff\r\nConnection: close\r\n\r\n",
        b"GET " + ev.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tok.encode() + b"\r\nAuthorization: Bearer x\r\nConnection: close\r\n\r\n",
        b"GET " + ev.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xe9\xff\r\nConnection: close\r\n\r\n",
        b"POST /v1/streams HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() + b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n",
        b"POST /v1/streams HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: -1\r\nConnection: close\r\n\r\n",
        b"POST /v1/streams HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
        b"GET /v1/streams/" + SID.encode() + b"?last_event_id=%ZZ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /v1/streams/\xff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET " + ev.encode() + b"?last_event_id=\xff HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tok.encode() + b"\r\nConnection: close\r\n\r\n",
        b"GET " + ev.encode() + b" HTTP/1.0\r\nAuthorization: Bearer " + tok.encode() + b"\r\nLast-Event-ID: 0\r\n\r\n",
    ]:
        out = await raw(port, data)
        print("RAW", data[:60], "->", out.split(b"\r\n", 1)[0])
        first = out.split(b"\r\n", 1)[0]
        if b" 5" in first[:13] or (b" 4" in first[:13] and b"problem+json" not in out):
            bad.append(f"RAW {data[:90]!r} -> {out[:200]!r}")
    await asyncio.sleep(0.5)
    pub.stop(); redis.kill()
    log = pub.logtext()
    for line in log.splitlines():
        if "Traceback" in line or "ERROR" in line or ("error" in line.lower() and "level=error" in line):
            bad.append("LOG " + line[:300])
    print("\n".join(bad) or "no findings")
    print("log lines:", len(log.splitlines()), pub.log.name)


asyncio.run(main())
