"""Lease renewal and release: the meta check and the jobs-stream XCLAIM as separate commands."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from schema.keys import JOBS_GROUP, Keys
from tests.worker.support import make_job, submit
from worker.intake import Intake
from worker.lease import Leases

pytestmark = pytest.mark.topologies

LEASE_S = 30.0


async def _delivered(redis: aioredis.Redis, keys: Keys, consumer: str) -> tuple[str, str, Leases, int]:
    """A job delivered to ``consumer`` and claimed by it: (entry id, stream id, its Leases, its token)."""
    await Intake(redis, keys, consumer=consumer, lease_s=LEASE_S).ensure_groups()
    job = make_job("openai_chat", "m")
    entry = await submit(redis, keys, job)
    await redis.xreadgroup(JOBS_GROUP, consumer, {keys.jobs_shard(0): ">"}, count=1)
    leases = Leases(redis, keys, consumer=consumer, lease_s=LEASE_S)
    claim = await leases.claim(stream_id=job.stream_id, provider=job.provider, model=job.model, entry_id=entry,
                               now_ms=1_000)
    return entry, job.stream_id, leases, claim.token


async def _pending(redis: aioredis.Redis, keys: Keys, entry: str) -> tuple[str, int]:
    """(owning consumer, idle ms) of the pending entry (a job ref)."""
    stream, bare = keys.parse_job_ref(entry)
    [row] = await redis.xpending_range(stream, JOBS_GROUP, min=bare, max=bare, count=1)
    return row["consumer"].decode(), int(row["time_since_delivered"])


async def _age(redis: aioredis.Redis, keys: Keys, entry: str, consumer: str, idle_ms: int) -> None:
    stream, bare = keys.parse_job_ref(entry)
    await redis.xclaim(stream, JOBS_GROUP, consumer, 0, [bare], idle=idle_ms, justid=True)


async def test_renew_resets_idle_time_of_an_owned_entry(redis_client: aioredis.Redis, keys: Keys) -> None:
    entry, sid, leases, token = await _delivered(redis_client, keys, "a")
    await _age(redis_client, keys, entry, "a", 20_000)
    assert await leases.renew(entry_id=entry, stream_id=sid, token=token) == "ok"
    owner, idle = await _pending(redis_client, keys, entry)
    assert owner == "a"
    assert idle < 5_000


async def test_renew_reports_the_cancel_flag(redis_client: aioredis.Redis, keys: Keys) -> None:
    entry, sid, leases, token = await _delivered(redis_client, keys, "a")
    await redis_client.set(keys.cancel(sid), "1", ex=60)
    await _age(redis_client, keys, entry, "a", 20_000)
    assert await leases.renew(entry_id=entry, stream_id=sid, token=token) == "cancel"
    assert (await _pending(redis_client, keys, entry))[1] < 5_000  # renewed all the same


async def test_renew_is_fenced_by_a_moved_token_without_touching_the_entry(redis_client: aioredis.Redis,
                                                                           keys: Keys) -> None:
    entry, sid, leases, token = await _delivered(redis_client, keys, "a")
    await redis_client.hincrby(keys.meta(sid), "token", 1)  # another claim of the stream
    await _age(redis_client, keys, entry, "a", 20_000)
    assert await leases.renew(entry_id=entry, stream_id=sid, token=token) == "fenced"
    assert (await _pending(redis_client, keys, entry))[1] >= 20_000  # the jobs stream was not touched


async def test_renew_never_takes_back_a_reclaimed_entry(redis_client: aioredis.Redis, keys: Keys) -> None:
    entry, sid, leases, token = await _delivered(redis_client, keys, "a")
    await _age(redis_client, keys, entry, "thief", 0)  # XAUTOCLAIM by another worker, before its claim
    assert await leases.renew(entry_id=entry, stream_id=sid, token=token) == "lost"
    assert (await _pending(redis_client, keys, entry))[0] == "thief"


async def test_renew_after_ack_is_lost(redis_client: aioredis.Redis, keys: Keys) -> None:
    entry, sid, leases, token = await _delivered(redis_client, keys, "a")
    await leases.ack(entry)
    assert await leases.renew(entry_id=entry, stream_id=sid, token=token) == "lost"


async def test_release_makes_the_entry_a_lease_idle(redis_client: aioredis.Redis, keys: Keys) -> None:
    entry, sid, leases, token = await _delivered(redis_client, keys, "a")
    assert await leases.release(entry_id=entry, stream_id=sid, token=token)
    owner, idle = await _pending(redis_client, keys, entry)
    assert (owner, idle >= LEASE_S * 1000) == ("a", True)
    taken = await redis_client.xautoclaim(keys.jobs_shard(0), JOBS_GROUP, "b", int(LEASE_S * 1000), count=1)
    assert [keys.job_ref(keys.jobs_shard(0), i.decode()) for i, _ in taken[1]] == [entry]  # reclaimable at once


async def test_release_of_an_unstarted_entry_needs_no_meta(redis_client: aioredis.Redis, keys: Keys) -> None:
    await Intake(redis_client, keys, consumer="a", lease_s=LEASE_S).ensure_groups()
    entry = await submit(redis_client, keys, make_job("openai_chat", "m"))
    await redis_client.xreadgroup(JOBS_GROUP, "a", {keys.jobs_shard(0): ">"}, count=1)
    leases = Leases(redis_client, keys, consumer="a", lease_s=LEASE_S)
    assert await leases.release(entry_id=entry)
    assert (await _pending(redis_client, keys, entry))[1] >= LEASE_S * 1000


async def test_release_refused_when_fenced_or_reclaimed(redis_client: aioredis.Redis, keys: Keys) -> None:
    entry, sid, leases, token = await _delivered(redis_client, keys, "a")
    await redis_client.hincrby(keys.meta(sid), "token", 1)
    assert not await leases.release(entry_id=entry, stream_id=sid, token=token)
    assert (await _pending(redis_client, keys, entry))[1] < LEASE_S * 1000  # not made idle

    other, other_sid, other_leases, other_token = await _delivered(redis_client, keys, "a")
    await _age(redis_client, keys, other, "thief", 0)
    assert not await other_leases.release(entry_id=other, stream_id=other_sid, token=other_token)
    assert (await _pending(redis_client, keys, other))[0] == "thief"


async def test_renewals_race_a_takeover_without_stealing(redis_client: aioredis.Redis, keys: Keys) -> None:
    entry, sid, leases, token = await _delivered(redis_client, keys, "a")
    thief = Leases(redis_client, keys, consumer="thief", lease_s=LEASE_S)

    async def take_over() -> None:
        await _age(redis_client, keys, entry, "thief", 0)
        await thief.claim(stream_id=sid, provider="openai_chat", model="m", entry_id=entry, now_ms=2_000)

    outcomes = await asyncio.gather(*(leases.renew(entry_id=entry, stream_id=sid, token=token) for _ in range(20)),
                                    take_over())
    assert set(outcomes[:-1]) <= {"ok", "fenced", "lost"}
    assert (await _pending(redis_client, keys, entry))[0] == "thief"  # never taken back
    assert await leases.renew(entry_id=entry, stream_id=sid, token=token) == "fenced"
