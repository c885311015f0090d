"""Replays whose clients stall while Redis misbehaves: each event once, read-aheads let go, gaps only where it went.

From the read-ahead rounds (``scripts/breaker/ra_*``; docs/faults.md). A real ``fanout
publisher`` (uvloop, Prometheus for the ``fanout_sse_read_ahead_*`` figures) reads a private
Redis through :class:`tests.faults.proxy.FaultProxy`. Streams hold deltas of tens of KB, so a
reader with a 4 KB receive buffer that stops reading stalls the publisher inside a page
write while the next page is read ahead (held for ``FANOUT_READ_AHEAD_HOLD_MS``, then let go).
Pages: a first page of 2, then 256 (seqs 3..258, 259..514, ...).

The figures that held: every reader that follows to the end holds exactly 1..end across its
reconnects (a read-ahead shared by a reader that lets go and one still awaiting it is
tests/publisher/test_read_ahead.py's); a ``stream.gap`` frame only where history really vanished, naming the right
``after_seq`` and ``next_seq``; no page held once every reader is gone; no ERROR, traceback
or unretrieved task error in the log (a reset pooled connection once made a 500 here on
uvloop, fixed in 38841fa).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as aioredis

from schema.keys import Keys
from tests.faults.conftest import StartPublisher
from tests.faults.procs import PublisherProcess, log_problems
from tests.faults.proxy import FaultProxy
from tests.faults.sse import GUARD_S, StallClient
from tests.faults.streams import Writer, live_deltas, reasoning_script, text_script
from tests.publisher.helpers import API_KEY, token_for
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.faults

SETTINGS = {"FANOUT_READ_FIRST_PAGE": 2, "FANOUT_READ_PAGE": 256, "FANOUT_WRITE_TIMEOUT_S": 30,
            "FANOUT_HEARTBEAT_S": 1, "FANOUT_REDIS_POOL_TIMEOUT_S": 2}
AHEAD = b"(0-258"
"""The read ahead while the second page (3..258) is written: ``XRANGE ... (0-258 + COUNT 256``."""
TOP = 700
"""Seqs stored before the targeted readers come (240 deltas of 40 KB at 3..242: 9.6 MB in the second page)."""


async def follow(publisher: PublisherProcess, sid: str, end: int, *, last_id: str | None = None, scope: str = "api",
                 stalls: Callable[[StallClient], Awaitable[None]] | None = None) -> list[StallClient]:
    """Read ``sid`` to seq ``end`` over stalling clients, reconnecting with ``Last-Event-ID`` after each end.

    ``scope``: the API key (``api``) or a read token of that scope. ``stalls(client)`` runs
    once on the first response, before it is read to its end.
    """
    responses: list[StallClient] = []
    credential = API_KEY if scope == "api" else token_for(sid, scope)  # type: ignore[arg-type]
    try:
        return await _follow(publisher, sid, end, last_id=last_id, credential=credential, stalls=stalls,
                             responses=responses)
    except TimeoutError:
        raise AssertionError(f"{sid} not read to {end} in time: " + str(
            [(c.status, c.seqs[:1], c.seqs[-1:], c.ended, c.body[:100]) for c in responses])) from None


async def _follow(publisher: PublisherProcess, sid: str, end: int, *, last_id: str | None, credential: str,
                  stalls: Callable[[StallClient], Awaitable[None]] | None,
                  responses: list[StallClient]) -> list[StallClient]:
    async with asyncio.timeout(GUARD_S * 2):
        while True:
            client = StallClient(publisher.port, sid, credential, last_id=last_id)
            responses.append(client)
            await client.connect()
            if stalls is not None and len(responses) == 1:
                await stalls(client)
            await client.read_until_seq(end)
            client.close()
            ids = [frame.id for frame in client.frames if frame.id is not None]
            last_id = ids[-1] if ids else last_id
            if client.gaps or client.status != 200 or (client.seqs and client.seqs[-1] >= end):
                return responses
            await asyncio.sleep(0.1)


def seqs_of(responses: list[StallClient]) -> list[int]:
    return [seq for client in responses for seq in client.seqs]


def clean(responses: list[StallClient]) -> bool:
    """Every response was a 200 without a gap frame or a line that is no SSE field."""
    return all(c.status == 200 and not c.gaps and not c.bad for c in responses)


async def settle(publisher: PublisherProcess) -> None:
    """Every response has ended and no read-ahead page is held any more."""
    await publisher.until_metric("fanout_sse_readers", 0)
    await publisher.until_metric("fanout_sse_read_ahead_pages", 0)


async def random_stalls(rng: random.Random, client: StallClient, quitter: bool) -> None:
    """Read in bursts, pausing between them (inside page writes); a quitter leaves during a pause."""
    for _ in range(rng.randint(1, 3)):
        for _ in range(rng.randint(1, 100)):
            if not await client.read_some():
                return
        await asyncio.sleep(rng.choice([0.0, 0.05, 0.3, 1.0]))
        if quitter and rng.random() < 0.5:
            return


async def quit_mid_stall(publisher: PublisherProcess, sid: str, rng: random.Random) -> None:
    """A reader from the start that stalls at random and leaves during a stall (or at the end)."""
    client = StallClient(publisher.port, sid, API_KEY)
    await client.connect()
    await random_stalls(rng, client, quitter=True)
    client.close()


FAULTS = ["sleep", "kill", "pubsub", "freeze", "freeze-cut", "cut"] * 2


async def faults(rng: random.Random, admin: aioredis.Redis, proxy: FaultProxy) -> None:
    """Each of :data:`FAULTS` in turn, 0.05-0.5 s apart: DEBUG SLEEP, CLIENT KILL (normal, pub/sub),
    replies held, held then reset, reset (a fault storm that never ends can hold a response for
    as long as it lasts: each command may take four times FANOUT_REDIS_TIMEOUT_S plus backoff)."""
    for kind in FAULTS:
        await asyncio.sleep(rng.uniform(0.05, 0.5))
        if kind == "sleep":
            await admin.execute_command("DEBUG", "SLEEP", str(rng.choice([0.05, 0.3, 1.0])))
        elif kind == "kill":
            await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        elif kind == "pubsub":
            await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        else:
            if kind != "cut":
                proxy.freeze()
                await asyncio.sleep(rng.choice([0.01, 0.2, 1.0]))
            if kind != "freeze":
                proxy.cut()
            proxy.thaw()


@pytest.fixture
async def proxy(server: RedisServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(server.port) as faulty:
        yield faulty


async def test_stalling_readers_get_their_projection_once_through_redis_faults_and_let_their_pages_go(
        server: RedisServer, client: aioredis.Redis, keys: Keys, proxy: FaultProxy,
        start_publisher: StartPublisher) -> None:
    """Readers with public tokens, internal tokens and the API key, from the start and from inside
    reasoning blocks (a public one searches back for its block's start meanwhile), stall while
    DEBUG SLEEP, CLIENT KILL, held replies and resets hit Redis and the stream grows live."""
    rng = random.Random(3)
    publisher = await start_publisher(proxy.url, keys.prefix, metrics=True, FANOUT_READ_AHEAD_HOLD_MS=200,
                                      **SETTINGS)
    script = reasoning_script("st_stalls", rng, blocks=10, max_deltas=200, pad=16_000)
    top = len(script.events) - 30
    writer = Writer(client, keys)
    await writer.meta(script.sid)
    await writer.store(script.events[:top])
    admin = aioredis.Redis(host="127.0.0.1", port=server.port, socket_timeout=None)
    injecting = asyncio.create_task(faults(rng, admin, proxy))
    starts = [(None, "api"), (None, "public"), (None, "internal"), ("256", "public"), ("257", "api"),
              (str(top // 2), "public"), (str(top - 3), "internal")]
    reading = [asyncio.create_task(follow(publisher, script.sid, script.top, last_id=last_id, scope=scope,
                                          stalls=lambda c: random_stalls(rng, c, quitter=False)))
               for last_id, scope in starts]
    quitting = [asyncio.create_task(quit_mid_stall(publisher, script.sid, rng)) for _ in range(3)]
    await asyncio.sleep(1.0)
    for at in range(top, len(script.events), 5):
        await writer.append(script.events[at:at + 5])
        await asyncio.sleep(0.05)
    await injecting
    results = await asyncio.gather(*reading)
    await asyncio.gather(*quitting)
    for (last_id, scope), responses in zip(starts, results, strict=True):
        assert seqs_of(responses) == script.expected(int(last_id or 0), scope), (scope, last_id)
        assert clean(responses), [(c.status, c.body[:200], c.gaps[:1]) for c in responses]
        if scope == "public":
            assert not any("SECRET" in (f.data or "") for c in responses for f in c.frames)
    await settle(publisher)
    await admin.aclose()
    assert log_problems(publisher.log()) == []


class Targeted:
    """A stalled reader inside the second page, its read-ahead of 259..514 held by the proxy's gate."""

    def __init__(self, publisher: PublisherProcess, proxy: FaultProxy, writer: Writer, sid: str) -> None:
        self.publisher, self.proxy, self.writer, self.sid = publisher, proxy, writer, sid

    async def stall(self) -> StallClient:
        """Connect a reader from 0, read its first bytes, then stop reading until the read ahead is in flight."""
        client = StallClient(self.publisher.port, self.sid, API_KEY)
        await client.connect()
        await client.read_some()
        await asyncio.wait_for(self.proxy.gate_entered.wait(), GUARD_S)
        return client

    async def let_go(self) -> None:
        """Wait until the hold passed and the read-ahead was let go."""
        await self.publisher.until_metric("fanout_sse_read_ahead_dropped_total", 1)

    async def grow_to_end(self, first: int = TOP + 1, count: int = 5) -> int:
        """Append ``count`` live events ending the stream; return its last seq."""
        await self.writer.append(live_deltas(self.sid, first, count, terminal=True))
        return first + count - 1

    async def resume(self, client: StallClient, end: int) -> list[int]:
        """Read ``client`` on, then reconnect until ``end``; every seq received."""
        await client.read_until_seq(end)
        client.close()
        last = [f.id for f in client.frames if f.id is not None][-1:] or [None]
        rest = [] if client.seqs[-1:] == [end] else await follow(self.publisher, self.sid, end, last_id=last[0])
        assert clean([client, *rest])
        return client.seqs + seqs_of(rest)


@pytest.fixture
async def targeted(client: aioredis.Redis, keys: Keys, proxy: FaultProxy, start_publisher: StartPublisher,
                   request: pytest.FixtureRequest) -> Targeted:
    proxy.gate_pattern = AHEAD
    publisher = await start_publisher(proxy.url, keys.prefix, metrics=True, FANOUT_READ_AHEAD_HOLD_MS=request.param,
                                      **SETTINGS)
    writer = Writer(client, keys)
    script = text_script("st_target", TOP, big=240, big_bytes=40_000)
    await writer.meta(script.sid)
    await writer.store(script.events)
    return Targeted(publisher, proxy, writer, script.sid)


HELD, LET_GO = 60_000, 200
"""Holds of the read-ahead: longer than any scenario (held while the fault comes), or let go at once."""


@pytest.mark.parametrize("targeted", [HELD, LET_GO], indirect=True, ids=["held", "let-go"])
async def test_redis_unreachable_while_a_stalled_reader_reads_ahead_loses_and_repeats_nothing(
        targeted: Targeted, proxy: FaultProxy) -> None:
    stalled = await targeted.stall()
    if targeted.publisher.env["FANOUT_READ_AHEAD_HOLD_MS"] == str(LET_GO):
        await targeted.let_go()
    proxy.down = True  # every connection reset, every new one refused
    proxy.cut()
    proxy.gate_open.set()
    reading = asyncio.create_task(targeted.resume(stalled, TOP + 5))
    await asyncio.sleep(2.0)  # the read ahead's retries run out meanwhile
    proxy.down = False
    end = await targeted.grow_to_end()
    assert await reading == list(range(1, end + 1))
    await settle(targeted.publisher)
    assert log_problems(targeted.publisher.log()) == []


@pytest.mark.parametrize(("targeted", "trim"), [(LET_GO, "xtrim"), (LET_GO, "del"), (HELD, "xtrim"), (HELD, "del")],
                         indirect=["targeted"], ids=["let-go-xtrim", "let-go-del", "held-xtrim", "held-del"])
async def test_history_trimmed_under_a_stalled_reader_is_a_gap_exactly_where_it_went(
        targeted: Targeted, proxy: FaultProxy, client: aioredis.Redis, keys: Keys, trim: str) -> None:
    """Let go: the page after the stalled one is read after the trim, so the gap follows seq 258.
    Held: Redis ran that read (259..514) before the trim (the proxy held only its reply), so
    the page is sent whole; XTRIM MINID 0-401 leaves 515.. stored (no gap at all), DEL
    leaves nothing (a gap after 514)."""
    stalled = await targeted.stall()
    held = targeted.publisher.env["FANOUT_READ_AHEAD_HOLD_MS"] == str(HELD)
    if not held:
        await targeted.let_go()
    proxy.gate_open.set()
    if trim == "del":
        await client.delete(keys.events(targeted.sid))
    else:
        await client.execute_command("XTRIM", keys.events(targeted.sid), "MINID", "0-401")
    if held and trim == "xtrim":
        await stalled.read_until_seq(TOP)
    else:
        await stalled.read_to_end()
    stalled.close()
    gap_after, next_seq = {(False, "xtrim"): (258, 401), (False, "del"): (258, None),
                           (True, "del"): (514, None), (True, "xtrim"): (None, None)}[(held, trim)]
    if gap_after is None:
        assert stalled.seqs == list(range(1, TOP + 1))
        assert not stalled.gaps
    else:
        assert stalled.seqs == list(range(1, gap_after + 1))
        assert len(stalled.gaps) == 1
        gap = json.loads(stalled.gaps[0].data or "{}")
        assert (gap["after_seq"], gap["next_seq"]) == (gap_after, next_seq)
    await settle(targeted.publisher)
    assert log_problems(targeted.publisher.log()) == []
