"""A ``P:jobshards`` member that is not an ASCII decimal is skipped, never a crash.

Workers and ``/readyz`` read the shard counts publishers recorded (``SMEMBERS
P:jobshards``) and ignore members that are not counts. The check was ``str.isdigit``, which
is true for ``'²'`` and other Unicode digits that ``int`` refuses, and the decode was strict
UTF-8: such a member (a stray write, a corrupted set) raised ``ValueError`` or
``UnicodeDecodeError`` out of the worker's intake (the worker stopped at start) and out of
``/readyz`` (a 500 with a traceback instead of a readiness answer).
"""

from __future__ import annotations

from infra.groups import shard_count
from infra.redis_client import RedisClient
from schema.keys import Keys
from tests.worker.support import fake_upstream, make_job, running_worker, settings_for, submit, wait_done

MODEL = "simple_text_cyrillic_usage_chunk"
STRAY = [b"\xc2\xb2", b"\xd9\xa3", b"\xff\xfe", b"-2", b" 3", b""]
"""'²' and Arabic-Indic three (Unicode digits), bytes that are not UTF-8, a sign, a space, empty."""


def test_only_ascii_decimal_members_count() -> None:
    assert shard_count(2, [*STRAY, b"4", "5"]) == 5
    assert shard_count(2, STRAY) == 2


async def test_a_worker_and_readyz_skip_stray_shard_counts(ctx, redis_url: str, keys: Keys,
                                                           redis_client: RedisClient) -> None:
    await redis_client.sadd(keys.job_shards, *STRAY)
    async with ctx.http.get(f"{ctx.server.base_url}/readyz") as resp:
        assert resp.status == 200, await resp.text()
    async with fake_upstream() as (base, _), running_worker(settings_for(base, redis_url, keys), keys):
        job = make_job("openai_chat", MODEL)
        await submit(redis_client, keys, job)
        assert (await wait_done(redis_client, keys, job.stream_id))["status"] == "completed"
