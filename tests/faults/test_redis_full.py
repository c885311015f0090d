"""A Redis that fills up under running streams and live readers: nothing stored is lost, every end is explicit.

From the fill-Redis round (``scripts/breaker6/fill_redis``; docs/faults.md). A real ``fanout
publisher`` process, a worker (in this process) and the fake provider share a private Redis
running ``maxmemory-policy noeviction``; streams run with live readers when ``maxmemory`` is
set below what Redis uses, so every write is refused (``OOM``) for longer than the worker's
retry window (``FANOUT_APPEND_RETRY_S``, 1 s here).

What held: a submission meanwhile is a 503 problem document, not a 500 and not a lost job;
every event stored before the fill is still stored; each stream ends with a
``stream.error`` (``failed``/``internal``, "out of memory") that the worker stores through
the ``allow-oom`` script; each reader gets seqs 1..n once, in order, as stored, ending with
that terminal; once memory is freed, a new stream runs to ``stream.done``. The evicting
policies (``allkeys-lru``) the round also tried lose keys by design: the README says to run
``noeviction``, and tests/publisher/test_status_history.py covers what a reader sees of a
stream whose events were evicted.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import redis.asyncio as aioredis

from schema.keys import Keys
from schema.stored_entries import entry_jsons
from tests.faults.conftest import StartPublisher
from tests.faults.polling import until
from tests.faults.procs import log_problems
from tests.faults.sse import Follower
from tests.publisher.helpers import API_KEY
from tests.redis_servers import RedisServer
from tests.worker.support import fake_upstream, running_worker, settings_for
from tools.upstream import ServerConfig

pytestmark = pytest.mark.faults

CASE = "several_blocks_thinking_text_two_tools"
BODY = {"provider": "anthropic", "model": f"slow-{CASE}",
        "request": {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}}
SLOW = ServerConfig(chunk_bytes=64, slow_delay_ms=60)
"""About 50 chunks 60 ms apart: a stream runs about three seconds."""


async def submit(http: aiohttp.ClientSession, base: str) -> tuple[int, str, dict[str, object]]:
    async with http.post(f"{base}/v1/streams", json=BODY, headers={"Authorization": f"Bearer {API_KEY}"}) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.json(content_type=None)


async def snapshot(client: aioredis.Redis, keys: Keys, sids: list[str]) -> dict[str, list[tuple[bytes, dict]]]:
    return {sid: await client.xrange(keys.events(sid)) for sid in sids}


async def test_streams_end_explicit_and_lose_nothing_stored_when_redis_is_full(
        server: RedisServer, client: aioredis.Redis, keys: Keys, start_publisher: StartPublisher) -> None:
    await client.config_set("maxmemory-policy", "noeviction")
    publisher = await start_publisher(server.url, keys.prefix, FANOUT_HEARTBEAT_S=1)
    async with fake_upstream(SLOW) as (upstream, _), running_worker(
            settings_for(upstream, server.url, keys, append_retry_s=1.0, lease_s=3.0), keys), \
            aiohttp.ClientSession() as http:
        sids = [str((await submit(http, publisher.base))[2]["stream_id"]) for _ in range(3)]
        readers = [Follower(publisher.base, sid, API_KEY) for sid in sids for _ in range(2)]
        reading = [asyncio.create_task(reader.run(http)) for reader in readers]
        await until(lambda: all(len(reader.events) >= 3 for reader in readers), "every stream runs and is read")
        before = await snapshot(client, keys, sids)
        used = int((await client.info("memory"))["used_memory"])
        await client.config_set("maxmemory", str(used - (1 << 20)))  # below what is used: every write refused
        status, content_type, problem = await submit(http, publisher.base)
        await asyncio.gather(*reading)
        after = await snapshot(client, keys, sids)
        await client.config_set("maxmemory", "0")
        fresh = await submit(http, publisher.base)
        assert fresh[0] == 201
        last = Follower(publisher.base, str(fresh[2]["stream_id"]), API_KEY)
        await last.run(http)
    assert (status, content_type, problem["status"]) == (503, "application/problem+json", 503)
    for sid in sids:
        assert after[sid][:len(before[sid])] == before[sid]  # nothing stored before the fill is gone
    for reader in readers:
        stored = {seq: data.decode() for eid, fields in after[reader.sid]
                  for seq, data in entry_jsons(reader.sid, eid, fields)}
        assert reader.seqs == sorted(stored)
        assert [data for _, data in reader.events] == [stored[seq] for seq in reader.seqs]
        assert reader.terminal == "stream.error"
        error = json.loads(reader.events[-1][1])["error"]
        assert error["category"] == "internal"
        assert "out of memory" in error["message"]
    assert last.terminal == "stream.done"
    assert await publisher.stop() == 0
    assert log_problems(publisher.log()) == []



