"""Logs under attack and under faults: one record per line, no forged record, no query value, no credential.

From the log rounds (``scripts/breaker/log_injection``, ``scripts/breaker/logs_secrets``;
docs/faults.md). Both log formats, at DEBUG:

* a real publisher is sent line breaks of every kind (LF, CR, ESC, NEL, CSI, U+2028/9, VT,
  FF, FS) and a forged ``level=ERROR logger=forged`` record in model names, stream ids,
  paths, query names and values and header values: every line stays one record of the
  format, none is an ERROR, none holds a raw break or escape character, no query value is
  printed (masked);
* the whole stack (fake upstream, a worker, the publisher) on a Redis with a password, with
  every credential a distinct marker, runs jobs of the four providers (one failing, one
  unknown case), is read with tokens in headers and queries, gets malformed requests, has
  its Redis connections killed and its Redis stopped and started again: no marker reaches
  any line of any process log (the Redis password given as ``?password=`` once did, fixed
  in 99a3c9a). Left alone then and here: the OTLP endpoint's own query string, which the
  OpenTelemetry SDK logs as the operator wrote it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import aiohttp
import pytest

from schema.keys import Keys
from tests.faults.conftest import StartPublisher
from tests.publisher.helpers import API_KEY
from tests.redis_servers import RedisServer, redis_node
from tools.demo.stack import LocalStack

pytestmark = pytest.mark.faults

MARK = "ZQX"
BREAKS = ["\n", "\r", "\x1b[31m", "\x85", "\x9b31m", "\u2028", "\u2029", "\x0b", "\x0c", "\x1c"]
RAW_BREAKS = ("\x85", "\x9b", "\u2028", "\u2029", "\x1b", "\x0b", "\x0c", "\x1c", "\r")
LOGFMT = re.compile(r"^ts=\S+ level=([A-Z]+) logger=(\S+) ")
GUARD_S = 30.0


def records(text: str, fmt: str) -> list[tuple[str, str]]:
    """``(level, logger)`` of every line; fails on a line that is not one record of ``fmt``."""
    out = []
    for line in text.split("\n")[:-1]:
        if fmt == "json":
            record = json.loads(line)
            assert {"ts", "level", "logger", "msg"} <= record.keys(), line
            out.append((record["level"], record["logger"]))
        else:
            match = LOGFMT.match(line)
            assert match, f"not a logfmt record: {line[:200]!r}"
            out.append((match.group(1), match.group(2)))
    return out


async def raw(port: int, request: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await reader.read()
    writer.close()


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
async def test_line_breaks_and_forged_records_in_requests_stay_inside_one_record(
        server: RedisServer, keys: Keys, start_publisher: StartPublisher, fmt: str) -> None:
    publisher = await start_publisher(server.url, keys.prefix, FANOUT_LOG_FORMAT=fmt, FANOUT_LOG_LEVEL="DEBUG")
    forged = "ts=2026 level=ERROR logger=forged msg=" + MARK
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        for i, line_break in enumerate(BREAKS):
            body = {"provider": "openai_chat", "model": f"{MARK}m{i}{line_break}{forged}",
                    "request": {"messages": [{"role": "user", "content": "x"}]}}
            async with http.post(f"{publisher.base}/v1/streams", json=body) as resp:
                assert resp.status in (201, 400)
            async with http.post(f"{publisher.base}/v1/streams",
                                 json={**body, "model": "m", "stream_id": f"st_{MARK}{line_break}x"}) as resp:
                assert resp.status == 400
    for i, line_break in enumerate(BREAKS):
        coded = "".join(f"%{b:02X}" for b in line_break.encode())
        targets = (f"/v1/streams/st_{MARK}{coded}x/events", f"/healthz?{MARK}{coded}n=v{coded}al&token=s3cr3t{MARK}",
                   f"/healthz?last_event_id={MARK}{coded}1", f"/v1/streams/st_a/events?api_key=k3y{MARK}&key=k{MARK}")
        for target in targets:
            await raw(publisher.port, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                      f"Last-Event-ID: {MARK}{i}\r\nAuthorization: Bearer {API_KEY}\r\n\r\n".encode())
        await raw(publisher.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: " + MARK.encode()
                  + line_break.encode() + forged.encode() + b"\r\nConnection: close\r\n\r\n")
    assert await publisher.stop() == 0
    text = publisher.log()
    assert MARK in text  # the hostile values were logged, escaped
    assert {level for level, _ in records(text, fmt)} <= {"DEBUG", "INFO", "WARNING"}
    assert "forged" not in {logger for _, logger in records(text, fmt)}
    assert [line[:200] for line in text.splitlines() if any(c in line for c in RAW_BREAKS)] == []
    assert not any(value in text for value in ("s3cr3t", "k3y", f"k{MARK}"))


PASSWORD = "REDISPASSmarker7391"
MARKERS = {
    "redis password": PASSWORD, "openai key": "sk-OPENAImarker1234", "anthropic key": "sk-ant-ANTHROPICmarker",
    "gemini key": "AIzaGEMINImarker5678", "api key": "APIKEYmarker-abcdef0123",
    "token secret": "TOKENSECRETmarker" + "z" * 40, "otlp header": "OTLPHEADERmarker",
}
CASES = [("openai_chat", "simple_text_greek_usage_chunk"), ("anthropic", "thinking_with_signature"),
         ("anthropic", "error_after_partial_text"), ("gemini", "candidate_index_other_ignored"),
         ("openai_responses", "both_reasoning_sources_reads_first"), ("anthropic", "no_such_case_at_all")]


def request_for(provider: str) -> dict[str, object]:
    if provider == "openai_responses":
        return {"input": "hello"}
    if provider == "gemini":
        return {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}
    return {"max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}


async def traffic(http: aiohttp.ClientSession, stack: LocalStack) -> list[tuple[str, str]]:
    """Submit every case; read each with its token in the header, the query (twice), on /ui; status with the key."""
    base, key = stack.base_url, {"Authorization": f"Bearer {MARKERS['api key']}"}
    streams = []
    for provider, case in CASES:
        async with http.post(f"{base}/v1/streams", headers=key,
                             json={"provider": provider, "model": case, "request": request_for(provider)}) as resp:
            assert resp.status == 201
            body = await resp.json()
            streams.append((body["stream_id"], body["token"]))
    for sid, token in streams:
        for url, headers in ((f"/v1/streams/{sid}/events", {"Authorization": f"Bearer {token}"}),
                             (f"/v1/streams/{sid}/events?token={token}", {}),
                             (f"/v1/streams/{sid}/events?token={token}&token={token}x", {}),
                             (f"/v1/streams/{sid}/ui?token={token}&Authorization={MARKERS['api key']}", {}),
                             (f"/v1/streams/{sid}", key)):
            async with http.get(base + url, headers=headers) as resp:
                await resp.read()
    async with http.get(f"{base}/v1/streams/nope/events", headers={"Authorization": f"Bearer {MARKERS['api key']}x"}):
        pass
    async with http.post(f"{base}/v1/streams", headers=key, data=b'{"provider": "openai_chat", "model": "'
                         + MARKERS["api key"].encode() + b'", "request": 5}'):
        pass
    return streams


async def malformed(port: int) -> None:
    """Requests an HTTP parser refuses, each holding the API key somewhere."""
    key = MARKERS["api key"].encode()
    for request in (b"GET /v1/streams/x/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key
                    + b"\r\nX-Bad\x01Header: " + key + b"\r\n\r\n",
                    b"GET /v1/streams/x/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key
                    + b"\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                    b"GET /?token=" + key + b" HTTP/1.1\r\nHost: x\r\nAuthorization: " + b"A" * 20000 + key
                    + b"\r\n\r\n",
                    b"GET /v1/streams/x\n/events?token=" + key + b" HTTP/1.1\r\n\r\n",
                    b"\x16\x03\x01" + key + b"\r\n\r\n"):
        await raw(port, request)


async def ready(http: aiohttp.ClientSession, base: str, wanted: int) -> None:
    deadline = time.monotonic() + GUARD_S
    while True:
        async with http.get(f"{base}/readyz") as resp:
            if resp.status == wanted:
                return
        assert time.monotonic() < deadline, f"/readyz never answered {wanted}"
        await asyncio.sleep(0.1)


async def test_no_credential_reaches_any_log_of_the_stack_through_errors_and_a_redis_outage() -> None:
    env = {"FANOUT_LOG_LEVEL": "DEBUG", "FANOUT_LOG_FORMAT": "json", "OPENAI_API_KEY": MARKERS["openai key"],
           "ANTHROPIC_API_KEY": MARKERS["anthropic key"], "GEMINI_API_KEY": MARKERS["gemini key"],
           "FANOUT_API_KEYS": MARKERS["api key"], "FANOUT_TOKEN_SECRET": MARKERS["token secret"],
           "FANOUT_MAX_RETRIES": "1", "OTEL_TRACES_EXPORTER": "otlp", "OTEL_LOGS_EXPORTER": "otlp",
           "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9/",
           "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {MARKERS['otlp header']}",
           "OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_BLRP_SCHEDULE_DELAY": "200", "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    with redis_node(password=PASSWORD) as server:
        stack = LocalStack(f"redis://127.0.0.1:{server.port}/0?password={PASSWORD}", workers=1, delay_ms=5, env=env)
        stack.api_key = MARKERS["api key"]
        with stack:
            async with aiohttp.ClientSession() as http:
                await ready(http, stack.base_url, 200)
                await traffic(http, stack)
                await malformed(stack.publisher_port)
                with server.client() as admin:
                    admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
                    admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
                await traffic(http, stack)
                server.stop()
                await ready(http, stack.base_url, 503)
                await asyncio.to_thread(server.start)  # the same port and password
                await ready(http, stack.base_url, 200)
                await traffic(http, stack)
            problems = stack.stop()
            logs = {path.name: path.read_text(encoding="utf-8", errors="replace")
                    for path in stack.logdir.glob("*.log")}
    assert problems == []
    assert set(logs) == {"upstream.log", "worker-1.log", "publisher.log"}
    for name, text in logs.items():
        if name != "upstream.log":  # the providers' stand-in prints its address as command output
            records(text, "json")
        for what, marker in MARKERS.items():
            assert marker[:12] not in text, f"{what} in {name}"  # its first 12 characters, so the whole too
