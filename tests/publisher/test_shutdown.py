"""A real ``fanout publisher`` process: start, serve, and on SIGTERM stop accepting, then close
its SSE responses spread over FANOUT_SHUTDOWN_WINDOW_S and exit 0."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from schema.contract import encode_event
from tests.publisher.helpers import API_KEY, GUARD_S, SECRET, SSEClient, StreamWriter, bearer, block_start, delta, start

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


async def store_big_stream(ctx) -> None:
    """Seqs 1..242, 11.5 MB: more than loopback buffers hold, so a client that stops reading stalls the replay."""
    events = [start(ctx.sid), block_start(ctx.sid, 2, 0)]
    events += [delta(ctx.sid, seq, 0, "y" * 48_000) for seq in range(3, 243)]
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for event in events:
            pipe.xadd(ctx.keys.events(ctx.sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
        await pipe.execute()
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).meta(last_seq=242)


def stalled_reader(base: str, sid: str) -> socket.socket:
    """An SSE request over a socket with a 4 KB receive buffer whose status line is read; then nothing is."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect((host, int(port)))
    stalled.sendall(f"GET /v1/streams/{sid}/events HTTP/1.1\r\nHost: x\r\n"
                    f"Authorization: Bearer {API_KEY}\r\n\r\n".encode())
    stalled.settimeout(GUARD_S)
    assert stalled.recv(16).startswith(b"HTTP/1.1 200")  # the replay runs
    return stalled


async def test_a_response_blocked_on_a_stalled_client_is_cancelled_after_the_grace(ctx, spawn, redis_url):
    """A client that stops reading mid-replay holds its handler in a write (for up to
    FANOUT_WRITE_TIMEOUT_S, here 300 s): SIGTERM still ends the process once the window and
    FANOUT_SHUTDOWN_GRACE_S have passed, with that connection closed, not at the write timeout."""
    await store_big_stream(ctx)
    proc = await spawn(publisher_env(redis_url, ctx.keys.prefix, FANOUT_SHUTDOWN_WINDOW_S="0.2",
                                     FANOUT_SHUTDOWN_GRACE_S="0.5", FANOUT_WRITE_TIMEOUT_S="300"))
    stalled = stalled_reader(await wait_listening(proc), ctx.sid)
    try:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), GUARD_S) == 0
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := stalled.recv(1 << 20):  # what the kernel held, then the close
                received += chunk
        assert not received.endswith(b"\r\n0\r\n\r\n")  # no last chunk: the client sees a cut, not an end
        assert received.count(b"\nid: ") < 242
        assert proc.stderr is not None
        assert b"then 0.5s for what still runs" in await proc.stderr.read()
    finally:
        stalled.close()


@pytest.mark.parametrize("grace_s", [0.0, 2.0])
async def test_the_grace_bounds_the_whole_wait_and_zero_means_none(ctx, spawn, redis_url, grace_s):
    """FANOUT_SHUTDOWN_GRACE_S is the whole wait for what still runs after the window: 0 cancels a
    response blocked on a stalled client at once (aiohttp's 0 is "no limit": the process waited
    for the 300 s write timeout), and 2 takes about 2 s (aiohttp waits the grace, cancels, then
    waits the grace again: 4 s, past the chart's terminationGracePeriodSeconds budget)."""
    await store_big_stream(ctx)
    proc = await spawn(publisher_env(redis_url, ctx.keys.prefix, FANOUT_SHUTDOWN_WINDOW_S="0",
                                     FANOUT_SHUTDOWN_GRACE_S=str(grace_s), FANOUT_WRITE_TIMEOUT_S="300"))
    stalled = stalled_reader(await wait_listening(proc), ctx.sid)
    try:
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), GUARD_S) == 0
        assert time.monotonic() - began < grace_s * 1.25 + 0.75
        assert proc.stderr is not None
        text = (await proc.stderr.read()).decode()
        assert "Traceback" not in text
        assert "ERROR" not in text
    finally:
        stalled.close()


async def test_the_window_is_not_waited_out_once_every_client_left(ctx, spawn, redis_url):
    """Two readers, a 600 s window: the first is closed at SIGTERM, the second's client then
    leaves, and the process exits instead of waiting the 300 s step for nobody."""
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    proc = await spawn(publisher_env(redis_url, ctx.keys.prefix, FANOUT_SHUTDOWN_WINDOW_S="600"))
    base = await wait_listening(proc)
    async with aiohttp.ClientSession() as http:
        responses = [await http.get(f"{base}/v1/streams/{ctx.sid}/events", headers=bearer(API_KEY)) for _ in range(2)]
        clients = [SSEClient(resp) for resp in responses]
        for client in clients:
            assert (await client.next_event())["id"] == "1"
        proc.send_signal(signal.SIGTERM)
        done, pending = await asyncio.wait([asyncio.ensure_future(c.message()) for c in clients],
                                           timeout=GUARD_S, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1  # one closed at once, the other waits its turn
        for task in pending:
            task.cancel()
        for resp in responses:
            resp.close()  # the client still waiting leaves
        assert await asyncio.wait_for(proc.wait(), GUARD_S) == 0


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
            assert line, f"the publisher exited before listening: {lines}"  # EOF: readline never waits again
            lines.append(line)
    assert any("WARNING" in line and "random per-process secret" in line for line in lines)
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), GUARD_S) == 0
