"""A jobs group recreated under a running job does not make its own worker start it twice.

When the ``workers`` group is lost while its stream keeps its entries (``XGROUP DESTROY``
by mistake, say), the worker recreates it at id 0 (``NOGROUP``), so every entry still in the
stream, the running jobs' included, is delivered again by ``XREADGROUP ... >``. The worker
that runs the job already must not start a second run of that same entry: the second claim
took a new fencing token, fenced the first run out and, finding events stored, ended a
healthy stream ``interrupted``/``worker_lost``; and the two runs shared one ``runs`` slot, so
the first run's end forgot the second (cancel could no longer reach it). Entries this
process is running are skipped as they already are when ``XAUTOCLAIM`` hands them back; the
redelivered entry is pending for this very consumer, so its lease renewals go on.
"""

from __future__ import annotations

import pytest

from infra.redis_client import RedisClient
from schema.keys import JOBS_GROUP, Keys
from tests.worker.support import (
    fake_upstream,
    make_job,
    meta,
    running_worker,
    settings_for,
    submit,
    wait_done,
    wait_for,
)
from tools.upstream import ServerConfig

MODEL = "slow-simple_text_cyrillic_usage_chunk"


@pytest.mark.topologies
async def test_a_running_job_redelivered_to_its_own_worker_is_not_started_twice(
        redis_url: str, keys: Keys, redis_client: RedisClient) -> None:
    shard = keys.jobs_shard(0)
    async with fake_upstream(ServerConfig(delay_ms=1, slow_delay_ms=100, chunk_bytes=256)) as (base, _), \
            running_worker(settings_for(base, redis_url, keys), keys):
        job = make_job("openai_chat", MODEL)
        await submit(redis_client, keys, job)

        async def started() -> bool:
            return int((await meta(redis_client, keys, job.stream_id)).get("last_seq", "0")) >= 1

        await wait_for(started)
        await redis_client.xgroup_destroy(shard, JOBS_GROUP)  # the entry stays, its delivery is forgotten

        async def redelivered() -> bool:  # the recreated group handed the entry out again
            groups = await redis_client.xinfo_groups(shard)
            return any(g["name"].decode() == JOBS_GROUP and g["pending"] >= 1 for g in groups) \
                or (await meta(redis_client, keys, job.stream_id)).get("state") == "done"

        await wait_for(redelivered)
        ended = await wait_done(redis_client, keys, job.stream_id)
    assert ended["status"] == "completed", ended
    assert ended["token"] == "1", ended  # claimed once
