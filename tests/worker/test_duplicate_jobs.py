"""A job stored twice (its XADD re-sent after the reply was lost) runs its stream once.

Claiming the second entry would fence the healthy run of the first one and end the
stream ``worker_lost``; instead the second entry is acked as a duplicate while the first
is pending, and claims the stream only when the first is gone (nobody runs it).
"""

from __future__ import annotations

import pytest

from schema.keys import Keys
from tests.worker.support import fake_upstream, make_job, meta, running_worker, settings_for, submit, wait_done
from worker.lease import Leases

pytestmark = pytest.mark.topologies


async def test_a_claim_from_another_entry_of_a_running_stream_is_a_duplicate(redis_client, keys: Keys) -> None:
    leases = Leases(redis_client, keys, consumer="c1", lease_s=30)
    args = {"stream_id": "st_dup", "provider": "openai_chat", "model": "m", "now_ms": 1}
    first = await leases.claim(entry_id=f"{keys.jobs_shard(0)}/1-0", **args)
    second = await leases.claim(entry_id=f"{keys.jobs_shard(0)}/2-0", **args)
    assert (first.token, first.duplicate_of) == (1, "")
    assert (second.token, second.duplicate_of) == (0, f"{keys.jobs_shard(0)}/1-0")
    forced = await leases.claim(entry_id=f"{keys.jobs_shard(0)}/2-0", force=True, **args)
    assert (forced.token, forced.duplicate_of) == (2, "")
    assert (await meta(redis_client, keys, "st_dup"))["job_id"] == f"{keys.jobs_shard(0)}/2-0"


async def test_the_same_job_stored_twice_runs_once_and_both_entries_leave(redis_client, keys: Keys,
                                                                        redis_url: str) -> None:
    job = make_job("openai_chat", "simple_text_greek_usage_chunk")
    async with fake_upstream() as (base, state):
        settings = settings_for(base, redis_url, keys, concurrency=4)
        async with running_worker(settings, keys, consumer="w1"), running_worker(settings, keys, consumer="w2"):
            await submit(redis_client, keys, job)
            await submit(redis_client, keys, job)
            done = await wait_done(redis_client, keys, job.stream_id)
    assert (done["status"], done["token"]) == ("completed", "1")
    assert len(state.requests) == 1
    assert await redis_client.xlen(keys.jobs_shard(0)) == 0


async def test_a_duplicate_whose_first_entry_is_gone_takes_the_stream_over(redis_client, keys: Keys,
                                                                         redis_url: str) -> None:
    job = make_job("openai_chat", "simple_text_greek_usage_chunk")
    await redis_client.hset(keys.meta(job.stream_id), mapping={  # a run whose entry vanished (never pending)
        "state": "running", "last_seq": 0, "token": 1, "job_id": f"{keys.jobs_shard(0)}/1-1"})
    async with fake_upstream() as (base, _state), running_worker(settings_for(base, redis_url, keys), keys):
        await submit(redis_client, keys, job)
        done = await wait_done(redis_client, keys, job.stream_id)
    assert (done["status"], done["token"]) == ("completed", "2")
