"""Redis faults seen by the worker: restarts, lost replies, out of memory, foreign entries, WRONGTYPE.

Faults that stop, restart or fill Redis run on a private ``redis-server``
(:mod:`tests.worker.redis_proc`); the others use the shared server with the test's own
key prefix. Every stream is checked by its stored events and meta.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from schema.contract import BlockRef, BlockStart, Event, StreamDone, StreamError, StreamStart
from schema.keys import Keys
from tests.worker.redis_proc import private_redis
from tests.worker.support import (
    fake_upstream,
    make_job,
    meta,
    pending_count,
    recorded,
    running_worker,
    settings_for,
    stored_events,
    strip_volatile,
    submit,
    wait_done,
    wait_for,
)
from tools.replay import replay_file
from tools.upstream import DEFAULT_ROOTS, ServerConfig
from worker.appender import Appender
from worker.intake import Intake
from worker.lease import Leases

CASE = "several_blocks_thinking_text_two_tools"
GOLDEN, _ = replay_file(DEFAULT_ROOTS[0] / "anthropic" / f"{CASE}.sse")
SLOW = ServerConfig(chunk_bytes=64, slow_delay_ms=100)
"""About 50 chunks 100 ms apart: each stream runs about five seconds."""
OUTAGE_S = 2.0


async def _submit_slow(client: aioredis.Redis, keys: Keys, n: int) -> list[str]:
    jobs = [make_job("anthropic", f"slow-{CASE}") for _ in range(n)]
    for job in jobs:
        await submit(client, keys, job)
    return [job.stream_id for job in jobs]


async def _all_running(client: aioredis.Redis, keys: Keys, sids: list[str], at_least: int = 3) -> None:
    async def running() -> bool:
        metas = [await meta(client, keys, sid) for sid in sids]
        return all(int(m.get("last_seq", 0)) >= at_least and m.get("state") == "running" for m in metas)

    await wait_for(running)


@contextlib.asynccontextmanager
async def _client(url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(url)
    try:
        yield client
    finally:
        await client.aclose()


def _assert_completed_exactly(events: list[Event]) -> None:
    assert [e.seq for e in events] == list(range(1, len(GOLDEN) + 1))
    assert isinstance(events[-1], StreamDone)
    assert events[-1].status == "completed"
    assert strip_volatile(events) == strip_volatile(GOLDEN)


def _assert_storage_failure(events: list[Event], state: dict[str, str]) -> None:
    last = events[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category, last.error.retryable) == ("failed", "internal", False)
    assert "storage" in last.error.message
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert (state["state"], state["status"]) == ("done", "failed")


# -- transient faults: nothing lost, nothing failed ----------------------------------------------


async def test_redis_restart_shorter_than_lease_loses_nothing_and_fails_no_stream(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    keys = Keys(prefix="faults-restart")
    with private_redis() as server:
        async with _client(server.url) as client, fake_upstream(SLOW) as (base, _state):
            settings = settings_for(base, server.url, keys, lease_s=6.0, idle_timeout_s=10.0,
                                    progress_timeout_s=10.0, total_timeout_s=60.0)
            async with running_worker(settings, keys):
                sids = await _submit_slow(client, keys, 8)
                await _all_running(client, keys, sids)
                started = time.monotonic()
                server.stop()
                await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - started)))
                server.start()
                async with _client(server.url) as fresh:  # the test's own pool holds dead connections
                    for sid in sids:
                        await wait_done(fresh, keys, sid)
            await client.connection_pool.disconnect()
            for sid in sids:
                _assert_completed_exactly(await stored_events(client, keys, sid))
                assert (await meta(client, keys, sid))["token"] == "1"  # never reclaimed
            assert await pending_count(client, keys) == 0
            assert len(await recorded(base)) == len(sids)  # no stream asked the provider twice
    assert any("event=storage_retry" in r.getMessage() and 'message="' in r.getMessage() for r in caplog.records)


async def test_brief_out_of_memory_within_the_window_loses_nothing() -> None:
    keys = Keys(prefix="faults-oom-brief")
    with private_redis() as server:
        async with _client(server.url) as client, fake_upstream(SLOW) as (base, _state):
            settings = settings_for(base, server.url, keys, lease_s=6.0, append_retry_s=6.0)
            async with running_worker(settings, keys):
                sids = await _submit_slow(client, keys, 4)
                await _all_running(client, keys, sids)
                server.fill()
                await asyncio.sleep(1.0)
                server.unfill()
                for sid in sids:
                    await wait_done(client, keys, sid)
            for sid in sids:
                _assert_completed_exactly(await stored_events(client, keys, sid))


class DroppingProxy:
    """A loopback proxy to Redis that, once :attr:`armed`, forwards one EVALSHA and drops its reply.

    Attributes:
        dropped: The replies that never reached the client.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.armed = asyncio.Event()
        self.dropped: list[bytes] = []
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen on 127.0.0.1:0; return the port."""
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._handle(client_r, client_w))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [client_w, up_w]
        drop = asyncio.Event()

        async def upward() -> None:
            while data := await client_r.read(65536):
                if self.armed.is_set() and b"EVALSHA" in data:
                    drop.set()
                up_w.write(data)
                await up_w.drain()

        async def downward() -> None:
            while data := await up_r.read(65536):
                if drop.is_set() and not data.startswith(b"-NOSCRIPT"):
                    self.armed.clear()
                    self.dropped.append(data)
                    client_w.close()  # the command ran; its answer never arrives
                    return
                client_w.write(data)
                await client_w.drain()

        with contextlib.suppress(ConnectionError):
            await asyncio.wait([asyncio.ensure_future(upward()), asyncio.ensure_future(downward())],
                               return_when=asyncio.FIRST_COMPLETED)

    async def close(self) -> None:
        """Close the listener and every relayed connection."""
        assert self.server is not None
        self.server.close()
        for writer in self._writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.wait_closed()


@pytest.mark.parametrize("terminal", [False, True])
async def test_append_whose_reply_was_lost_is_retried_exactly(redis_url: str, keys: Keys,
                                                              redis_client: aioredis.Redis, terminal: bool,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fanout.worker.appender")
    if not redis_url.startswith("redis://"):
        pytest.skip("needs a TCP Redis to proxy")
    port = int(redis_url.split(":")[2].split("/", maxsplit=1)[0])
    proxy = DroppingProxy(port)
    proxy_port = await proxy.start()
    async with _client(f"redis://127.0.0.1:{proxy_port}/0") as client:
        sid = "st_lostreply"
        claim = await Leases(client, keys, consumer="w", lease_s=30).claim(
            stream_id=sid, provider="anthropic", model="m", entry_id="1-1", now_ms=1)
        retried: list[BaseException] = []
        writer = Appender(client, keys, on_retry=retried.append).writer(sid, token=claim.token, last_seq=0)
        await writer.append([StreamStart(stream_id=sid, seq=1, ts=1, provider="anthropic", model="m", metadata={})])
        proxy.armed.set()
        ref = BlockRef(id="b0", index=0, kind="text")
        batch: list[Event] = [BlockStart(stream_id=sid, seq=2, ts=2, block=ref)]
        if terminal:
            batch.append(StreamDone(stream_id=sid, seq=3, ts=3, status="completed", finish_reason="stop",
                                    provider_finish_reason="end_turn", usage=None, response_id=None, model="m"))
        assert await writer.append(batch) == len(batch) + 1
    await proxy.close()
    assert len(proxy.dropped) == 1  # one reply was lost, and the retry found the batch stored
    assert len(retried) == 1  # counted once (fanout.append.retries)
    ids = [i.decode() for i, _ in await redis_client.xrange(keys.events(sid))]
    assert ids == [f"0-{n}" for n in range(1, len(batch) + 2)]
    assert (writer.terminal is not None) == terminal
    assert any("event=append_already_stored" in r.getMessage() for r in caplog.records)


# -- permanent faults: the stream ends failed/internal, the job is acked -----------------------


async def test_out_of_memory_past_the_window_ends_streams_failed_internal() -> None:
    keys = Keys(prefix="faults-oom-long")
    with private_redis() as server:
        async with _client(server.url) as client, fake_upstream(SLOW) as (base, _state):
            settings = settings_for(base, server.url, keys, lease_s=3.0, append_retry_s=1.0)
            async with running_worker(settings, keys):
                sids = await _submit_slow(client, keys, 4)
                await _all_running(client, keys, sids)
                server.fill()
                for sid in sids:
                    await wait_done(client, keys, sid)
                assert await pending_count(client, keys) == 0
            for sid in sids:
                events = await stored_events(client, keys, sid)
                _assert_storage_failure(events, await meta(client, keys, sid))
                last = events[-1]
                assert isinstance(last, StreamError)
                assert "out of memory" in last.error.message
                assert (await client.hgetall(keys.tomb(sid)))[b"status"] == b"failed"
            server.unfill()


async def test_foreign_entry_above_ours_ends_stream_failed_internal_without_looping(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    async with fake_upstream(SLOW) as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys, lease_s=0.6), keys):
            [sid] = await _submit_slow(redis_client, keys, 1)
            await _all_running(redis_client, keys, [sid])
            await redis_client.xadd(keys.events(sid), {"x": "foreign"})  # id <ms>-0: above every 0-<seq>
            state = await wait_done(redis_client, keys, sid)
            await asyncio.sleep(1.5)  # more than two leases: a looping job would have been reclaimed
            assert await pending_count(redis_client, keys) == 0
        assert len(await recorded(base)) == 1
    state = await meta(redis_client, keys, sid)
    assert (state["state"], state["status"], state["error_category"], state["token"]) == (
        "done", "failed", "internal", "1")
    assert "storage" in state["error_message"]
    assert "did not write" in state["error_message"]
    tomb = await redis_client.hgetall(keys.tomb(sid))
    assert tomb[b"status"] == b"failed"
    assert tomb[b"last_seq"] == state["last_seq"].encode()
    lines = [r.getMessage() for r in caplog.records if "event=storage_refused" in r.getMessage()]
    assert lines
    assert "equal or smaller than the target stream top item" in lines[0]


async def test_wrongtype_on_the_events_key_ends_stream_failed_internal(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    job = make_job("anthropic", CASE)
    await redis_client.set(keys.events(job.stream_id), "not a stream")
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys), keys):
            await submit(redis_client, keys, job)
            state = await wait_done(redis_client, keys, job.stream_id)
            await wait_for(lambda: _no_pending(redis_client, keys))
        assert await recorded(base) == []  # refused at stream.start: the provider was never called
    assert (state["status"], state["error_category"]) == ("failed", "internal")
    assert "storage" in state["error_message"]
    assert "WRONGTYPE" in state["error_message"]


async def _no_pending(client: aioredis.Redis, keys: Keys) -> bool:
    return await pending_count(client, keys) == 0


async def test_wrongtype_on_meta_acks_the_job_instead_of_looping(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    job = make_job("anthropic", CASE)
    await redis_client.set(keys.meta(job.stream_id), "not a hash")
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys, lease_s=0.3), keys):
            stream, entry = keys.parse_job_ref(await submit(redis_client, keys, job))

            async def acked() -> bool:
                groups = await redis_client.xinfo_groups(stream)
                return groups[0]["last-delivered-id"].decode() == entry and groups[0]["pending"] == 0

            await wait_for(acked)
            await asyncio.sleep(0.8)  # past two leases: nothing reclaims it
            assert await pending_count(redis_client, keys) == 0
        assert await recorded(base) == []


async def test_stream_claimed_more_than_max_claims_ends_failed_internal(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    job = make_job("anthropic", CASE)
    intake = Intake(redis_client, keys, consumer="dead", lease_s=30)
    await intake.ensure_groups()
    entry = await submit(redis_client, keys, job)
    assert [e for e, _ in await intake.read_new(keys.jobs_shard(0), 1, block_ms=100)] == [entry]
    leases = Leases(redis_client, keys, consumer="dead", lease_s=30)
    for _ in range(3):  # three owners died before storing anything
        await leases.claim(stream_id=job.stream_id, provider=job.provider, model=job.model, entry_id=entry,
                           now_ms=1)
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys, lease_s=0.3, max_claims=3), keys):
            state = await wait_done(redis_client, keys, job.stream_id)
            await wait_for(lambda: _no_pending(redis_client, keys))
        assert await recorded(base) == []
    events = await stored_events(redis_client, keys, job.stream_id)
    assert [type(e).__name__ for e in events] == ["StreamStart", "StreamError"]
    _assert_storage_failure(events, state)
    last = events[-1]
    assert isinstance(last, StreamError)
    assert "claimed 4 times" in last.error.message
    assert "FANOUT_MAX_CLAIMS=3" in last.error.message


async def test_stream_claimed_exactly_max_claims_times_still_runs(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    job = make_job("anthropic", CASE)
    async with fake_upstream() as (base, _state), running_worker(settings_for(base, redis_url, keys, max_claims=1),
                                                                 keys):
        await submit(redis_client, keys, job)
        state = await wait_done(redis_client, keys, job.stream_id)
    assert (state["status"], state["token"]) == ("completed", "1")
    _assert_completed_exactly(await stored_events(redis_client, keys, job.stream_id))


LOSE_LAST_TWO = """
local last = tonumber(redis.call('HGET', KEYS[2], 'last_seq'))
redis.call('XDEL', KEYS[1], '0-' .. last, '0-' .. (last - 1))
redis.call('HSET', KEYS[2], 'last_seq', last - 2)
return last
"""
"""What a replica promoted before it got the last two appends holds: those events and the meta update missing."""


async def test_events_lost_in_a_failover_end_the_stream_right_after_the_writers_last_seq(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async with fake_upstream(SLOW) as (base, _state), running_worker(settings_for(base, redis_url, keys), keys):
        [sid] = await _submit_slow(redis_client, keys, 1)
        await _all_running(redis_client, keys, [sid], at_least=5)
        last = int(await redis_client.eval(LOSE_LAST_TWO, 2, keys.events(sid), keys.meta(sid)))
        state = await wait_done(redis_client, keys, sid)
        await wait_for(lambda: _no_pending(redis_client, keys))
    events = await stored_events(redis_client, keys, sid)
    seqs = [e.seq for e in events]
    assert seqs[: last - 2] == list(range(1, last - 1))
    assert seqs[-1] > last  # after everything the writer stored, so no reader's position is reused
    terminal = events[-1]
    assert isinstance(terminal, StreamError)
    assert (terminal.status, terminal.error.category, terminal.error.retryable) == ("failed", "internal", True)
    assert f"lost events {last - 1}.." in terminal.error.message
    assert (state["state"], state["lost_from"], int(state["lost_to"])) == ("done", str(last - 1), terminal.seq - 1)
