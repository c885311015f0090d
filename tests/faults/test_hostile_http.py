"""Hostile HTTP against a real publisher: never a 5xx, every refusal a problem document, a clean log, service goes on.

From the hostile-input rounds (``scripts/breaker/hostile_http``, ``scripts/breaker5/http_fuzz``;
docs/faults.md). Odd ``Last-Event-ID`` values (signs, decimals, non-ASCII digits, 64 and 65
digits, whitespace, NUL), repeated parameters and headers, credentials that are malformed,
truncated or in the wrong place, stream ids that are too long or escape the path, request
bodies that are not JSON, not objects, nested too deep or too big, wrong methods, and raw
requests no HTTP parser should accept. The specific answers are tested where each rule lives
(tests/publisher/test_edge_sockets.py, test_sse_resume.py, test_submit.py, test_hardening.py,
test_limits.py); this test holds the property across all of them at once.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from urllib.parse import quote

import aiohttp
import pytest
import redis.asyncio as aioredis

from schema.keys import Keys
from tests.faults.conftest import StartPublisher
from tests.faults.procs import log_problems
from tests.faults.sse import Follower
from tests.faults.streams import Writer, text_script
from tests.publisher.helpers import API_KEY, token_for
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.faults

SID = "st_hostile"
POSITIONS = ["-1", "1.0", "0x10", " 5 ", "\uff11", "\u0663", "1e3", "9" * 64, "9" * 65, "0" * 64 + "1", "\t3\t",
             "abc", "18446744073709551616", "1 2", "+1", "0005", ""]
QUERIES = ["?last_event_id=1&last_event_id=2", "?last_event_id", "?last_event_id=%00", "?last_event_id=%ff", "?%ff=1",
           "?scope=internal", "?token=x&token=y", "?access_token=x"]
AUTHS = ["Bearer", "Bearer ", "Basic abc", "Bearer " + "a" * 8000, "Bearer ..", "Bearer a.b.c",
         "Bearer \u00e9".encode().decode("latin-1")]
PATHS = [f"/v1/streams/{'a' * 129}", "/v1/streams/%00", "/v1/streams/a%2Fb/events", "/v1/streams/..%2F..",
         f"/v1/streams/{SID}/ui?last_event_id=-1", "/v1/streams/%e9", "/v1/streams/st_nope/ui",
         f"/v1/streams/{'s' * 300}/events", "/v1/streams/..%2F..%2Fx/events"]
BODIES = [b"", b"null", b"[]", b"{", b'{"provider":"openai_chat"}', b"\xff\xfe", b'"x"', b"1e999",
          b'{"provider":"openai_chat","model":"m","request":{},"metadata":{"a":1e999}}',
          b'{"provider":"openai_chat","model":"m","request":{"a":123456789012345678901234567890}}',
          b'{"provider":"openai_chat","model":"m","request":{"stream_options":[]}}',
          b'{"provider":"openai_chat","model":"m","request":{},"stream_id":null}',
          b'{"provider":"openai_chat","model":"m","request":{},"provider":"gemini"}',
          b'{"provider":"openai_chat","model":"\\ud800","request":{}}',
          b'{"provider":"openai_chat","model":"m\\u2028","request":{}}',
          b"[" * 100_000, b'{"a":' * 5000, b"x" * (2 << 20)]
RAW = [b"Last-Event-ID: 1\r\nLast-Event-ID: 2\r\n", b"Last-Event-ID: \xff\r\n", b"Last-Event-ID: 5\x00\r\n",
       b"Authorization: Bearer x\r\n", b"X-Big: " + b"a" * 100_000 + b"\r\n",
       b"".join(b"X-%d: v\r\n" % i for i in range(10_000)), b"Last-Event-ID: 1\r\n 2\r\n",
       b"Transfer-Encoding: chunked\r\n\r\n0\r\n", b"Content-Length: 1\r\nContent-Length: 2\r\n"]
"""Extra header lines of an otherwise good SSE request, sent as raw bytes."""


def problem_or_fine(status: int, content_type: str, body: bytes) -> str | None:
    """What is wrong with one answer: a 5xx, or a 4xx that is not a problem document of that status."""
    if status >= 500:
        return f"{status}: {body[:200]!r}"
    if status >= 400:
        if not content_type.startswith("application/problem+json"):
            return f"{status} as {content_type}: {body[:200]!r}"
        try:
            document = json.loads(body)
        except ValueError:
            return f"{status} with a body that is no JSON: {body[:200]!r}"
        if document.get("status") != status or not document.get("type") or not document.get("title"):
            return f"{status} with {document}"
    return None


async def ask(http: aiohttp.ClientSession, method: str, url: str, **kwargs: object) -> str | None:
    async with http.request(method, url, **kwargs) as resp:  # type: ignore[arg-type]
        body = await resp.read()
        if method == "HEAD":  # no body by definition
            return f"HEAD {url}: {resp.status}" if resp.status >= 500 else None
        return problem_or_fine(resp.status, resp.headers.get("Content-Type", ""), body)


async def raw(port: int, request: bytes) -> str | None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    answer = await reader.read()  # every request here ends with Connection: close or an error
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    match = re.search(rb"(?im)^content-type: *([^\r\n]*)", head)
    if status == 0:
        return f"no HTTP answer to {request[:80]!r}: {answer[:100]!r}"
    return problem_or_fine(status, (match.group(1) if match else b"").decode(), body if status >= 400 else b"")


async def api_answers(http: aiohttp.ClientSession, base: str) -> list[str | None]:
    """Ask every hostile request a client library can send; what is wrong with each answer."""
    key, auth = {"Authorization": f"Bearer {API_KEY}"}, {"Authorization": f"Bearer {token_for(SID)}"}
    events, agui, answers = f"{base}/v1/streams/{SID}/events", f"{base}/v1/streams/{SID}/agui", []
    for position in POSITIONS:
        answers.append(await ask(http, "GET", events, headers={**auth, "Last-Event-ID": position}))
        answers.append(await ask(http, "GET", f"{events}?last_event_id={quote(position, safe='')}", headers=auth))
        answers.append(await ask(http, "GET", agui, headers={**auth, "Last-Event-ID": position}))
    answers += [await ask(http, "GET", events + query, headers=auth) for query in QUERIES]
    for value in AUTHS:
        for path in (f"/v1/streams/{SID}/events", f"/v1/streams/{SID}", f"/v1/streams/{SID}/ui",
                     f"/v1/streams/{SID}/agui"):
            answers.append(await ask(http, "GET", base + path, headers={"Authorization": value}))
    answers += [await ask(http, "GET", base + path, headers=auth) for path in PATHS]
    for body in BODIES:
        for content_type in ("application/json", "text/plain", "application/json; charset=latin-1"):
            answers.append(await ask(http, "POST", f"{base}/v1/streams", data=io.BytesIO(body),
                                     headers={**key, "Content-Type": content_type}))
    for body in [b"", b"{}", b'{"scope":"internal"}', b'{"scope":1}', b"[", b'{"scope":"public","x":1}', b"null"]:
        for action in ("tokens", "cancel"):
            answers.append(await ask(http, "POST", f"{base}/v1/streams/{SID}/{action}", data=body, headers=key))
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"):
        answers += [await ask(http, method, events, headers=auth), await ask(http, method, f"{base}/v1/streams")]
    return answers


async def raw_answers(port: int) -> list[str | None]:
    """Send every hostile request as raw bytes; what is wrong with each answer."""
    request = (f"GET /v1/streams/{SID}/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
               f"Authorization: Bearer {token_for(SID)}\r\n").encode()
    answers = [await raw(port, request + extra + b"\r\n") for extra in RAW]
    return answers + [await raw(port, line) for line in (
        b"GET /v1/streams/\xff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET http://evil/v1/streams/%b/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % SID.encode(),
        b"POST /v1/streams HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\nConnection: close\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n")]


async def test_hostile_requests_get_documented_answers_and_the_publisher_serves_on(
        server: RedisServer, client: aioredis.Redis, keys: Keys, start_publisher: StartPublisher) -> None:
    publisher = await start_publisher(server.url, keys.prefix, FANOUT_MAX_BODY_BYTES=1 << 20, FANOUT_LOG_LEVEL="DEBUG")
    script = text_script(SID, 12, terminal=True)
    await Writer(client, keys).meta(SID)
    await Writer(client, keys).store(script.events)
    async with aiohttp.ClientSession() as http:
        answers = await api_answers(http, publisher.base) + await raw_answers(publisher.port)
        assert [answer for answer in answers if answer is not None] == []
        reader = Follower(publisher.base, SID, token_for(SID))
        await reader.run(http)
    assert reader.seqs == list(range(1, 13))
    assert log_problems(publisher.log()) == []
