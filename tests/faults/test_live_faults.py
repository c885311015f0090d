"""Readers of growing streams through notification chaos and Redis faults: every event once, in order.

From the adversarial rounds on the SSE edge (``scripts/breaker``: ``order_projection``,
``live_reads_stress``, ``redis_faults``; docs/faults.md). A real ``fanout publisher`` on a
private Redis; streams are appended as a worker does while readers with public,
internal and API-key credentials join at random positions, drop their connection and
resume with ``Last-Event-ID``. What held then must hold now:

* every reader gets exactly the stored events after its position, each once, in order, as
  stored (byte-equal ``data``), its token's projection only, and no ``stream.gap``;
* notifications dropped, published late, seq-only or too big to carry change nothing;
* killed connections (normal and pub/sub), ``DEBUG SLEEP`` and a frozen server (SIGSTOP)
  end responses at most, never lose or repeat an event;
* a Redis that restarts empty mid-replay ends its readers with a clean 404/410 or gap;
  the publisher then serves new streams, replayed and live;
* the publisher logs no ERROR and no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import signal

import aiohttp
import pytest
import redis.asyncio as aioredis

from infra.redis_client import RedisOptions, connect
from schema.contract import encode_event
from schema.keys import Keys
from tests.faults.conftest import StartPublisher
from tests.faults.polling import until
from tests.faults.procs import log_problems
from tests.faults.sse import Follower
from tests.faults.streams import Script, Writer, reasoning_script, text_script
from tests.publisher.helpers import API_KEY, token_for
from tests.redis_servers import RedisServer
from worker.appender import Appender, StreamWriter
from worker.lease import Leases

pytestmark = pytest.mark.faults

SESSION = aiohttp.ClientTimeout(total=None, sock_read=None)


def credential(sid: str, scope: str) -> str:
    """The API key (``api``: reads everything) or a read token of ``scope``."""
    return API_KEY if scope == "api" else token_for(sid, scope)  # type: ignore[arg-type]


def check_reader(reader: Follower, script: Script, after: int, scope: str) -> None:
    """Exactly the events after ``after`` that ``scope`` may see, each as stored, once, in order."""
    stored = {e.seq: encode_event(e).decode() for e in script.events}
    assert reader.seqs == script.expected(after, scope), (reader.sid, scope, after, reader.ends[-5:])
    assert all(data == stored[seq] for seq, data in reader.events)
    assert not reader.gaps
    assert not reader.bad
    if scope == "public":
        assert not any("SECRET" in data for _, data in reader.events)


async def grow(writer: Writer, script: Script, rng: random.Random, late: list[asyncio.Task[None]]) -> None:
    """Append ``script`` after its ``stream.start`` in batches of 1..17; each notification carried,
    seq-only, too big to carry, dropped or published late."""
    at = 1
    while at < len(script.events):
        batch = script.events[at:at + rng.choice([1, 1, 2, 5, 17])]
        how = rng.choice(["carried", "carried", "seq-only", "too-big", "dropped", "late"])
        live_max = {"seq-only": 0, "too-big": 300}.get(how, 1 << 16)
        payload = await writer.append(batch, live_max=live_max, publish=how not in ("dropped", "late"))
        if how == "late":
            channel = writer.keys.live(script.sid)
            late.append(asyncio.create_task(publish_later(writer.client, channel, payload, rng.uniform(0.005, 0.2))))
        at += len(batch)
        await asyncio.sleep(rng.random() * 0.03)


async def publish_later(client: aioredis.Redis, channel: str, payload: bytes, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    await client.publish(channel, payload)


async def test_readers_at_random_positions_get_exactly_their_projection_whatever_the_notifications(
        server: RedisServer, client: aioredis.Redis, keys: Keys, start_publisher: StartPublisher) -> None:
    rng = random.Random(1)
    publisher = await start_publisher(server.url, keys.prefix, FANOUT_READ_PAGE=16, FANOUT_READ_FIRST_PAGE=4,
                                      FANOUT_CLIENT_QUEUE=4, FANOUT_HEARTBEAT_S=1)
    writer = Writer(client, keys)
    scripts = [reasoning_script(f"st_proj{i}", rng, blocks=12, max_deltas=rng.choice([3, 25])) for i in range(3)]
    for script in scripts:
        await writer.meta(script.sid)
        await writer.append(script.events[:1])
    late: list[asyncio.Task[None]] = []
    checks: list[tuple[Follower, Script, int, str]] = []

    async def one_reader(http: aiohttp.ClientSession) -> None:
        script, scope = rng.choice(scripts), rng.choice(["public", "internal", "api"])
        await asyncio.sleep(rng.random() * 0.8)
        after = rng.randint(0, int(await client.hget(keys.meta(script.sid), "last_seq") or 0))
        reader = Follower(publisher.base, script.sid, credential(script.sid, scope), str(after) if after else None)
        checks.append((reader, script, after, scope))
        await reader.run(http, drop_after=[rng.choice([1, 3, 50]) for _ in range(rng.randint(0, 4))])

    async with aiohttp.ClientSession(timeout=SESSION) as http:
        await asyncio.gather(*(grow(writer, s, rng, late) for s in scripts), *(one_reader(http) for _ in range(30)))
    await asyncio.gather(*late)
    for reader, script, after, scope in checks:
        check_reader(reader, script, after, scope)
    assert await publisher.stop() == 0
    assert log_problems(publisher.log()) == []


async def claim_writer(url: str, keys: Keys, sid: str) -> tuple[Appender, StreamWriter]:
    """The real append script's writer of ``sid`` for a fresh claim (a worker's seam client of ``url``)."""
    seam = connect(url, RedisOptions())
    claim = await Leases(seam, keys, consumer="w", lease_s=60).claim(
        stream_id=sid, provider="openai_chat", model="m", entry_id="1-1", now_ms=1)
    appender = Appender(seam, keys)
    return appender, appender.writer(sid, token=claim.token, last_seq=0)


async def inflict(server: RedisServer, admin: aioredis.Redis, fault: str) -> None:
    """Kill every normal connection, or every pub/sub one, or ``DEBUG SLEEP 1``, or SIGSTOP for 1 s."""
    assert server.proc is not None
    if fault == "kill":
        await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    elif fault == "pubsub":
        await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    elif fault == "sleep":
        await admin.execute_command("DEBUG", "SLEEP", "1")
    else:
        server.proc.send_signal(signal.SIGSTOP)
        await asyncio.sleep(1.0)
        server.proc.send_signal(signal.SIGCONT)


async def test_readers_resume_exactly_through_killed_connections_sleeps_and_a_frozen_redis(
        server: RedisServer, keys: Keys, start_publisher: StartPublisher) -> None:
    publisher = await start_publisher(server.url, keys.prefix, FANOUT_READ_PAGE=64, FANOUT_READ_FIRST_PAGE=8,
                                      FANOUT_HEARTBEAT_S=1, FANOUT_REDIS_POOL_TIMEOUT_S=1)
    script = text_script("st_faulted", 1600, terminal=True)
    appender, writer = await claim_writer(server.url, keys, script.sid)
    await writer.append(script.events[:1000])
    admin = aioredis.Redis(host="127.0.0.1", port=server.port, socket_timeout=None)

    async def append_rest_under_faults() -> None:
        """Each fault in turn while 15 batches of 10 are appended (the writer retries as a worker does)."""
        batches = iter(range(1000, len(script.events), 10))
        for fault in ["kill", "pubsub", "sleep", "sigstop"]:
            faulting = asyncio.create_task(inflict(server, admin, fault))
            for at in itertools.islice(batches, 15):
                await writer.append(script.events[at:at + 10])
                await asyncio.sleep(0.02)
            await faulting
        for at in batches:
            await writer.append(script.events[at:at + 10])

    readers = [Follower(publisher.base, script.sid, API_KEY) for _ in range(12)]
    async with aiohttp.ClientSession(timeout=SESSION, read_bufsize=4096) as http:
        await asyncio.gather(append_rest_under_faults(),
                             *(r.run(http, slow_s=0.02 * (i % 3)) for i, r in enumerate(readers)))
    for reader in readers:
        check_reader(reader, script, 0, "api")
    await admin.aclose()
    await appender.redis.aclose()
    assert await publisher.stop() == 0
    assert log_problems(publisher.log()) == []


async def test_a_redis_restarted_empty_mid_replay_ends_readers_cleanly_and_new_streams_are_served(
        server: RedisServer, keys: Keys, start_publisher: StartPublisher) -> None:
    publisher = await start_publisher(server.url, keys.prefix, FANOUT_READ_PAGE=64, FANOUT_READ_FIRST_PAGE=8,
                                      FANOUT_HEARTBEAT_S=1)
    old = text_script("st_lost", 3000, terminal=True)
    async with contextlib.aclosing(aioredis.Redis(host="127.0.0.1", port=server.port)) as before:
        await Writer(before, keys).meta(old.sid)
        await Writer(before, keys).store(old.events)
    readers = [Follower(publisher.base, old.sid, API_KEY) for _ in range(5)]
    async with aiohttp.ClientSession(timeout=SESSION, read_bufsize=4096) as http:
        tasks = [asyncio.create_task(r.run(http, gone_ok=True, pause_s=0.2, slow_s=0.02)) for r in readers]
        await until(lambda: all(r.events for r in readers), "every reader is inside its replay")
        server.kill()
        await asyncio.to_thread(server.start)  # the same port, nothing stored: a restart without persistence
        await asyncio.gather(*tasks)
        for reader in readers:
            assert reader.seqs == list(range(1, len(reader.seqs) + 1))  # a prefix: nothing wrong, nothing twice
            assert reader.terminal is None  # the stream is gone before its end: said so, not ended silently
            assert reader.statuses[-1] in (404, 410), reader.ends[-3:]
        async with contextlib.aclosing(aioredis.Redis(host="127.0.0.1", port=server.port)) as after:
            writer = Writer(after, keys)
            new = text_script("st_after", 40, terminal=True)
            await writer.meta(new.sid)
            await writer.store(new.events[:20])
            replayed_and_live = Follower(publisher.base, new.sid, API_KEY)
            reading = asyncio.create_task(replayed_and_live.run(http))
            await until(lambda: len(replayed_and_live.events) == 20, "the stored part is replayed")
            await writer.append(new.events[20:])
            await reading
    check_reader(replayed_and_live, new, 0, "api")
    assert await publisher.stop() == 0
    assert log_problems(publisher.log()) == []

