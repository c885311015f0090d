"""Readiness under Redis write refusals, ``fanout health``, and readers of a stream storage ended.

Servers that are filled or turned into replicas are private ones (:mod:`tests.worker.redis_proc`),
never the shared Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from publisher.live import classic_link
from schema.contract import BlockRef, BlockStart, ErrorInfo, StreamError, StreamStart, encode_event
from schema.keys import Keys
from tests.publisher.helpers import API_KEY, make_settings, running_publisher
from tests.worker.redis_proc import RedisProcess, private_redis
from worker.appender import Appender
from worker.lease import Leases

ROOT = Path(__file__).resolve().parents[2]
GUARD_S = 15.0


def _publisher(redis_url: str, keys: Keys, **settings: object) -> contextlib.AbstractAsyncContextManager[str]:
    return running_publisher(redis_url, keys, make_settings(**settings))


async def _ready(http: aiohttp.ClientSession, base: str) -> tuple[int, str]:
    async with asyncio.timeout(GUARD_S), http.get(f"{base}/readyz") as resp:
        body = await resp.json()
        return resp.status, str(body.get("detail", body.get("status")))


def _health(server: RedisProcess, prefix: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REDIS_URL": server.url, "FANOUT_REDIS_PREFIX": prefix}
    env.pop("FANOUT_HEALTH_URL", None)
    return subprocess.run([sys.executable, str(ROOT / "fanout_cli.py"), "health", "--timeout-s", "3"],
                          env=env, capture_output=True, text=True, timeout=GUARD_S, check=False)


async def test_readyz_and_health_fail_while_redis_is_out_of_memory_and_pass_after() -> None:
    keys = Keys(prefix="faults-ready-oom")
    with private_redis() as server:
        async with _publisher(server.url, keys) as base, aiohttp.ClientSession() as http:
            assert await _ready(http, base) == (200, "ok")
            assert _health(server, keys.prefix).returncode == 0
            server.fill()
            assert await _ready(http, base) == (503, "redis: refuses writes: out of memory (OOM)")
            unhealthy = _health(server, keys.prefix)
            assert unhealthy.returncode == 1
            assert "refuses writes" in unhealthy.stderr
            assert "maxmemory" in unhealthy.stderr
            assert "Traceback" not in unhealthy.stderr
            server.unfill()
            assert await _ready(http, base) == (200, "ok")
            assert _health(server, keys.prefix).returncode == 0


async def test_readyz_and_health_fail_on_a_read_only_replica_and_pass_once_promoted() -> None:
    keys = Keys(prefix="faults-ready-ro")
    with private_redis() as primary, private_redis() as replica:
        async with _publisher(replica.url, keys) as base, aiohttp.ClientSession() as http:
            sync = replica.client()
            sync.replicaof("127.0.0.1", str(primary.port))
            assert await _ready(http, base) == (503, "redis: read-only replica (READONLY)")
            assert _health(replica, keys.prefix).returncode == 1
            sync.replicaof("NO", "ONE")
            sync.close()
            assert await _ready(http, base) == (200, "ok")
            assert _health(replica, keys.prefix).returncode == 0


async def test_probe_key_is_in_the_deployment_prefix_and_expires(redis_url: str, keys: Keys,
                                                                 redis_client: aioredis.Redis) -> None:
    async with _publisher(redis_url, keys) as base, aiohttp.ClientSession() as http:
        assert await _ready(http, base) == (200, "ok")
    ttl_ms = await redis_client.pttl(keys.probe)
    assert keys.probe.startswith(f"{keys.prefix}:")
    assert 0 < ttl_ms <= 10_000


async def test_reader_of_a_stream_storage_ended_without_event_is_ended_and_resume_gets_204(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    sid = "st_markedfailed"
    claim = await Leases(redis_client, keys, consumer="w", lease_s=30).claim(
        stream_id=sid, provider="anthropic", model="m", entry_id="1-1", now_ms=1)
    writer = Appender(redis_client, keys).writer(sid, token=claim.token, last_seq=0)
    await writer.append([StreamStart(stream_id=sid, seq=1, ts=1, provider="anthropic", model="m", metadata={}),
                         BlockStart(stream_id=sid, seq=2, ts=2, block=BlockRef(id="b0", index=0, kind="text"))])
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with _publisher(redis_url, keys, heartbeat_s=0.2) as base, aiohttp.ClientSession(headers=headers) as http:
        async with asyncio.timeout(GUARD_S), http.get(f"{base}/v1/streams/{sid}/events") as resp:
            assert resp.status == 200
            body = b""
            while body.count(b"id: ") < 2:
                body += await resp.content.readany()
            await redis_client.xadd(keys.events(sid), {"x": "foreign"})  # no 0-<seq> fits any more
            error = StreamError(stream_id=sid, seq=3, ts=3, status="failed", usage=None, finish_reason=None,
                                error=ErrorInfo(category="internal", retryable=False, message="storage error: x"))
            assert await writer.end_refused([error]) == "marked"
            body += await resp.content.read()  # the response ends at the next idle heartbeat
        assert b"id: 3" not in body
        async with http.get(f"{base}/v1/streams/{sid}/events", headers={"Last-Event-ID": "2"}) as again:
            assert again.status == 204
        async with http.get(f"{base}/v1/streams/{sid}") as status:
            state = await status.json()
    assert (state["state"], state["status"], state["last_seq"]) == ("done", "failed", 2)


async def test_readers_of_a_stream_with_lost_events_get_the_suffix_a_gap_or_a_410(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    sid = "st_lostevents"
    claim = await Leases(redis_client, keys, consumer="w", lease_s=30).claim(
        stream_id=sid, provider="anthropic", model="m", entry_id="1-1", now_ms=1)
    writer = Appender(redis_client, keys).writer(sid, token=claim.token, last_seq=0)
    ref = BlockRef(id="b0", index=0, kind="text")
    await writer.append([StreamStart(stream_id=sid, seq=1, ts=1, provider="anthropic", model="m", metadata={}),
                         BlockStart(stream_id=sid, seq=2, ts=2, block=ref)])
    writer.last_seq = 4  # seqs 3 and 4 were acknowledged by a master that died before replicating them
    error = StreamError(stream_id=sid, seq=5, ts=5, status="failed", usage=None, finish_reason=None,
                        error=ErrorInfo(category="internal", retryable=True, message="storage error: lost 3..4"))
    assert await writer.end_refused([error], jump=True) == "event"
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with _publisher(redis_url, keys) as base, aiohttp.ClientSession(headers=headers) as http:
        async with asyncio.timeout(GUARD_S), http.get(f"{base}/v1/streams/{sid}/events") as resp:
            body = await resp.read()
        assert b"id: 2" in body
        assert b"event: stream.gap" in body
        assert b"id: 5" not in body
        async with http.get(f"{base}/v1/streams/{sid}/events", headers={"Last-Event-ID": "4"}) as resp:
            assert resp.status == 200  # a reader that got 3 and 4 live gets exactly the rest
            suffix = await resp.read()
        assert b"id: 5\nevent: stream.error" in suffix
        for position in ("2", "3"):
            async with http.get(f"{base}/v1/streams/{sid}/events", headers={"Last-Event-ID": position}) as resp:
                assert resp.status == 410


async def test_an_unreachable_redis_is_logged_once_not_at_every_retry(caplog: pytest.LogCaptureFixture) -> None:
    keys = Keys(f"down{os.getpid()}")
    with caplog.at_level(logging.WARNING, logger="publisher.live.hub"):
        async with running_publisher("redis://127.0.0.1:1/0", keys):
            await asyncio.sleep(classic_link.RETRY_S * 4)  # four retries at least
    failed = [r for r in caplog.records if "pub/sub connection failed" in r.getMessage()]
    assert len(failed) == 1
    assert "1 attempts so far" in failed[0].getMessage()


async def test_a_redis_that_stops_answering_fails_requests_after_the_redis_timeout_not_never() -> None:
    """A frozen Redis (SIGSTOP: connections open, no replies) makes a status read answer 503
    and an SSE request answer 200 with a ``retry:`` hint and end, once FANOUT_REDIS_TIMEOUT_S
    (and its retries) ran out; both work again once Redis answers."""
    keys = Keys(prefix="faults-frozen")
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with private_redis() as server:
        assert server.proc is not None
        sid = "st_frozen"
        async with _publisher(server.url, keys, redis_timeout_s=0.3) as base, \
                aiohttp.ClientSession(headers=headers) as http:
            async with http.get(f"{base}/v1/streams/{sid}") as before:
                assert before.status == 404  # Redis answers: no such stream
            server.proc.send_signal(signal.SIGSTOP)
            try:
                async with asyncio.timeout(GUARD_S), http.get(f"{base}/v1/streams/{sid}") as status:
                    assert status.status == 503
                    assert (await status.json())["detail"] == "storage is unavailable; retry later"
                async with asyncio.timeout(GUARD_S), http.get(f"{base}/v1/streams/{sid}/events") as sse:
                    assert sse.status == 200
                    body = await sse.read()
                assert body.startswith(b"retry: ")
                assert b"id: " not in body
            finally:
                server.proc.send_signal(signal.SIGCONT)
            async with asyncio.timeout(GUARD_S), http.get(f"{base}/v1/streams/{sid}") as after:
                assert after.status == 404


def _one_event_stream(server: RedisProcess, keys: Keys, sid: str) -> Any:
    """Store a running stream holding its ``stream.start`` (seq 1); return a sync client of ``server``."""
    client = server.client()
    client.hset(keys.meta(sid), mapping={"state": "running", "last_seq": 1})
    client.xadd(keys.events(sid), {"e": encode_event(
        StreamStart(stream_id=sid, seq=1, ts=1, provider="anthropic", model="m", metadata={}))}, id="0-1")
    return client


async def _read_through_a_freeze(server: RedisProcess, http: aiohttp.ClientSession, url: str) -> bytes:
    """Open the SSE response, read up to seq 1, freeze Redis (SIGSTOP) and read until the response ends.

    The response must end within ``GUARD_S`` (the live audits close it); Redis is thawed after.
    """
    assert server.proc is not None
    async with http.get(url) as resp:
        assert resp.status == 200
        body = b""
        while b"id: 1\n" not in body:
            body += await asyncio.wait_for(resp.content.readany(), GUARD_S)
        server.proc.send_signal(signal.SIGSTOP)
        try:
            async with asyncio.timeout(GUARD_S):
                body += await resp.content.read()  # a clean end of the response
        finally:
            server.proc.send_signal(signal.SIGCONT)
    return body


BUSY_LUA = """
local start = redis.call('TIME')
local began = start[1] * 1000000 + start[2]
while true do
  local now = redis.call('TIME')
  if now[1] * 1000000 + now[2] - began >= tonumber(ARGV[1]) then return 1 end
