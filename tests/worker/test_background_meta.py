"""Background fields in meta: stored with a batch, or alone by a fenced batch of no event (the append script)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from schema.contract import StreamStart
from schema.keys import Keys
from worker.appender import Appender, FencedError, StreamWriter
from worker.lease import Leases

pytestmark = pytest.mark.topologies

SID = "st_bgmeta"


async def _writer(redis: aioredis.Redis, keys: Keys, consumer: str) -> StreamWriter:
    claim = await Leases(redis, keys, consumer=consumer, lease_s=30).claim(
        stream_id=SID, provider="openai_responses", model="m", entry_id="1-0", now_ms=1_000)
    return Appender(redis, keys).writer(SID, token=claim.token, last_seq=claim.last_seq, provider="openai_responses",
                                        model="m", started_ms=claim.started_ms, epoch="0a1b2c3d4e")


def _start() -> StreamStart:
    return StreamStart(stream_id=SID, seq=1, ts=1_000, provider="openai_responses", model="m", metadata={},
                       epoch="0a1b2c3d4e")


async def test_a_batch_of_no_event_stores_the_fields_alone_and_publishes_nothing(
        redis_client: aioredis.Redis, keys: Keys) -> None:
    writer = await _writer(redis_client, keys, "a")
    await writer.append([_start()])
    pubsub = redis_client.pubsub()
    await pubsub.subscribe(keys.live(SID))
    await pubsub.get_message(timeout=1.0)  # the subscribe confirmation
    writer.background = ("resp_1", "0", "bg")
    await writer.note_background()
    await writer.note_background()  # already stored: no second call
    found = await redis_client.hgetall(keys.meta(SID))
    assert (found[b"bg_id"], found[b"bg_cursor"], found[b"bg_endpoint"], found[b"last_seq"]) == (
        b"resp_1", b"0", b"bg", b"1")
    assert await redis_client.xlen(keys.events(SID)) == 1
    assert await pubsub.get_message(timeout=0.2) is None
    await pubsub.aclose()
    assert writer.background_stored == "resp_1"


async def test_a_batch_of_no_event_is_fenced_like_any_append(redis_client: aioredis.Redis, keys: Keys) -> None:
    old = await _writer(redis_client, keys, "old")
    await old.append([_start()])
    await _writer(redis_client, keys, "new")  # a reclaim: the token moved on
    old.background = ("resp_2", "3", "bg")
    with pytest.raises(FencedError):
        await old.note_background()
    assert await redis_client.hget(keys.meta(SID), "bg_id") is None


async def test_the_fields_ride_with_a_batch_of_events(redis_client: aioredis.Redis, keys: Keys) -> None:
    writer = await _writer(redis_client, keys, "a")
    writer.background = ("resp_3", "7", "bg")
    await writer.append([_start()])
    found = await redis_client.hgetall(keys.meta(SID))
    assert (found[b"bg_id"], found[b"bg_cursor"], found[b"last_seq"]) == (b"resp_3", b"7", b"1")
    assert writer.background_stored == "resp_3"
