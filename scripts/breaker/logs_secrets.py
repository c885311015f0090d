"""Logs attack: the whole stack at DEBUG, in both formats, must never print a credential; json lines must parse.

Usage: .venv/bin/python -m scripts.breaker.logs_secrets [logfmt|json ...]

A private redis-server with ``requirepass``; REDIS_URL carries the password. Provider keys,
API keys, read tokens (header and ``?token=``), OTLP exporter headers and an OTLP endpoint
with a key in its query are all distinct marker strings. Jobs for all four providers (some
ending in errors), malformed requests, Redis connection kills and a short Redis outage make
the processes log. Every line of every process log is scanned for every marker; in ``json``
every line must be one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import redis.asyncio as aioredis

from publisher.stack import LocalStack
from scripts.breaker.ra_harness import free_port

PASSWORD = "REDISPASSmarker7391"
MARKERS = {
    "redis password": PASSWORD,
    "openai key": "sk-OPENAImarker1234",
    "anthropic key": "sk-ant-ANTHROPICmarker",
    "gemini key": "AIzaGEMINImarker5678",
    "api key": "APIKEYmarker-abcdef0123",
    "token secret": "TOKENSECRETmarker" + "z" * 40,
    "otlp header": "OTLPHEADERmarker",
    "otlp query": "OTLPQUERYmarker",
}


def start_redis(port: int, workdir: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir, "--requirepass", PASSWORD],
                            stdout=subprocess.DEVNULL)
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), 0.1):
                return proc
        except OSError:
            time.sleep(0.02)
    raise RuntimeError("redis did not start")


CASES = [("openai_chat", "simple_text_greek_usage_chunk"), ("anthropic", "thinking_with_signature"),
         ("anthropic", "error_after_partial_text"), ("gemini", "candidate_index_other_ignored"),
         ("openai_responses", "both_reasoning_sources_reads_first"), ("anthropic", "no_such_case_at_all")]


def request_for(provider: str) -> dict[str, object]:
    prompt = "hello " + MARKERS["api key"][:0]
    if provider == "openai_responses":
        return {"input": prompt}
    if provider == "gemini":
        return {"contents": [{"role": "user", "parts": [{"text": prompt}]}]}
    if provider == "anthropic":
        return {"max_tokens": 64, "messages": [{"role": "user", "content": prompt}]}
    return {"messages": [{"role": "user", "content": prompt}]}


async def raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        out = await asyncio.wait_for(reader.read(4096), 3)
    except (TimeoutError, ConnectionError):
        out = b""
    writer.close()
    return out


async def traffic(stack: LocalStack, redis_port: int) -> None:
    base = stack.base_url
    key = MARKERS["api key"]
    port = stack.publisher_port
    async with aiohttp.ClientSession() as http:
        tokens = []
        for provider, case in CASES:
            async with http.post(f"{base}/v1/streams", headers={"Authorization": f"Bearer {key}"},
                                 json={"provider": provider, "model": case, "request": request_for(provider)}) as r:
                body = await r.json()
                tokens.append((body.get("stream_id"), body.get("token")))
        for sid, tok in tokens:
            if not sid:
                continue
            async with http.get(f"{base}/v1/streams/{sid}/events", headers={"Authorization": f"Bearer {tok}"}) as r:
                await r.read()
            async with http.get(f"{base}/v1/streams/{sid}/events?token={tok}") as r:
                await r.read()
            async with http.get(f"{base}/v1/streams/{sid}/events?token={tok}&token={tok}x") as r:
                await r.read()
            async with http.get(f"{base}/v1/streams/{sid}/ui?token={tok}&Authorization={key}") as r:
                await r.read()
            async with http.get(f"{base}/v1/streams/{sid}", headers={"Authorization": f"Bearer {key}"}) as r:
                await r.read()
        async with http.get(f"{base}/v1/streams/nope/events", headers={"Authorization": f"Bearer {key}x"}) as r:
            await r.read()
        async with http.post(f"{base}/v1/streams", headers={"Authorization": f"Bearer {key}"},
                             data=b'{"provider": "openai_chat", "model": "' + key.encode() + b'", "request": 5}') as r:
            await r.read()
    # malformed requests: the parser's errors name the peer and the class only
    await raw(port, b"GET /v1/streams/x/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode()
              + b"\r\nX-Bad\x01Header: " + key.encode() + b"\r\n\r\n")
    await raw(port, b"GET /v1/streams/x/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode()
              + b"\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
    await raw(port, b"GET /?token=" + key.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: " + b"A" * 20000
              + key.encode() + b"\r\n\r\n")
    await raw(port, b"GET /v1/streams/x\n/events?token=" + key.encode() + b" HTTP/1.1\r\n\r\n")
    await raw(port, b"\x16\x03\x01" + key.encode() + b"\r\n\r\n")
    # Redis trouble: kill every connection, then a short outage
    admin = aioredis.Redis(host="127.0.0.1", port=redis_port, password=PASSWORD)
    await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    await admin.aclose()
    async with aiohttp.ClientSession() as http:
        for provider, case in CASES[:3]:
            async with http.post(f"{base}/v1/streams", headers={"Authorization": f"Bearer {key}"},
                                 json={"provider": provider, "model": "slow-" + case,
                                       "request": request_for(provider)}) as r:
                await r.read()
    await asyncio.sleep(3)


def scan(logdir: Path, fmt: str) -> list[str]:
    failures = []
    for path in sorted(logdir.glob("*.log")):
        text = path.read_text(encoding="utf-8", errors="replace")
        for name, marker in MARKERS.items():
            for token in {marker, marker[:12]}:
                if token in text:
                    line = next(ln for ln in text.splitlines() if token in ln)
                    failures.append(f"{path.name}: {name} in log: {line[:300]}")
                    break
        if fmt == "json":
            for number, line in enumerate(text.splitlines(), 1):
                try:
                    obj = json.loads(line)
                    if not isinstance(obj, dict) or {"ts", "level", "logger", "msg"} - obj.keys():
                        failures.append(f"{path.name}:{number}: not a record: {line[:200]}")
                except ValueError:
                    failures.append(f"{path.name}:{number}: not JSON: {line[:200]}")
        lines = text.splitlines()
        levels = {ln.split("level=", 1)[1].split()[0] for ln in lines if fmt == "logfmt" and "level=" in ln}
        print(f"  {path.name}: {len(lines)} lines {sorted(levels)[:6]}")
    return failures


async def main(formats: list[str]) -> int:
    failures: list[str] = []
    for fmt in formats or ["logfmt", "json"]:
        port = free_port()
        workdir = tempfile.mkdtemp(prefix="brk-logs-")
        redis = start_redis(port, workdir)
        otlp = free_port()
        env = {
            "FANOUT_LOG_LEVEL": "DEBUG", "FANOUT_LOG_FORMAT": fmt,
            "OPENAI_API_KEY": MARKERS["openai key"], "ANTHROPIC_API_KEY": MARKERS["anthropic key"],
            "GEMINI_API_KEY": MARKERS["gemini key"], "FANOUT_API_KEYS": MARKERS["api key"],
            "FANOUT_TOKEN_SECRET": MARKERS["token secret"], "FANOUT_MAX_RETRIES": "2",
            "OTEL_TRACES_EXPORTER": "otlp", "OTEL_LOGS_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp}/?api_key={MARKERS['otlp query']}",
            "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {MARKERS['otlp header']},x-api-key={MARKERS['otlp header']}",
            "OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_BLRP_SCHEDULE_DELAY": "200", "OTEL_METRIC_EXPORT_INTERVAL": "500",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        }
        url = f"redis://default:{PASSWORD}@127.0.0.1:{port}/0"
        stack = LocalStack(url, env=env)
        stack.api_key = MARKERS["api key"]
        stack.keep_logs = True
        try:
            with stack:
                await traffic(stack, port)
                redis.terminate()
                redis.wait()
                await asyncio.sleep(2.5)  # every process sees Redis gone
                redis = start_redis(port, workdir)
                await asyncio.sleep(2.5)
        finally:
            redis.terminate()
            redis.wait()
        print(f"{fmt}: logs in {stack.logdir}")
        failures += [f"{fmt}: {f}" for f in scan(stack.logdir, fmt)]
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
