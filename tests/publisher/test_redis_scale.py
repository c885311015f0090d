"""Sharded jobs, retention and group recovery, publisher and worker together on a single node and on the cluster.

Every test runs on real Redis servers (the machine's node and the session's 3-master test
cluster) with a real publisher on a port and a real worker against the fake provider.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp
import pytest

from infra.redis_client import primary_clients
from schema.keys import JOBS_GROUP, Keys, shard_of
from tests.conftest import is_cluster_url
from tests.publisher.conftest import Ctx, StartApp
from tests.publisher.helpers import API_KEY, bearer, make_settings
from tests.worker.support import (
    fake_upstream,
    make_job,
    node_command_calls,
    running_worker,
    settings_for,
    submit,
    wait_done,
    wait_for,
)
from tools.upstream import ServerConfig
from worker.intake import Intake

pytestmark = pytest.mark.topologies

MODEL = "simple_text_cyrillic_usage_chunk"
"""A fake-provider case that completes quickly."""
JOB_COMMANDS = ["xreadgroup", "xautoclaim", "xack", "xdel", "xclaim"]
"""Commands that only ever touch jobs streams (the appends' XADDs and EVALSHAs do not count)."""


def _body(prompt: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"provider": "openai_chat", "model": MODEL,
            "request": {"messages": [{"role": "user", "content": prompt}]}, **fields}


async def _submit(ctx: Ctx, server: Any, body: dict[str, Any]) -> dict[str, Any]:
    async with ctx.http.post(server.url("/v1/streams"), json=body, headers=bearer(API_KEY)) as resp:
        assert resp.status == 201, await resp.text()
        return dict(await resp.json())


async def _read_to_end(ctx: Ctx, server: Any, answer: dict[str, Any]) -> str:
    url = server.url(answer["events_url"]) + f"?token={answer['token']}"
    async with ctx.http.get(url, timeout=aiohttp.ClientTimeout(total=15)) as resp:
        assert resp.status == 200
        return await resp.text()


async def _every_value(redis: Any, prefix: str) -> list[bytes]:
    """Every key name and stored value under ``prefix`` on every master: all types."""
    out: list[bytes] = []
    for node in await primary_clients(redis):
        try:
            async for key in node.scan_iter(match=f"{prefix}:*", count=500):
                out.append(key)
                kind = (await node.type(key)).decode()
                if kind == "stream":
                    for _id, fields in await node.xrange(key):
                        out += [part for pair in fields.items() for part in pair]
                elif kind == "hash":
                    out += [part for pair in (await node.hgetall(key)).items() for part in pair]
                elif kind == "string":
                    out.append(await node.get(key))
                elif kind == "set":
                    out += list(await node.smembers(key))
                elif kind == "list":
                    out += list(await node.lrange(key, 0, -1))
                elif kind == "zset":  # P:compact: finished streams awaiting compaction
                    out += list(await node.zrange(key, 0, -1))
                else:
                    raise AssertionError(f"unexpected key type {kind} of {key!r}")
        finally:
            await node.aclose()
    return out


def _even_ids(shards: int, *, per_shard: int) -> list[str]:
    """Stream ids that land ``per_shard`` in each shard (so the share measures the slot map, not luck)."""
    ids: dict[int, list[str]] = {n: [] for n in range(shards)}
    while any(len(v) < per_shard for v in ids.values()):
        sid = f"st_{uuid.uuid4().hex}"
        bucket = ids[shard_of(sid, shards)]
        if len(bucket) < per_shard:
            bucket.append(sid)
    return [sid for bucket in ids.values() for sid in bucket]


async def _jobs_lengths(redis: Any, keys: Keys, shards: int) -> list[int]:
    return [await redis.xlen(stream) for stream in keys.jobs_streams(shards)]


async def test_no_prompt_stays_in_any_redis_key_once_the_stream_ended(ctx: Ctx, start_app: StartApp,
                                                                     redis_url: str) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    server = await start_app(make_settings(job_shards=4))
    async with fake_upstream() as (base, _state), running_worker(settings_for(base, redis_url, ctx.keys), ctx.keys):
        answers = [await _submit(ctx, server, _body(f"say {marker} {n}", metadata={"n": str(n)})) for n in range(6)]
        for answer in answers:
            assert '"status":"completed"' in (await _read_to_end(ctx, server, answer)).replace(" ", "")
        values = await _every_value(ctx.redis, ctx.keys.prefix)
    assert values, "the scan found the stream's keys"
    assert not [v for v in values if marker.encode() in v]
    assert await _jobs_lengths(ctx.redis, ctx.keys, 4) == [0, 0, 0, 0]


async def test_jobs_of_every_recorded_shard_count_are_served(ctx: Ctx, start_app: StartApp, redis_url: str) -> None:
    await start_app(make_settings(job_shards=8))  # records 8 in P:jobshards; the worker's own setting is 1
    jobs = [make_job("openai_chat", MODEL) for _ in range(8)]
    for job in jobs:
        await submit(ctx.redis, ctx.keys, job, shards=8)
    async with fake_upstream() as (base, _state), running_worker(settings_for(base, redis_url, ctx.keys), ctx.keys):
        for job in jobs:
            assert (await wait_done(ctx.redis, ctx.keys, job.stream_id))["status"] == "completed"
    assert len({ctx.keys.parse_job_ref((await ctx.redis.hget(ctx.keys.meta(j.stream_id), "job_id")).decode())[0]
                for j in jobs}) > 1, "the jobs went to several shards"
    assert await _jobs_lengths(ctx.redis, ctx.keys, 8) == [0] * 8


async def test_the_legacy_jobs_stream_is_still_served_and_emptied(ctx: Ctx, redis_url: str) -> None:
    job = make_job("openai_chat", MODEL)
    await ctx.redis.xgroup_create(ctx.keys.jobs, JOBS_GROUP, id="0", mkstream=True)
    await submit(ctx.redis, ctx.keys, job, stream=ctx.keys.jobs)  # as the previous release enqueued
    async with fake_upstream() as (base, _state), running_worker(settings_for(base, redis_url, ctx.keys), ctx.keys):
        assert (await wait_done(ctx.redis, ctx.keys, job.stream_id))["status"] == "completed"

        async def deleted() -> bool:
            return await ctx.redis.xlen(ctx.keys.jobs) == 0

        await wait_for(deleted)


async def test_a_destroyed_group_is_recreated_and_intake_carries_on(ctx: Ctx, redis_url: str) -> None:
    async with fake_upstream() as (base, _state), running_worker(settings_for(base, redis_url, ctx.keys), ctx.keys):
        stream = ctx.keys.jobs_shard(0)
        await ctx.redis.delete(stream)  # what Redis losing its data looks like: no stream, no group
        await asyncio.sleep(0.2)
        job = make_job("openai_chat", MODEL)
        await submit(ctx.redis, ctx.keys, job)  # XADD recreates the stream, without the group
        assert (await wait_done(ctx.redis, ctx.keys, job.stream_id))["status"] == "completed"
    assert [g["name"].decode() for g in await ctx.redis.xinfo_groups(stream)] == [JOBS_GROUP]


async def test_readyz_restores_a_group_that_went_missing(ctx: Ctx) -> None:
    """A vanished ``workers`` group (Redis lost its data) is recreated by ``/readyz`` from id 0, as a worker does."""
    url = ctx.server.url("/readyz")
    async with ctx.http.get(url) as resp:
        assert resp.status == 200  # the publisher created its shards' groups at start
    stream = ctx.keys.jobs_shard(0)
    await ctx.redis.xgroup_destroy(stream, JOBS_GROUP)
    assert await ctx.redis.xinfo_groups(stream) == []
    async with ctx.http.get(url) as resp:
        assert resp.status == 200
    groups = await ctx.redis.xinfo_groups(stream)
    assert [g["name"].decode() for g in groups] == [JOBS_GROUP]
    assert groups[0]["last-delivered-id"] in (b"0-0", "0-0")  # jobs stored before it are still delivered


async def test_sixteen_shards_spread_the_job_commands_over_the_masters(ctx: Ctx, start_app: StartApp, redis_url: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    if not is_cluster_url(redis_url):
        pytest.skip("the per-node share is a cluster property")
    server = await start_app(make_settings(job_shards=16))
    before = await node_command_calls(ctx.redis, JOB_COMMANDS)
    async with fake_upstream() as (base, _state), running_worker(
            settings_for(base, redis_url, ctx.keys, job_shards=16, concurrency=8), ctx.keys):
        answers = [await _submit(ctx, server, _body(stream_id=sid)) for sid in _even_ids(16, per_shard=3)]
        for answer in answers:
            await wait_done(ctx.redis, ctx.keys, answer["stream_id"])
    calls = [after - first for after, first in zip(await node_command_calls(ctx.redis, JOB_COMMANDS), before,
                                                   strict=True)]
    print(f"job commands per master with 16 shards: {calls}, largest share {max(calls) / sum(calls):.0%}")
    assert len(calls) == 3
    # 16 shard readers share 8 slots: none may ask Redis for 0 jobs when the others filled them
    assert not [r for r in caplog.records if "intake_failed" in r.getMessage()]
    assert max(calls) <= 0.6 * sum(calls), calls  # spread (one stream would be 100%): 39-55% seen with these ids


async def test_a_blocking_read_costs_one_command_on_the_cluster(redis_client: Any, keys: Keys, redis_url: str) -> None:
    """The cluster client routes XREADGROUP itself: no ``COMMAND GETKEYS`` round trips (infra.redis_client)."""
    if not is_cluster_url(redis_url):
        pytest.skip("a cluster-client property (and the shared single node counts other clients' reads)")
    intake = Intake(redis_client, keys, consumer="c", lease_s=30)
    await intake.ensure_groups()
    before = await node_command_calls(redis_client, ["command|getkeys", "xreadgroup"])
    for _ in range(5):
        await intake.read_new(keys.jobs_shard(0), 1, block_ms=1)
    after = await node_command_calls(redis_client, ["command|getkeys", "xreadgroup"])
    assert sum(after) - sum(before) == 5


async def test_readers_of_many_shards_never_run_more_jobs_than_the_slots(ctx: Ctx, redis_url: str) -> None:
    jobs = [make_job("openai_chat", f"slow-{MODEL}") for _ in range(8)]
    for job in jobs:
        await submit(ctx.redis, ctx.keys, job, shards=8)  # all 8 readers return at once: only 2 may start
    most = 0
    async with fake_upstream(ServerConfig(chunk_bytes=256, delay_ms=1, slow_delay_ms=20)) as (base, _state):
        settings = settings_for(base, redis_url, ctx.keys, job_shards=8, concurrency=2)
        async with running_worker(settings, ctx.keys) as worker:

            async def all_done() -> bool:
                nonlocal most
                most = max(most, len(worker.runs))
                metas = [await ctx.redis.hget(ctx.keys.meta(j.stream_id), "state") for j in jobs]
                return all(m == b"done" for m in metas)

            await wait_for(all_done, step_s=0.002)
    assert most == 2
    assert await _jobs_lengths(ctx.redis, ctx.keys, 8) == [0] * 8
