"""Compaction of finished streams: lossless from every position, atomic, fenced, idempotent, and swept by any worker."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

import pytest

from publisher.history.store import Store
from schema.keys import Keys
from tests.conftest import client_for, delete_prefix
from tests.publisher.helpers import StreamWriter, text_stream
from tests.redis_servers import redis_node
from tests.schema.test_stored import GOLDENS, golden_events
from tests.worker.support import fake_upstream, make_job, meta, running_worker, settings_for, submit, wait_done
from worker.compactor import Compactor

pytestmark = pytest.mark.topologies


async def _replays(store: Store, sid: str, last: int) -> list[bytes]:
    """The frames served from every position 0 .. last, read in pages of 5 (a run spans several pages)."""
    out = []
    for position in range(last + 1):
        frames, after = [], position
        while True:
            page = await store.read_after(sid, after, 5)
            frames += [entry.frame for entry in page]
            if len(page) < 5:
                break
            after = page[-1].seq
        out.append(b"".join(frames))
    return out


async def _finished(redis, keys: Keys, sid: str, events, *, epoch: bytes = b"ep") -> None:
    writer = StreamWriter(redis, keys, sid, epoch=epoch, compact=True)
    await writer.meta()
    await writer.append(*events, notify=False)
    await redis.expire(keys.events(sid), 5000)


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
async def test_every_golden_serves_the_same_bytes_from_every_seq_after_compaction(redis_client, path: Path) -> None:
    events = golden_events(path)
    sid = events[0].stream_id
    keys = Keys(prefix=f"fanouttest-{uuid.uuid4().hex[:12]}")
    try:
        await _finished(redis_client, keys, sid, events)
        store = Store(redis_client, keys, page=5)
        before = await _replays(store, sid, events[-1].seq)
        assert await Compactor(redis_client, keys, run_deltas=4).compact(sid) == "ok"
        assert await _replays(store, sid, events[-1].seq) == before
    finally:
        await delete_prefix(redis_client, keys.prefix)


async def test_compaction_keeps_ttl_tombstone_and_top_and_shrinks_the_key(redis_client, keys: Keys) -> None:
    sid = "st_shrink"
    events = text_stream(sid, 300)
    await _finished(redis_client, keys, sid, events)
    await redis_client.hset(keys.tomb(sid), mapping={"last_seq": events[-1].seq, "status": "completed"})
    await redis_client.expire(keys.tomb(sid), 9000)
    size = await redis_client.memory_usage(keys.events(sid))
    assert await Compactor(redis_client, keys).compact(sid) == "ok"
    assert await redis_client.xlen(keys.events(sid)) == 5  # start, block.start, one run, block.stop, done
    assert await redis_client.memory_usage(keys.events(sid)) < size / 3
    assert 4900 < await redis_client.ttl(keys.events(sid)) <= 5000
    assert 8900 < await redis_client.ttl(keys.tomb(sid)) <= 9000
    assert (await redis_client.xrevrange(keys.events(sid), "+", "-", count=1))[0][0] == b"0-%d" % events[-1].seq
    assert (await meta(redis_client, keys, sid))["compacted"] == "5"


async def test_a_second_compactor_finds_it_done_and_two_at_once_rewrite_once(redis_client, keys: Keys) -> None:
    sid = "st_twice"
    await _finished(redis_client, keys, sid, text_stream(sid, 50))
    outcomes = await asyncio.gather(*(Compactor(redis_client, keys).compact(sid) for _ in range(3)))
    assert sorted(outcomes) == ["already", "already", "ok"] or outcomes.count("ok") == 1
    assert await Compactor(redis_client, keys).compact(sid) == "already"


async def test_a_reader_mid_replay_continues_exactly_across_the_compaction(redis_client, keys: Keys) -> None:
    sid = "st_mid"
    events = text_stream(sid, 60)
    await _finished(redis_client, keys, sid, events)
    store = Store(redis_client, keys, page=7)
    whole = b"".join(entry.frame for entry in await store.read_after(sid, 0, 1000))
    first = await store.read_after(sid, 0, 7)
    assert await Compactor(redis_client, keys, run_deltas=16).compact(sid) == "ok"
    rest, after = [], first[-1].seq
    while page := await store.read_after(sid, after, 7):
        rest += page
        after = page[-1].seq
    assert b"".join(entry.frame for entry in [*first, *rest]) == whole


async def test_a_running_stream_is_not_compacted(redis_client, keys: Keys) -> None:
    sid = "st_running"
    writer = StreamWriter(redis_client, keys, sid, compact=True)
    await writer.meta()
    await writer.append(*text_stream(sid, 5)[:-1], notify=False)
    assert await Compactor(redis_client, keys).compact(sid) == "changed"
    assert await redis_client.xlen(keys.events(sid)) == 8


async def test_a_corrupt_entry_leaves_the_stream_alone_and_is_logged_once(redis_client, keys: Keys, caplog) -> None:
    sid = "st_corrupt"
    events = text_stream(sid, 5)
    writer = StreamWriter(redis_client, keys, sid, compact=True)
    await writer.meta()
    await writer.append(*events[:3], notify=False)
    await redis_client.xadd(keys.events(sid), {"c": b"\xc1garbage"}, id="0-4")
    await writer.append(*events[4:], notify=False)
    before = await redis_client.xrange(keys.events(sid))
    compactor = Compactor(redis_client, keys, grace_s=0)
    await compactor.schedule(sid, now_ms=0)
    with caplog.at_level(logging.ERROR, logger="fanout.worker.compactor"):
        assert await compactor.sweep() == 1
        assert await compactor.sweep() == 0
    assert await redis_client.xrange(keys.events(sid)) == before
    assert [r.message for r in caplog.records].count(
        f"event=compaction_refused stream_id={sid} reason=an entry without exactly one event "
        "(corrupt, or compacted already)") == 1


async def test_the_sweep_waits_for_the_grace_and_any_worker_takes_a_dead_ones_streams(redis_client, keys: Keys) -> None:
    sid = "st_grace"
    await _finished(redis_client, keys, sid, text_stream(sid, 20))
    await Compactor(redis_client, keys, grace_s=30).schedule(sid, now_ms=1_000)  # its worker dies now
    other = Compactor(redis_client, keys, grace_s=30)
    assert await other.sweep(now_ms=30_999) == 0
    assert await redis_client.xlen(keys.events(sid)) == 24
    assert await other.sweep(now_ms=31_000) == 1
    assert await redis_client.xlen(keys.events(sid)) == 5
    assert await redis_client.zcard(keys.compact_due) == 0


async def test_a_worker_compacts_what_it_finished_after_the_grace(redis_url: str, keys: Keys, redis_client) -> None:
    async with fake_upstream() as (base, _state):
        settings = settings_for(base, redis_url, keys, compact_grace_s=0.2, compact_sweep_s=0.05)
        async with running_worker(settings, keys):
            job = make_job("openai_chat", "text_only")
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
            store = Store(redis_client, keys, page=1000)
            before = await store.read_after(job.stream_id, 0)
            for _ in range(200):
                if "compacted" in await meta(redis_client, keys, job.stream_id):
                    break
                await asyncio.sleep(0.05)
    assert "compacted" in await meta(redis_client, keys, job.stream_id)
    after = await store.read_after(job.stream_id, 0)
    assert [e.frame for e in after] == [e.frame for e in before]


async def _frames(url: str, keys: Keys, sid: str) -> list[bytes]:
    client = client_for(url)
    try:
        return [entry.frame for entry in await Store(client, keys, page=1000).read_after(sid, 0)]
    finally:
        await client.aclose()


@pytest.mark.parametrize("kill", [False, True])
async def test_a_compaction_survives_a_redis_restart_whole(keys: Keys, kill: bool) -> None:
    sid = "st_restart"
    with redis_node(extra=["--appendonly", "yes", "--appendfsync", "always"]) as server:
        client = client_for(server.url)
        await _finished(client, keys, sid, text_stream(sid, 40))
        before = await _frames(server.url, keys, sid)
        assert await Compactor(client, keys).compact(sid) == "ok"
        await client.aclose()
        if kill:
            server.kill()
        else:
            server.stop()
        server.start()
        assert await _frames(server.url, keys, sid) == before
        with server.client() as sync:
            assert sync.xlen(keys.events(sid)) == 5
            assert sync.hget(keys.meta(sid), "compacted") == b"5"


async def test_a_promoted_replica_holds_the_whole_compaction(keys: Keys) -> None:
    sid = "st_failover"
    with redis_node() as primary, redis_node() as replica:
        with replica.client() as sync:
            sync.replicaof("127.0.0.1", primary.port)
        client = client_for(primary.url)
        await _finished(client, keys, sid, text_stream(sid, 40))
        before = await _frames(primary.url, keys, sid)
        assert await Compactor(client, keys).compact(sid) == "ok"
        for _ in range(100):
            if await client.wait(1, 100) == 1:
                break
        await client.aclose()
        primary.kill()
        with replica.client() as sync:
            sync.replicaof("NO", "ONE")
        assert await _frames(replica.url, keys, sid) == before
        with replica.client() as sync:
            assert sync.xlen(keys.events(sid)) == 5


async def test_a_worker_reclaiming_a_finished_streams_job_schedules_its_compaction(
        redis_url: str, keys: Keys, redis_client) -> None:
    job = make_job("openai_chat", "text_only")
    events = text_stream(job.stream_id, 30)
    await _finished(redis_client, keys, job.stream_id, events)  # its writer died before ZADD and ack
    await redis_client.hset(keys.meta(job.stream_id), "state", "done")
    before = await _frames(redis_url, keys, job.stream_id)
    async with fake_upstream() as (base, state):
        settings = settings_for(base, redis_url, keys, compact_grace_s=0.0, compact_sweep_s=0.05)
        async with running_worker(settings, keys):
            await submit(redis_client, keys, job)
            for _ in range(200):
                if "compacted" in await meta(redis_client, keys, job.stream_id):
                    break
                await asyncio.sleep(0.05)
        assert state.requests == []
    assert "compacted" in await meta(redis_client, keys, job.stream_id)
    assert await _frames(redis_url, keys, job.stream_id) == before
