"""The fenced, batched append script against the real Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from infra.live_pubsub import live_mode
from infra.redis_client import RedisClient
from publisher.live.notification import Notification, encode_notification, parse_notification
from schema.contract import (
    BlockDelta,
    BlockRef,
    BlockStart,
    BlockStop,
    Delta,
    ErrorInfo,
    Event,
    StreamDone,
    StreamError,
    StreamStart,
    Usage,
    decode_event,
)
from schema.errors import InternalError
from schema.keys import Keys
from schema.stored import encode_stored
from schema.stored_entries import entry_jsons
from tests.conftest import client_for, delete_prefix
from tests.worker.support import command_calls
from worker.appender import (
    Appender,
    FencedError,
    SeqConflictError,
    StreamClosedError,
    StreamWriter,
    summary_fields,
)
from worker.lease import Leases

pytestmark = pytest.mark.topologies

SID = "st_appendtest"
REF = BlockRef(id="b0", index=0, kind="text")


def _start(seq: int = 1, ts: int = 1_000) -> StreamStart:
    return StreamStart(stream_id=SID, seq=seq, ts=ts, provider="openai_chat", model="m", metadata={})


def _body(first: int, count: int, ts: int = 1_100) -> list[Event]:
    out: list[Event] = [BlockStart(stream_id=SID, seq=first, ts=ts, block=REF)]
    out += [BlockDelta(stream_id=SID, seq=first + i, ts=ts + i, block=REF, delta=Delta(kind="text", text=f"t{i}"))
            for i in range(1, count - 1)]
    out.append(BlockStop(stream_id=SID, seq=first + count - 1, ts=ts + count, block=REF))
    return out


def _done(seq: int, ts: int = 2_000) -> StreamDone:
    return StreamDone(stream_id=SID, seq=seq, ts=ts, status="completed", finish_reason="stop",
                      provider_finish_reason="stop", usage=Usage(input_tokens=3, output_tokens=5),
                      response_id="r1", model="m-2024")


async def _writer(redis: aioredis.Redis, keys: Keys, consumer: str = "c1", **limits: int) -> StreamWriter:
    claim = await Leases(redis, keys, consumer=consumer, lease_s=30).claim(
        stream_id=SID, provider="openai_chat", model="m", entry_id="1-0", now_ms=1_000)
    appender = Appender(redis, keys, **limits)
    return appender.writer(SID, token=claim.token, last_seq=claim.last_seq, provider="openai_chat", model="m",
                           started_ms=claim.started_ms)


async def _stored(redis: aioredis.Redis, keys: Keys) -> list[tuple[str, Event | None]]:
    return [(f"0-{seq}", decode_event(data)) for i, f in await redis.xrange(keys.events(SID))
            for seq, data in entry_jsons(SID, i, f)]


async def test_append_stores_explicit_ids_and_advances_last_seq(redis_client: aioredis.Redis, keys: Keys) -> None:
    writer = await _writer(redis_client, keys)
    assert await writer.append([_start()]) == 1
    assert await writer.append(_body(2, 4)) == 5
    stored = await _stored(redis_client, keys)
    assert [i for i, _ in stored] == ["0-1", "0-2", "0-3", "0-4", "0-5"]
    assert [e.seq for _, e in stored if e] == [1, 2, 3, 4, 5]
    assert (await redis_client.hget(keys.meta(SID), "last_seq")) == b"5"
    assert await redis_client.ttl(keys.events(SID)) == -1  # no TTL while running


async def test_append_refuses_stale_fencing_token(redis_client: aioredis.Redis, keys: Keys) -> None:
    old = await _writer(redis_client, keys, consumer="old")
    await old.append([_start()])
    new = await _writer(redis_client, keys, consumer="new")  # a reclaim: token incremented
    assert new.token == old.token + 1
    with pytest.raises(FencedError):
        await old.append(_body(2, 3))
    assert [i for i, _ in await _stored(redis_client, keys)] == ["0-1"]
    assert await new.append(_body(2, 3)) == 4


async def test_append_refuses_seq_gap(redis_client: aioredis.Redis, keys: Keys) -> None:
    writer = await _writer(redis_client, keys)
    await writer.append([_start()])
    with pytest.raises(SeqConflictError) as caught:
        await writer.append(_body(3, 3))
    assert caught.value.stored_seq == 1
    with pytest.raises(SeqConflictError):
        await writer.append([_start()])  # a duplicate of seq 1
    assert [i for i, _ in await _stored(redis_client, keys)] == ["0-1"]


async def test_append_refuses_after_terminal(redis_client: aioredis.Redis, keys: Keys) -> None:
    writer = await _writer(redis_client, keys)
    await writer.append([_start(), *_body(2, 3), _done(5)])
    assert writer.terminal is not None
    with pytest.raises(StreamClosedError):
        await writer.append(_body(6, 3))
    assert len(await _stored(redis_client, keys)) == 5


async def test_terminal_must_be_last_in_batch(redis_client: aioredis.Redis, keys: Keys) -> None:
    writer = await _writer(redis_client, keys)
    with pytest.raises(InternalError):
        await writer.append([_start(), _done(2), *_body(3, 3)])
    assert await _stored(redis_client, keys) == []


@pytest.fixture
async def quiet_client(request: pytest.FixtureRequest, topology: str, keys: Keys) -> AsyncIterator[RedisClient]:
    """A client of a Redis only this session writes to (commandstats count only our commands).

    ``single``: the private node; ``cluster``: the session's test cluster (tests run one at a time).
    """
    url = request.getfixturevalue("cluster_redis_url" if topology == "cluster" else "private_node_url")
    client = client_for(url)
    yield client
    await delete_prefix(client, keys.prefix)
    await client.aclose()


async def _command_calls(redis: aioredis.Redis, name: str) -> int:
    """Calls of command ``name`` summed over every master (``INFO commandstats`` per node)."""
    return await command_calls(redis, name)


async def test_batch_is_one_script_call_in_order(quiet_client: aioredis.Redis, keys: Keys) -> None:
    writer = await _writer(quiet_client, keys)
    await writer.append([_start()])  # loads the script, so the batch below is one EVALSHA
    evalsha, xadd = await _command_calls(quiet_client, "evalsha"), await _command_calls(quiet_client, "xadd")
    batch = _body(2, 50)
    await writer.append(batch)
    assert await _command_calls(quiet_client, "evalsha") - evalsha == 1
    assert await _command_calls(quiet_client, "xadd") - xadd == 50  # inside the one script call
    stored = await _stored(quiet_client, keys)
    assert [e for _, e in stored[1:]] == batch


async def _published(redis_client: aioredis.Redis, keys: Keys, writer: StreamWriter,
                     batches: list[list[Event]]) -> list[bytes]:
    """The notifications of ``batches``, heard as a publisher would: SSUBSCRIBE in sharded mode, else SUBSCRIBE."""
    sharded = await live_mode(redis_client) == "sharded"
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    await (pubsub.ssubscribe if sharded else pubsub.subscribe)(keys.live(writer.stream_id))
    try:
        for batch in batches:
            await writer.append(batch)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < len(batches) and time.monotonic() < deadline:
            if sharded:
                message = await pubsub.get_sharded_message(ignore_subscribe_messages=True, timeout=1.0)
            else:
                message = await pubsub.get_message(timeout=1.0)  # None for the subscribe confirmation
            if message is not None:
                got.append(message["data"])
        return got
    finally:
        await pubsub.aclose()


async def test_append_publishes_its_events_on_live_channel(redis_client: aioredis.Redis, keys: Keys) -> None:
    writer = await _writer(redis_client, keys)
    body = _body(2, 3)
    got = await _published(redis_client, keys, writer, [[_start()], body])
    values = [encode_stored(e) for e in body]
    start = encode_stored(_start())
    assert got == [b"1 1  c\n%d:%s" % (len(start), start),
                   b"4 2  c\n" + b"".join(b"%d:%s" % (len(v), v) for v in values)]
    assert parse_notification(got[1]) == Notification(last_seq=4, first_seq=2, events=values, compact=True)


@pytest.mark.parametrize("over", [0, 1])
async def test_live_notification_size_limit(redis_client: aioredis.Redis, keys: Keys, over: int) -> None:
    body = _body(2, 3)
    values = [encode_stored(e) for e in body]
    size = sum(len(v) + 1 for v in values)
    writer = await _writer(redis_client, keys, live_max_bytes=size - over)
    got = await _published(redis_client, keys, writer, [[_start()], body])
    expected = encode_notification(2, values, size - over, compact=True)
    assert got[1] == expected
    assert got[1] == (b"4" if over else b"4 2  c\n" + b"".join(b"%d:%s" % (len(v), v) for v in values))


async def test_terminal_sets_ttl_tombstone_and_summary(redis_client: aioredis.Redis, keys: Keys) -> None:
    writer = await _writer(redis_client, keys, stream_ttl_s=100, tombstone_ttl_s=1000, done_maxlen=10)
    await writer.append([_start()])
    await writer.append([*_body(2, 3, ts=1_250), _done(5, ts=3_000)])
    meta = {k.decode(): v.decode() for k, v in (await redis_client.hgetall(keys.meta(SID))).items()}
    assert (meta["state"], meta["status"], meta["last_seq"], meta["ended_ms"]) == ("done", "completed", "5", "3000")
    assert 0 < await redis_client.ttl(keys.events(SID)) <= 100
    assert 0 < await redis_client.ttl(keys.meta(SID)) <= 100
    assert 100 < await redis_client.ttl(keys.tomb(SID)) <= 1000
    assert await redis_client.hgetall(keys.tomb(SID)) == {b"last_seq": b"5", b"status": b"completed"}
    entries = await redis_client.xrange(keys.done)
    assert len(entries) == 1
    summary = {k.decode(): v.decode() for k, v in entries[0][1].items()}
    assert summary.pop("epoch") == ""  # the test writer has none (a stream started before contract 1.1)
    assert summary == {
        "stream_id": SID, "provider": "openai_chat", "model": "m", "status": "completed", "finish_reason": "stop",
        "error_category": "", "input_tokens": "3", "output_tokens": "5", "cached_input_tokens": "",
        "reasoning_tokens": "", "events": "5", "ttfd_ms": "251", "duration_ms": "2000", "ended_ms": "3000",
    }


async def test_done_stream_is_capped(redis_client: aioredis.Redis, keys: Keys) -> None:
    appender = Appender(redis_client, keys, done_maxlen=5)
    leases = Leases(redis_client, keys, consumer="c", lease_s=30)
    for n in range(300):
        sid = f"st_cap{n}"
        claim = await leases.claim(stream_id=sid, provider="gemini", model="m", entry_id="1-0", now_ms=1)
        writer = appender.writer(sid, token=claim.token, last_seq=0)
        start = StreamStart(stream_id=sid, seq=1, ts=1, provider="gemini", model="m", metadata={})
        await writer.append([start, StreamError(
            stream_id=sid, seq=2, ts=2, status="cancelled", usage=None, finish_reason=None,
            error=ErrorInfo(category="cancelled", retryable=False, message="x"))])
    assert await redis_client.xlen(keys.done) < 300  # MAXLEN ~ trims whole macro nodes


def test_summary_fields_of_error_without_usage() -> None:
    error = StreamError(stream_id=SID, seq=4, ts=5_000, status="interrupted", usage=None, finish_reason=None,
                        error=ErrorInfo(category="worker_lost", retryable=True, message="lost"))
    fields = summary_fields(error, provider="anthropic", model="c", started_ms=4_000, first_delta_ms=None)
    as_dict = dict(zip(fields[::2], fields[1::2], strict=True))
    assert as_dict["status"] == "interrupted"
    assert as_dict["error_category"] == "worker_lost"
    assert as_dict["ttfd_ms"] == ""
    assert as_dict["duration_ms"] == "1000"
    assert as_dict["input_tokens"] == ""


async def test_concurrent_writers_of_one_stream_store_each_seq_once(redis_client: aioredis.Redis,
                                                                    keys: Keys) -> None:
    writer = await _writer(redis_client, keys)
    await writer.append([_start()])
    twin = writer._appender.writer(SID, token=writer.token, last_seq=1)
    results = await asyncio.gather(writer.append(_body(2, 3)), twin.append(_body(2, 3)), return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["SeqConflictError", "int"]
    assert [i for i, _ in await _stored(redis_client, keys)] == ["0-1", "0-2", "0-3", "0-4"]


async def test_summary_is_a_separate_xadd_after_the_terminal_script(quiet_client: aioredis.Redis,
                                                                    keys: Keys) -> None:
    writer = await _writer(quiet_client, keys, done_maxlen=10)
    await writer.append([_start()])
    evalsha, xadd = await _command_calls(quiet_client, "evalsha"), await _command_calls(quiet_client, "xadd")
    await writer.append([*_body(2, 3), _done(5)])
    assert await _command_calls(quiet_client, "evalsha") - evalsha == 1
    assert await _command_calls(quiet_client, "xadd") - xadd == 4 + 1  # 4 events in the script, then the summary
    assert await quiet_client.xlen(keys.done) == 1


async def test_lost_summary_never_loses_an_event(redis_client: aioredis.Redis, keys: Keys,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    writer = await _writer(redis_client, keys)
    await writer.append([_start()])

    async def broken_xadd(*_args: object, **_kwargs: object) -> None:
        raise redis.exceptions.ConnectionError("connection lost")

    monkeypatch.setattr(writer._appender.redis, "xadd", broken_xadd)
    assert await writer.append([*_body(2, 3), _done(5)]) == 5  # the terminal is stored: no error raised
    assert writer.terminal is not None
    assert [i for i, _ in await _stored(redis_client, keys)] == ["0-1", "0-2", "0-3", "0-4", "0-5"]
    assert await redis_client.hget(keys.meta(SID), "state") == b"done"
    assert await redis_client.hgetall(keys.tomb(SID)) == {b"last_seq": b"5", b"status": b"completed"}
    assert await redis_client.xlen(keys.done) == 0
    assert "event=summary_lost" in caplog.text


async def test_terminal_past_lost_events_is_stored_on_redis_6_2(keys: Keys) -> None:
    """Redis 6.2 cannot parse script flags: the terminal script runs without them, ``jump`` and all."""
    from tests.redis_servers import redis_node
    from tools.embedded_redis import redis_server_binary

    with redis_node(binary=redis_server_binary()) as server:
        redis = client_for(server.url)
        try:
            assert str((await redis.info("server"))["redis_version"]).startswith("6.2.")
            writer = await _writer(redis, keys)
            await writer.append([_start(), *_body(2, 2)])
            writer.last_seq = 5  # seqs 4 and 5 were acknowledged by a master that died before replicating them
            error = StreamError(stream_id=SID, seq=6, ts=6, status="failed", usage=None, finish_reason=None,
                                error=ErrorInfo(category="internal", retryable=True, message="storage error: lost"))
            assert await writer.end_refused([error], jump=True) == "event"
            assert writer._appender.salvage.flags_supported is False
            assert [entry_id for entry_id, _ in await _stored(redis, keys)] == ["0-1", "0-2", "0-3", "0-6"]
            meta = await redis.hgetall(keys.meta(SID))
            assert (meta[b"lost_from"], meta[b"lost_to"], meta[b"state"]) == (b"4", b"5", b"done")
        finally:
            await redis.aclose()
