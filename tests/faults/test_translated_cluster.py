"""/agui and /durable on a Redis Cluster: streams on every master, read live by long-poll, SSE and AG-UI.

The session's 3-master cluster (the machine's Redis 7, sharded pub/sub), the worker's own
append script writing every event, a publisher in cluster mode. Each stream holds an
internal reasoning block; a public token resuming inside it searches the history for the
block's start (``Store.find_block_start``) on the stream's master. Nothing of the block
reaches the public token; everything else arrives, live, once.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from redis.asyncio.cluster import RedisCluster

from schema.keys import Keys
from tests.faults.sse import GUARD_S
from tests.publisher.helpers import block_start, delta, done, start, stop, token_for
from tests.publisher.test_sharded_live import _publisher, _sid_per_master, _writer
from tests.redis_servers import RedisClusterServers

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("topology", ["cluster"], indirect=True)
async def test_translated_reads_on_every_master_of_a_cluster(
        redis_url: str, redis_client: RedisCluster, keys: Keys, test_cluster: RedisClusterServers) -> None:
    await redis_client.initialize()
    sids = list(_sid_per_master(redis_client, keys).values())
    writers = {sid: await _writer(redis_client, keys, sid) for sid in sids}
    for sid in sids:
        await writers[sid].append([start(sid), block_start(sid, 2, 0, "reasoning", "internal"),
                                   delta(sid, 3, 0, "SECRET0 ", "reasoning")])
    async with _publisher(redis_url, keys, cluster=True) as base, aiohttp.ClientSession() as http:
        async def long_poll(sid: str) -> list[int]:
            url = f"{base}/v1/streams/{sid}/durable?offset={3:016d}&live=long-poll"
            async with http.get(url, headers={"Authorization": f"Bearer {token_for(sid, 'public')}"}) as resp:
                assert resp.status == 200, await resp.text()
                return [event["seq"] for event in await resp.json()]

        async def read(sid: str, path: str, headers: dict[str, str]) -> bytes:
            async with http.get(f"{base}/v1/streams/{sid}/{path}",
                                headers={"Authorization": f"Bearer {token_for(sid, 'public')}", **headers}) as resp:
                assert resp.status == 200, await resp.text()
                return await resp.read()

        reads = [asyncio.create_task(coro) for sid in sids for coro in (
            long_poll(sid), read(sid, f"durable?offset={3:016d}&live=sse", {}),
            read(sid, "agui", {"Last-Event-ID": "3"}))]
        await asyncio.sleep(0.3)  # not an outcome: the reads are more likely live when the rest is appended
        for sid in sids:
            await writers[sid].append([delta(sid, 4, 0, "SECRET1 ", "reasoning"), stop(sid, 5, 0, "reasoning"),
                                       block_start(sid, 6, 1), delta(sid, 7, 1, "said "), stop(sid, 8, 1),
                                       done(sid, 9)])
        async with asyncio.timeout(GUARD_S):
            answers = await asyncio.gather(*reads)
    for index in range(len(sids)):
        polled, sse, agui = answers[3 * index:3 * index + 3]
        assert polled[0] == 6  # the first visible event after the offset; seqs 4 and 5 are internal
        assert b"SECRET" not in sse
        assert b"SECRET" not in agui
        assert b'"streamClosed":true' in sse
        data = [json.loads(line[6:]) for line in agui.split(b"\n") if line.startswith(b"data: ")]
        assert [event["type"] for event in data][-3:] == ["TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RUN_FINISHED"]
        assert data[-3]["delta"] == "said "
