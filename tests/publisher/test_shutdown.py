"""A real ``fanout publisher`` process: start, serve, and on SIGTERM stop accepting, then close
its SSE responses spread over FANOUT_SHUTDOWN_WINDOW_S and exit 0."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from tests.publisher.helpers import API_KEY, GUARD_S, SECRET, SSEClient, StreamWriter, bearer, start

ROOT = Path(__file__).resolve().parents[2]
WINDOW_S = 1.5


def fanout_command() -> list[str]:
    script = Path(sys.executable).parent / "fanout"
    return [str(script)] if script.exists() else [sys.executable, "-m", "fanout_cli"]


def publisher_env(redis_url: str, prefix: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FANOUT_", "OTEL_"))}
    env.update({
        "REDIS_URL": redis_url,
        "FANOUT_REDIS_PREFIX": prefix,
        "FANOUT_API_KEYS": API_KEY,
        "FANOUT_TOKEN_SECRET": SECRET,
        "FANOUT_SHUTDOWN_WINDOW_S": str(WINDOW_S),
    })
    env.update(extra)
    return env


async def wait_listening(proc: asyncio.subprocess.Process) -> str:
    assert proc.stderr is not None
    async with asyncio.timeout(GUARD_S):
        while line := (await proc.stderr.readline()).decode():
            if match := re.search(r"listening on (http://[\d.]+:\d+)", line):
                return match.group(1)
    raise AssertionError("the publisher never said where it listens")


@pytest.fixture
async def spawn():
    procs: list[asyncio.subprocess.Process] = []

    async def run(env: dict[str, str]) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            *fanout_command(), "publisher", "--host", "127.0.0.1", "--port", "0",
            env=env, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )
        procs.append(proc)
        return proc

    yield run
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_sigterm_stops_accepting_and_closes_streams_spread_over_the_window(ctx, spawn, redis_url):
    proc = await spawn(publisher_env(redis_url, ctx.keys.prefix))
    base = await wait_listening(proc)
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/healthz") as resp:
            assert resp.status == 200
        responses = [await http.get(f"{base}/v1/streams/{ctx.sid}/events", headers=bearer(API_KEY)) for _ in range(3)]
        clients = [SSEClient(resp) for resp in responses]
        for client in clients:
            assert (await client.next_event())["id"] == "1"

        async def ended_at(client: SSEClient) -> float:
            assert await client.message() is None  # a clean end of the body, not an error
            return time.monotonic()

        endings = [asyncio.create_task(ended_at(client)) for client in clients]
        proc.send_signal(signal.SIGTERM)
        finished, _ = await asyncio.wait(endings, timeout=GUARD_S, return_when=asyncio.FIRST_COMPLETED)
        assert finished
        with pytest.raises(aiohttp.ClientConnectorError):  # no longer accepting while streams still close
            await http.get(f"{base}/healthz")
        times = sorted(await asyncio.wait_for(asyncio.gather(*endings), GUARD_S + WINDOW_S))
        for resp in responses:
            resp.close()
    assert await asyncio.wait_for(proc.wait(), GUARD_S) == 0
    assert times[-1] - times[0] >= WINDOW_S * (2 / 3) * 0.6  # spread, not all at once


async def test_publisher_refuses_to_start_without_a_token_secret(spawn, redis_url, keys):
    env = publisher_env(redis_url, keys.prefix)
    del env["FANOUT_TOKEN_SECRET"]
    proc = await spawn(env)
    assert await asyncio.wait_for(proc.wait(), GUARD_S) == 2
    assert b"FANOUT_TOKEN_SECRET" in await proc.stderr.read()


async def test_dev_mode_starts_without_a_secret_and_warns(spawn, redis_url, keys):
    env = publisher_env(redis_url, keys.prefix, FANOUT_DEV="1")
    del env["FANOUT_TOKEN_SECRET"]
    proc = await spawn(env)
    lines = []
    async with asyncio.timeout(GUARD_S):
        while "listening on" not in (line := (await proc.stderr.readline()).decode()):
            lines.append(line)
    assert any("WARNING" in line and "random per-process secret" in line for line in lines)
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), GUARD_S) == 0
