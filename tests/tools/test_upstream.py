"""`fanout upstream`: the fake provider that streams transcripts, on real sockets."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import signal
import sys
import time
from pathlib import Path

import aiohttp
import msgspec
import pytest

from tests.worker.support import GUARD_S, fake_upstream
from tools.pacing import provider_events
from tools.upstream import DEFAULT_ROOTS, GARBAGE_BYTES, ServerConfig, add_arguments, garbage_body

ROOT = Path(__file__).resolve().parents[2]
CASES = DEFAULT_ROOTS[1]
ROUTES = {
    "openai_chat": ("/v1/chat/completions", "simple_text_cyrillic_usage_chunk"),
    "openai_responses": ("/v1/responses", "simple_text_japanese"),
    "anthropic": ("/v1/messages", "simple_text_ping_and_padding"),
    "gemini_sse": ("/v1beta/models/{model}:streamGenerateContent?alt=sse", "simple_text_crlf"),
    "gemini_json_array": ("/v1beta/models/{model}:streamGenerateContent", "simple_text"),
}


async def _post(session: aiohttp.ClientSession, base: str, directory: str, model: str,
                **kwargs: object) -> aiohttp.ClientResponse:
    path, _case = ROUTES[directory]
    body = {} if directory.startswith("gemini") else {"model": model, "stream": True}
    return await session.post(base + path.format(model=model), json=body, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("directory", sorted(ROUTES))
async def test_serves_each_provider_path_with_its_transcript(directory: str) -> None:
    case = ROUTES[directory][1]
    async with fake_upstream(ServerConfig(chunk_bytes=50, delay_ms=1)) as (base, state), aiohttp.ClientSession() as s:
        response = await _post(s, base, directory, case)
        reads = []
        while chunk := await response.content.readany():
            reads.append(chunk)
        response.release()
    assert response.status == 200
    expected_type = "application/json" if directory == "gemini_json_array" else "text/event-stream"
    assert response.headers["Content-Type"].startswith(expected_type)
    assert b"".join(reads) == (CASES / directory / f"{case}.sse").read_bytes()
    assert len(reads) > 1  # really streamed in pieces
    assert state.outcomes == ["complete"]


async def test_status_model_answers_provider_error_shape_with_retry_after() -> None:
    async with fake_upstream() as (base, _state), aiohttp.ClientSession() as s:
        anthropic = await _post(s, base, "anthropic", "status-529")
        gemini = await _post(s, base, "gemini_sse", "status-429")
        chat = await _post(s, base, "openai_chat", "status-500")
        bodies = [msgspec.json.decode(await r.read()) for r in (anthropic, gemini, chat)]
    assert anthropic.status == 529
    assert bodies[0]["error"]["type"] == "overloaded_error"
    assert gemini.status == 429
    assert bodies[1]["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert gemini.headers["Retry-After"] == "1"
    assert chat.status == 500
    assert bodies[2]["error"]["type"] == "server_error"
    assert "Retry-After" not in chat.headers


async def test_unknown_model_is_404() -> None:
    async with fake_upstream() as (base, _state), aiohttp.ClientSession() as s:
        response = await _post(s, base, "openai_responses", "no-such-case")
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "model_not_found"


async def test_hang_sends_headers_then_nothing() -> None:
    async with fake_upstream() as (base, _state), aiohttp.ClientSession() as s:
        response = await _post(s, base, "openai_chat", "hang")
        assert response.status == 200
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(response.content.readany(), 0.3)
        response.close()


async def test_pings_model_sends_only_keepalives() -> None:
    async with fake_upstream(ServerConfig(ping_interval_ms=10)) as (base, _state), aiohttp.ClientSession() as s:
        response = await _post(s, base, "anthropic", "pings")
        received = b""
        while received.count(b"\n\n") < 3:
            received += await asyncio.wait_for(response.content.readany(), GUARD_S)
        response.close()
    frames = [f for f in received.split(b"\n\n") if f]
    assert all(f == b'event: ping\ndata: {"type":"ping"}' for f in frames[:3])


async def test_slow_model_sends_one_provider_event_at_a_time_with_a_pause_between() -> None:
    config = ServerConfig(chunk_bytes=40, delay_ms=1, slow_delay_ms=150, slow_pacing="event")
    body = (CASES / "anthropic" / "simple_text_ping_and_padding.sse").read_bytes()
    async with fake_upstream(config) as (base, _state), aiohttp.ClientSession() as s:
        response = await _post(s, base, "anthropic", "slow-simple_text_ping_and_padding")
        reads, arrivals = [], []
        while chunk := await response.content.readany():
            reads.append(chunk)
            arrivals.append(time.monotonic())
        response.release()
    assert reads == provider_events(body, json_array=False)  # not 40-byte chunks
    assert len(reads) >= 3
    assert min(b - a for a, b in itertools.pairwise(arrivals)) >= 0.1


def test_the_command_paces_slow_cases_per_event_unless_told_chunk() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, "upstream")
    assert parser.parse_args([]).slow_pacing == "event"
    assert parser.parse_args(["--slow-pacing", "chunk"]).slow_pacing == "chunk"
    assert ServerConfig().slow_pacing == "chunk"  # what the tests' timings are tuned with


async def test_requests_are_recorded_with_secrets_masked_and_cleared() -> None:
    async with fake_upstream() as (base, _state), aiohttp.ClientSession() as s:
        headers = {"Authorization": "Bearer sk-very-secret", "x-api-key": "ak-secret", "X-Trace": "t1"}
        await (await _post(s, base, "openai_chat", "status-400", headers=headers)).read()
        await (await s.post(f"{base}/v1beta/models/m:streamGenerateContent?alt=sse&key=AIzaSecret", json={})).read()
        listed = await (await s.get(f"{base}/_requests")).json()
        assert (await s.delete(f"{base}/_requests")).status == 204
        after = await (await s.get(f"{base}/_requests")).json()
    chat, gemini = listed
    assert chat["headers"]["Authorization"] == "***"
    assert chat["headers"]["x-api-key"] == "***"
    assert chat["headers"]["X-Trace"] == "t1"
    assert chat["auth_present"] is True
    assert chat["body"] == {"model": "status-400", "stream": True}
    assert (chat["method"], chat["path"]) == ("POST", "/v1/chat/completions")
    assert gemini["query"] == {"alt": "sse", "key": "***"}
    assert gemini["auth_present"] is True
    assert "secret" not in msgspec.json.encode(listed).decode().lower()
    assert after == []


async def test_fanout_upstream_command_serves_until_sigterm(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fanout_cli", "upstream", "--host", "127.0.0.1", "--port", "0", "--chunk-bytes", "64",
        "--delay-ms", "1", cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), GUARD_S)).decode()
        base = line.rsplit(" ", 1)[-1].strip()
        assert base.startswith("http://127.0.0.1:")
        async with aiohttp.ClientSession() as s:
            response = await _post(s, base, "gemini_json_array", "simple_text")
            body = await response.read()
        assert body == (CASES / "gemini_json_array" / "simple_text.sse").read_bytes()
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), GUARD_S) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_gzip_model_sends_the_compressed_transcript_with_its_encoding() -> None:
    async with fake_upstream() as (base, _state), aiohttp.ClientSession(auto_decompress=False) as s:
        response = await _post(s, base, "anthropic", "gzip-simple_text_ping_and_padding")
        raw = await response.read()
    assert (response.status, response.headers["Content-Encoding"]) == (200, "gzip")
    assert gzip.decompress(raw) == (CASES / "anthropic" / "simple_text_ping_and_padding.sse").read_bytes()


async def test_gzip_status_model_sends_a_compressed_error_body() -> None:
    async with fake_upstream() as (base, _state), aiohttp.ClientSession(auto_decompress=False) as s:
        response = await _post(s, base, "openai_chat", "gzip-status-403")
        raw = await response.read()
    assert (response.status, response.headers["Content-Encoding"]) == (403, "gzip")
    assert msgspec.json.decode(gzip.decompress(raw))["error"]["message"] == "simulated HTTP 403, compressed"


@pytest.mark.parametrize("directory", ["openai_chat", "gemini_json_array"])
async def test_garbage_model_sends_the_same_random_bytes_every_time(directory: str) -> None:
    async with fake_upstream() as (base, _state), aiohttp.ClientSession() as s:
        bodies = []
        for _ in range(2):
            response = await _post(s, base, directory, "garbage")
            bodies.append(await response.read())
    assert response.status == 200
    assert bodies[0] == bodies[1] == garbage_body()
    assert len(bodies[0]) == GARBAGE_BYTES
    assert bodies[0][:1] not in (b"[", b"{", b":", b" ", b"\n", b"\r", b"\t")
