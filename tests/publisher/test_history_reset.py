"""A Redis restored from an older snapshot never splices two generations into one answer.

The scenario the breaking pass reproduced (issue 21, item 1), on private redis-servers:
a job is submitted through the publisher and Redis takes an RDB snapshot (``SAVE``)
while it is still queued; workers then run it, a reader follows it live; Redis is
killed (SIGKILL) mid-stream and restarted from that snapshot, so the stream's events
are gone, its meta is ``queued`` again and the job is run a second time. The reader
that held seq 1..k of the first generation must never be handed seq k+1.. of the second
as if they continued it: its response ends with a ``stream.gap`` (``history-reset``), its
reconnect with ``Last-Event-ID: <k>.<epoch>`` is answered ``410 history-reset`` (before
and after the second generation ended), a fresh reader gets the second generation whole,
with its own epoch, and the status route tells a caller holding the first epoch that
its history is not this one. One and two workers, a single node and a 3-master cluster
(where only the master holding the stream's slot is restored).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis

from schema.contract import decode_event, to_builtins
from schema.keys import Keys
from tests.publisher.helpers import API_KEY, SSEClient, bearer, make_settings, running_publisher
from tests.redis_servers import RedisServer, redis_cluster, redis_node
from tests.worker.support import fake_upstream, running_worker, settings_for
from tools.upstream import ServerConfig

ROOT = Path(__file__).resolve().parents[2]
CASE = "several_blocks_thinking_text_two_tools"
pytestmark = pytest.mark.faults
"""The chaos check of issue 21 item 1: it runs with `make test` and alone with ``pytest -m faults``."""
GOLDEN = ROOT / "transcripts" / "anthropic" / f"{CASE}.events.jsonl"
HELD = 6
"""Events the live reader holds before Redis is killed."""
GUARD_S = 60.0
"""Hang guard of the whole scenario (never a performance target)."""


async def _submit(http: aiohttp.ClientSession, base: str, sid: str) -> str:
    body = {"stream_id": sid, "provider": "anthropic", "model": CASE,
            "request": {"max_tokens": 256, "messages": [{"role": "user", "content": "hi"}]}}
    async with http.post(f"{base}/v1/streams", json=body, headers=bearer(API_KEY)) as resp:
        assert resp.status == 201, await resp.text()
        return str((await resp.json())["token"])


async def _read_live(http: aiohttp.ClientSession, url: str, token: str, held: asyncio.Event,
                     frames: list[dict[str, str]]) -> None:
    """Follow the stream from the start, keeping every message with data; set ``held`` at seq :data:`HELD`."""
    async with http.get(url, headers=bearer(token)) as resp:
        assert resp.status == 200
        client = SSEClient(resp)
        while (message := await client.next_event()) is not None:
            frames.append(message)
            if "id" in message and int(message["id"].partition(".")[0]) >= HELD:
                held.set()


def _epoch_of(frames: list[dict[str, str]]) -> str:
    start = json.loads(frames[0]["data"])
    assert start["type"] == "stream.start"
    return str(start["epoch"])


def _normalized(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events without what differs between runs: stream id, ts, the epoch and stream.start's model/metadata."""
    varying = ("stream_id", "ts", "epoch", "model", "metadata")
    return [{k: v for k, v in event.items() if k not in varying} for event in events]


def _golden() -> list[dict[str, Any]]:
    return _normalized([json.loads(line) for line in GOLDEN.read_text().splitlines() if line])


async def _problem(http: aiohttp.ClientSession, url: str, token: str, last_event_id: str) -> tuple[int, dict[str, Any]]:
    async with http.get(url, headers={**bearer(token), "Last-Event-ID": last_event_id}) as resp:
        return resp.status, (await resp.json(content_type=None) if resp.status != 200 else {})


async def _status(http: aiohttp.ClientSession, url: str, token: str) -> dict[str, Any]:
    """The status document, asked again after ``Retry-After`` while the token's status reads are paced (429)."""
    while True:
        async with http.get(url, headers=bearer(token)) as resp:
            if resp.status != 429:
                return dict(await resp.json())
            await asyncio.sleep(float(resp.headers["Retry-After"]))


