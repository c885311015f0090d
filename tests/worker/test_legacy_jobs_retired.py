"""The legacy jobs stream ``P:jobs`` is served while it exists, and stays deleted once retired.

Earlier releases wrote jobs to the unsharded ``P:jobs``; a worker serves it "while it
exists" (docs/architecture.md, "Sharded jobs"), so an operator retires it by deleting it once empty. A
worker blocked on it then gets ``UNBLOCKED the stream key no longer exists`` (Redis 7) or,
on its next read, ``NOGROUP`` (Redis 6.2); the intake took both for a lost group and
recreated the group with ``MKSTREAM``, which put the stream back at once, so it existed
(and was read, twice per ``FANOUT_BLOCK_MS`` by every worker) forever. Nothing writes it
any more, so a missing legacy stream is retired, not lost: its reader stops. A legacy
stream that still exists but lost its group gets the group back and its jobs run.
"""

from __future__ import annotations

import pytest

from infra.groups import ensure_group
from infra.redis_client import RedisClient
from publisher.api.submit import JobShards
from schema.keys import JOBS_GROUP, Keys
from tests.worker.support import fake_upstream, make_job, running_worker, settings_for, submit, wait_done, wait_for

MODEL = "simple_text_cyrillic_usage_chunk"


@pytest.mark.topologies
async def test_a_deleted_legacy_jobs_stream_is_not_recreated(
        redis_url: str, keys: Keys, redis_client: RedisClient) -> None:
    legacy = keys.jobs
    await ensure_group(redis_client, legacy)  # left by an earlier release
    async with fake_upstream() as (base, _), \
            running_worker(settings_for(base, redis_url, keys), keys) as worker:
        old = make_job("openai_chat", MODEL)
        await submit(redis_client, keys, old, stream=legacy)  # still served while it exists
        assert (await wait_done(redis_client, keys, old.stream_id))["status"] == "completed"
        await redis_client.delete(legacy)  # retired by the operator, empty

        async def settled() -> bool:  # the stream came back, or its reader let it go
            return bool(await redis_client.exists(legacy)) or legacy not in await worker.intake.streams()

        await wait_for(settled)
        assert not await redis_client.exists(legacy)
        new = make_job("openai_chat", MODEL)
        await submit(redis_client, keys, new)  # the shards are served as before
        assert (await wait_done(redis_client, keys, new.stream_id))["status"] == "completed"
        assert not await redis_client.exists(legacy)


@pytest.mark.topologies
async def test_a_legacy_jobs_stream_that_lost_its_group_is_still_served(
        redis_url: str, keys: Keys, redis_client: RedisClient) -> None:
    legacy = keys.jobs
    await ensure_group(redis_client, legacy)
    async with fake_upstream() as (base, _), running_worker(settings_for(base, redis_url, keys), keys):
        await redis_client.xgroup_destroy(legacy, JOBS_GROUP)
        job = make_job("openai_chat", MODEL)
        await submit(redis_client, keys, job, stream=legacy)
        assert (await wait_done(redis_client, keys, job.stream_id))["status"] == "completed"
        groups = await redis_client.xinfo_groups(legacy)
        assert [g["name"].decode() for g in groups] == [JOBS_GROUP]


@pytest.mark.topologies
async def test_readiness_restores_groups_without_bringing_back_a_retired_legacy_stream(
        keys: Keys, redis_client: RedisClient) -> None:
    """``/readyz``'s group repair (:meth:`JobShards.restore_groups`) creates a missing shard, never ``P:jobs``."""
    shard = keys.jobs_shard(0)
    assert await JobShards(keys, 1).restore_groups(redis_client, [shard, keys.jobs]) == []
    assert [g["name"].decode() for g in await redis_client.xinfo_groups(shard)] == [JOBS_GROUP]
    assert not await redis_client.exists(keys.jobs)
