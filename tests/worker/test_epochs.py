"""Generations (contract 1.1) on the writing side: the epoch is chosen at seq 1 and fences every later batch.

A Redis restored from an older snapshot resets meta (and with it the fencing token): a
writer that extended the lost generation must not append to the one written again, even
when its token and seq happen to match. The append script stores the writer's epoch with
seq 1 and refuses ``reset`` to a batch after seq 1 whose epoch meta does not hold.
"""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from publisher.live.notification import parse_notification
from schema.contract import (
    EPOCH_PATTERN,
    BlockRef,
    BlockStart,
    ErrorInfo,
    StreamDone,
    StreamError,
    StreamStart,
    decode_event,
)
from schema.keys import Keys
from schema.stored_entries import entry_jsons
from tests.worker.support import fake_upstream, make_job, meta, running_worker, settings_for, stored_events, submit
from tests.worker.support import wait_done as wait_stream_done
from tests.worker.test_appender import _published
from worker.appender import Appender, EpochFencedError, StreamWriter, new_epoch
from worker.lease import Leases

pytestmark = pytest.mark.topologies

SID = "st_epochtest"
REF = BlockRef(id="b0", index=0, kind="text")


def _start(epoch: str) -> StreamStart:
    return StreamStart(stream_id=SID, seq=1, ts=1_000, provider="openai_chat", model="m", epoch=epoch)


async def _writer(redis: aioredis.Redis, keys: Keys, epoch: str) -> StreamWriter:
    claim = await Leases(redis, keys, consumer="c1", lease_s=30).claim(
        stream_id=SID, provider="openai_chat", model="m", entry_id="1-0", now_ms=1_000)
    return Appender(redis, keys).writer(SID, token=claim.token, last_seq=claim.last_seq, epoch=epoch)


def test_a_new_epoch_is_short_lowercase_hex_and_fresh() -> None:
    import re

    epochs = {new_epoch() for _ in range(1000)}
    assert len(epochs) == 1000
    assert all(re.fullmatch(EPOCH_PATTERN, epoch) and len(epoch) == 10 for epoch in epochs)


async def test_seq_one_stores_the_epoch_in_meta_and_the_end_in_the_tombstone(redis_client, keys: Keys) -> None:
    writer = await _writer(redis_client, keys, "e1e1e1e1e1")
    await writer.append([_start("e1e1e1e1e1")])
    assert (await meta(redis_client, keys, SID))["epoch"] == "e1e1e1e1e1"
    await writer.append([BlockStart(stream_id=SID, seq=2, ts=1_001, block=REF),
                         StreamError(stream_id=SID, seq=3, ts=1_002, status="failed", usage=None,
                                     finish_reason=None, error=ErrorInfo(category="internal", retryable=False,
                                                                         message="x"))])
    tomb = await redis_client.hgetall(keys.tomb(SID))
    assert tomb[b"epoch"] == b"e1e1e1e1e1"


async def test_a_batch_of_another_generation_is_refused_and_stores_nothing(redis_client, keys: Keys) -> None:
    writer = await _writer(redis_client, keys, "e1e1e1e1e1")
    await writer.append([_start("e1e1e1e1e1")])
    stale = await _writer(redis_client, keys, "0ld0ld0ld0")  # its token is current: only the epoch differs
    stale.last_seq = 1
    with pytest.raises(EpochFencedError, match="another generation"):
        await stale.append([BlockStart(stream_id=SID, seq=2, ts=1_001, block=REF)])
    assert len(await redis_client.xrange(keys.events(SID))) == 1


async def test_a_writer_of_a_lost_generation_cannot_append_to_a_restored_meta(redis_client, keys: Keys) -> None:
    """The restore case: meta back to ``queued`` without token or epoch, the same token claimed again."""
    writer = await _writer(redis_client, keys, "e1e1e1e1e1")
    await writer.append([_start("e1e1e1e1e1"), BlockStart(stream_id=SID, seq=2, ts=1_001, block=REF)])
    await redis_client.delete(keys.events(SID), keys.meta(SID))
    await redis_client.hset(keys.meta(SID), mapping={"state": "queued", "last_seq": 0})
    again = await _writer(redis_client, keys, "e2e2e2e2e2")
    assert again.token == writer.token  # a restore resets the fencing token: it cannot tell them apart
    await again.append([_start("e2e2e2e2e2"), BlockStart(stream_id=SID, seq=2, ts=1_001, block=REF)])
    with pytest.raises(EpochFencedError):  # seq 3 continues meta's last_seq: only the epoch refuses it
        await writer.append([StreamDone(stream_id=SID, seq=3, ts=1_002, status="completed", finish_reason="stop",
                                        provider_finish_reason=None, usage=None, response_id=None, model=None)])
    assert (await meta(redis_client, keys, SID))["state"] == "running"


async def test_a_writer_without_epoch_continues_a_stream_started_before_epochs(redis_client, keys: Keys) -> None:
    writer = await _writer(redis_client, keys, "")
    await writer.append([StreamStart(stream_id=SID, seq=1, ts=1_000, provider="openai_chat", model="m")])
    await writer.append([BlockStart(stream_id=SID, seq=2, ts=1_001, block=REF)])
    assert "epoch" not in await meta(redis_client, keys, SID)


async def test_every_notification_carries_the_epoch(redis_client, keys: Keys) -> None:
    writer = await _writer(redis_client, keys, "e1e1e1e1e1")
    got = await _published(redis_client, keys, writer, [[_start("e1e1e1e1e1")],
                                                        [BlockStart(stream_id=SID, seq=2, ts=1_001, block=REF)]])
    notes = [parse_notification(payload) for payload in got]
    assert [(n.first_seq, n.last_seq, n.epoch) for n in notes if n] == [(1, 1, b"e1e1e1e1e1"), (2, 2, b"e1e1e1e1e1")]
    assert got[0].startswith(b"1 1 e1e1e1e1e1 c\n")


async def test_a_retry_after_stream_start_keeps_the_generation_and_a_new_job_gets_its_own(
        redis_client, keys: Keys, redis_url: str) -> None:
    async with fake_upstream() as (base, _state), running_worker(settings_for(base, redis_url, keys), keys):
        retried = make_job("openai_chat", "fail1-simple_text_greek_usage_chunk")  # a 503 first, then the stream
        other = make_job("openai_chat", "simple_text_greek_usage_chunk")
        for job in (retried, other):
            await submit(redis_client, keys, job)
        for job in (retried, other):
            assert (await wait_stream_done(redis_client, keys, job.stream_id))["status"] == "completed"
    epochs = []
    for job in (retried, other):
        events = await stored_events(redis_client, keys, job.stream_id)
        starts = [e for e in events if isinstance(e, StreamStart)]
        assert len(starts) == 1
        assert starts[0].epoch == (await meta(redis_client, keys, job.stream_id))["epoch"]
        epochs.append(starts[0].epoch)
        raw = await redis_client.xrange(keys.events(job.stream_id))
        assert decode_event(entry_jsons(job.stream_id, *raw[0])[0][1]) == starts[0]
    assert epochs[0] != epochs[1]