async def _wait_done(http: aiohttp.ClientSession, base: str, sid: str, token: str) -> dict[str, Any]:
    while True:
        status = await _status(http, f"{base}/v1/streams/{sid}", token)
        if status.get("state") == "done":
            return status
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _workers(count: int, base: str, url: str, keys: Keys, *, cluster: bool) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for n in range(count):
            settings = settings_for(base, url, keys, redis_cluster=cluster)
            await stack.enter_async_context(running_worker(settings, keys, consumer=f"w{n}"))
        yield


async def _scenario(url: str, *, cluster: bool, workers: int, node_of: Callable[[str], RedisServer]) -> None:
    keys = Keys(f"fanouttest-{uuid.uuid4().hex[:12]}")
    sid = f"st_{uuid.uuid4().hex}"
    settings = make_settings(redis_cluster=cluster)  # the default heartbeat: no audit during the regeneration
    async with fake_upstream(ServerConfig(chunk_bytes=24, delay_ms=25)) as (upstream, state), \
            running_publisher(url, keys, settings) as base, aiohttp.ClientSession() as http:
        token = await _submit(http, base, sid)
        node = node_of(keys.meta(sid))
        await asyncio.to_thread(_save, node)  # the snapshot holds the stream queued, its job not yet read
        events_url = f"{base}/v1/streams/{sid}/events"
        frames: list[dict[str, str]] = []
        held = asyncio.Event()
        async with _workers(workers, upstream, url, keys, cluster=cluster):
            reader = asyncio.create_task(_read_live(http, events_url, token, held, frames))
            await held.wait()
            await asyncio.to_thread(_restart_from_snapshot, node)
            await reader  # its response ends: it is never handed the second generation
            first = _epoch_of(frames)
            *events, gap = frames
            ids = [message["id"] for message in events]
            assert ids == [f"{n}.{first}" for n in range(1, len(ids) + 1)]
            assert len(ids) >= HELD
            assert gap["event"] == "stream.gap"
            assert json.loads(gap["data"])["reason"] == "history-reset"
            held_id = ids[-1]
            status, problem = await _problem(http, events_url, token, held_id)
            assert (status, problem["type"].rsplit("/", 1)[1]) == (410, "history-reset")
            done = await _wait_done(http, base, sid, token)
        second = str(done["epoch"])
        assert second != first
        assert done["status"] == "completed"
        assert (await _status(http, f"{base}/v1/streams/{sid}?epoch={first}", token))["history_complete"] is False
        status, problem = await _problem(http, events_url, token, held_id)
        assert (status, problem["type"].rsplit("/", 1)[1], problem["epoch"]) == (410, "history-reset", second)
        async with http.get(events_url, headers=bearer(token)) as resp:
            fresh = await SSEClient(resp).events()
        assert [m["id"] for m in fresh] == [f"{n}.{second}" for n in range(1, len(fresh) + 1)]
        decoded = [decode_event(m["data"]) for m in fresh]
        assert _normalized([to_builtins(e) for e in decoded if e is not None]) == _golden()
        assert len(state.requests) == 2  # one upstream call per generation


def _save(node: RedisServer) -> None:
    with node.client() as client:
        client.save()


def _restart_from_snapshot(node: RedisServer) -> None:
    node.kill()  # SIGKILL: nothing written since the SAVE survives
    node.start()  # same port and directory: loads dump.rdb


@pytest.mark.parametrize("workers", [1, 2])
async def test_rdb_restore_while_streaming_never_splices_generations_single_node(workers: int) -> None:
    with redis_node() as server:
        async with asyncio.timeout(GUARD_S):
            await _scenario(server.url, cluster=False, workers=workers, node_of=lambda _key: server)


@pytest.mark.parametrize("workers", [1, 2])
async def test_rdb_restore_of_the_streams_master_never_splices_generations_on_a_cluster(workers: int) -> None:
    with redis_cluster(masters=3) as cluster:
        masters = cluster.nodes[:3]

        def owner(key: str) -> RedisServer:
            for node in masters:  # the others answer MOVED
                with node.client() as client, contextlib.suppress(redis.ResponseError):
                    client.exists(key)
                    return node
            raise AssertionError(f"no master serves {key}")

        async with asyncio.timeout(GUARD_S):
            await _scenario(cluster.url, cluster=True, workers=workers, node_of=owner)