end
"""
"""Keeps the server busy (answering nothing else) for ARGV[1] microseconds, then returns."""


async def test_a_slow_redis_that_answers_within_the_redis_timeout_does_not_close_live_readers() -> None:
    """Redis stalls (a long script) shorter than FANOUT_REDIS_TIMEOUT_S but longer than the
    audit interval (half a short heartbeat): every command is still answered in time, so
    the audits have not failed and the quiet live reader stays open and gets what comes after."""
    keys = Keys(prefix="faults-audit-slow")
    headers = {"Authorization": f"Bearer {API_KEY}"}
    sid = "st_auditslow"
    with private_redis() as server:
        client = _one_event_stream(server, keys, sid)
        busy = server.client()
        async with _publisher(server.url, keys, redis_timeout_s=3.0, heartbeat_s=0.5) as base, \
                aiohttp.ClientSession(headers=headers) as http, http.get(f"{base}/v1/streams/{sid}/events") as resp:
            assert resp.status == 200
            body = b""
            while b"id: 1\n" not in body:
                body += await asyncio.wait_for(resp.content.readany(), GUARD_S)
            for _ in range(4):  # stalls of 0.9 s: several audit intervals (0.25 s) each
                await asyncio.to_thread(busy.eval, BUSY_LUA, 0, 900_000)
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # a close would have come by now
            event = BlockStart(stream_id=sid, seq=2, ts=2, block=BlockRef(id="b0", index=0, kind="text"))
            client.xadd(keys.events(sid), {"e": encode_event(event)}, id="0-2")
            client.publish(keys.live(sid), b"2")
            while b"id: 2\n" not in body:
                chunk = await asyncio.wait_for(resp.content.readany(), GUARD_S)
                assert chunk, "the live reader was closed though Redis answered within its timeout"
                body += chunk
        busy.close()
        client.close()


@pytest.mark.parametrize("redis_timeout_s", [0.3, 1.0])
async def test_live_readers_of_a_redis_that_stopped_answering_are_closed_not_left_with_heartbeats(
        redis_timeout_s: float) -> None:
    """A live reader whose Redis froze (SIGSTOP: no notification, no read answers) got only
    ``: ping`` for as long as the freeze lasted, while a worker on the other side of a
    partition could go on appending. After two failed live audits its response ends, so the
    client reconnects with Last-Event-ID; after the thaw it resumes without loss.

    An audit fails once the larger of its interval and the Redis timeout passed, not after
    the client's retries and reconnects ran out: at a 1 s timeout those took about 18 s,
    past the guard."""
    keys = Keys(prefix="faults-frozen-live")
    headers = {"Authorization": f"Bearer {API_KEY}"}
    sid = "st_frozenlive"
    with private_redis() as server:
        client = _one_event_stream(server, keys, sid)
        async with _publisher(server.url, keys, redis_timeout_s=redis_timeout_s, heartbeat_s=0.4) as base, \
                aiohttp.ClientSession(headers=headers) as http:
            body = await _read_through_a_freeze(server, http, f"{base}/v1/streams/{sid}/events")
            assert body.count(b"id: ") == 1
            client.xadd(keys.events(sid), {"e": encode_event(
                BlockStart(stream_id=sid, seq=2, ts=2, block=BlockRef(id="b0", index=0, kind="text")))}, id="0-2")
            client.hset(keys.meta(sid), "last_seq", 2)
            async with asyncio.timeout(GUARD_S), http.get(f"{base}/v1/streams/{sid}/events",
                                                          headers={"Last-Event-ID": "1"}) as again:
                assert again.status == 200
                resumed = b""
                while b"id: 2\n" not in resumed:
                    resumed += await again.content.readany()
            assert b"id: 1\n" not in resumed
        client.close()
