"""The status route's results: one assembly shared by concurrent requests, kept, advanced, bounded.

Real publisher, real Redis, real sockets. Reads of the stream's events are recorded (and
the first one held back, so concurrent requests surely overlap) by a Redis wrapper; the
assemblies are counted by the publisher itself (``Telemetry.status_assemblies``, exported
as ``fanout.status.assemblies``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from publisher.state import FAIR_SHARES, STATUS_CACHE, TELEMETRY
from schema.contract import encode_event, is_terminal
from schema.reducer import reduce, result_to_builtins
from tests.publisher.helpers import (
    API_KEY,
    StreamWriter,
    bearer,
    block_start,
    delta,
    done,
    eventually,
    make_settings,
    start,
    stop,
    text_stream,
    token_for,
)
from tests.publisher.test_fair_share import GatedRedis


@pytest.fixture
async def gated(ctx) -> Any:
    """Start a publisher whose first XRANGE of the stream's events waits for ``release``."""
    gates: list[GatedRedis] = []

    async def make(**settings: Any) -> tuple[Any, GatedRedis]:
        def wrap(client: Any) -> GatedRedis:
            gates.append(GatedRedis(client, ctx.keys.events(ctx.sid)))
            return gates[-1]

        server = await ctx.start_app(make_settings(**settings), wrap_redis=wrap)
        return server, gates[-1]

    yield make
    for gate in gates:
        gate.release.set()


async def store(ctx, events: list[Any]) -> None:
    """Store events and meta in one pipeline (a long stream fast)."""
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta(last_seq=events[-1].seq, state="done" if is_terminal(events[-1]) else "running")
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for event in events:
            pipe.xadd(ctx.keys.events(ctx.sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
        await pipe.execute()


async def status(ctx, server, credential: str = API_KEY, sid: str | None = None) -> dict[str, Any]:
    async with ctx.http.get(server.url(f"/v1/streams/{sid or ctx.sid}"), headers=bearer(credential)) as resp:
        assert resp.status == 200
        return await resp.json()


async def test_concurrent_status_requests_share_one_assembly_and_a_finished_stream_is_never_read_again(ctx, gated):
    server, gate = await gated()
    events = text_stream(ctx.sid, 3000)  # 3004 events: two XRANGE pages
    await store(ctx, events)
    requests = [asyncio.create_task(ctx.http.get(server.url(f"/v1/streams/{ctx.sid}"), headers=bearer(API_KEY)))
                for _ in range(20)]
    await eventually(lambda: server.app[FAIR_SHARES].held("status") == 20)  # all in flight, one read held
    gate.release.set()
    bodies = []
    for task in requests:
        async with await task as resp:
            assert resp.status == 200
            bodies.append(await resp.read())
    assert len(set(bodies)) == 1
    assert gate.xranges == ["(0-0", "(0-2048"]  # the stream read once, page by page
    assert server.app[TELEMETRY].status_assemblies == {"full": 1, "incremental": 0}
    again = await status(ctx, server)  # kept: answered without reading an event
    assert gate.xranges == ["(0-0", "(0-2048"]
    assert server.app[TELEMETRY].status_assemblies == {"full": 1, "incremental": 0}
    assert again["result"] == result_to_builtins(reduce(events))
    assert (again["state"], again["last_seq"], again["history_complete"]) == ("done", 3004, True)


async def test_a_running_stream_is_advanced_by_the_events_stored_since(ctx, gated):
    server, gate = await gated()
    gate.release.set()
    events = [start(ctx.sid), block_start(ctx.sid, 2, 0), *(delta(ctx.sid, s, 0, f"d{s} ") for s in range(3, 11))]
    await store(ctx, events)
    first = await status(ctx, server)
    assert (first["state"], first["last_seq"], first["result"]["status"]) == ("running", 10, "running")
    more = [delta(ctx.sid, s, 0, f"d{s} ") for s in range(11, 15)] + [done(ctx.sid, 15)]
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*more, notify=False)
    second = await status(ctx, server)
    assert gate.xranges == ["(0-0", "(0-10"]  # only what was stored since
    assert server.app[TELEMETRY].status_assemblies == {"full": 1, "incremental": 1}
    assert second["result"] == result_to_builtins(reduce([*events, *more]))
    assert (second["state"], second["status"], second["last_seq"]) == ("done", "completed", 15)


async def test_each_projection_is_assembled_apart(ctx, gated):
    server, gate = await gated()
    gate.release.set()
    events = [start(ctx.sid), block_start(ctx.sid, 2, 0, kind="reasoning", visibility="internal"),
              delta(ctx.sid, 3, 0, "secret", kind="reasoning"), block_start(ctx.sid, 4, 1),
              delta(ctx.sid, 5, 1, "hello"), done(ctx.sid, 6)]
    await store(ctx, events)
    internal = await status(ctx, server)
    public = await status(ctx, server, token_for(ctx.sid))
    assert [b["kind"] for b in internal["result"]["blocks"]] == ["reasoning", "text"]
    assert [b["kind"] for b in public["result"]["blocks"]] == ["text"]
    assert await status(ctx, server, token_for(ctx.sid)) == public
    assert server.app[TELEMETRY].status_assemblies == {"full": 2, "incremental": 0}


@pytest.mark.parametrize("field", ["epoch", "created_ms"])
async def test_a_new_epoch_or_a_new_stream_under_the_same_id_never_gets_the_old_result(ctx, gated, field):
    server, gate = await gated()
    gate.release.set()
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await store(ctx, text_stream(ctx.sid, 2))
    await writer.meta(**{field: "1"}, state="done", last_seq=6)
    assert (await status(ctx, server))["result"]["blocks"][0]["text"] == "t0 t1 "
    await ctx.redis.delete(ctx.keys.events(ctx.sid))  # the history is written anew, with the same seqs
    await store(ctx, [start(ctx.sid), block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0, "new "),
                      delta(ctx.sid, 4, 0, "text "), stop(ctx.sid, 5, 0), done(ctx.sid, 6)])
    await writer.meta(**{field: "2"}, state="done", last_seq=6)
    assert (await status(ctx, server))["result"]["blocks"][0]["text"] == "new text "
    assert server.app[TELEMETRY].status_assemblies == {"full": 2, "incremental": 0}


async def test_a_cache_of_zero_bytes_keeps_nothing(ctx, gated):
    server, gate = await gated(status_cache_bytes=0)
    gate.release.set()
    await store(ctx, text_stream(ctx.sid, 3))
    first, second = await status(ctx, server), await status(ctx, server)
    assert first == second
    assert server.app[TELEMETRY].status_assemblies == {"full": 2, "incremental": 0}
    assert server.app[STATUS_CACHE].bytes == 0


@pytest.mark.parametrize(("spare", "kept"), [(0, True), (-1, False)])
async def test_a_result_is_kept_exactly_while_it_fits_the_cache(ctx, gated, spare, kept):
    probe, gate = await gated()
    gate.release.set()
    await store(ctx, text_stream(ctx.sid, 50))
    await status(ctx, probe)
    size = probe.app[STATUS_CACHE].bytes  # one result's estimated size
    server, gate = await gated(status_cache_bytes=size + spare)
    gate.release.set()
    await status(ctx, server)
    await status(ctx, server)
    assert server.app[TELEMETRY].status_assemblies["full"] == (1 if kept else 2)


@pytest.mark.parametrize("limit", [1, 2])
async def test_status_assemblies_read_at_once_up_to_the_limit(ctx, gated, limit):
    server, gate = await gated(status_assemblies=limit)
    await store(ctx, text_stream(ctx.sid, 3))
    other = f"{ctx.sid}b"
    await StreamWriter(ctx.redis, ctx.keys, other).append(*text_stream(other, 3), notify=False)
    held = asyncio.create_task(status(ctx, server))  # its first XRANGE is held: it keeps its turn
    await eventually(lambda: gate.xranges == ["(0-0"])
    second = asyncio.create_task(status(ctx, server, token_for(other), other))
    if limit == 2:
        assert (await second)["result"]["status"] == "completed"  # a second turn: served while the first waits
    else:
        await eventually(lambda: server.app[STATUS_CACHE].waiting == 1)  # no turn left: it waits
    gate.release.set()
    assert (await held)["result"]["status"] == "completed"
    assert (await second)["result"]["status"] == "completed"
    mine, theirs = ctx.keys.events(ctx.sid), ctx.keys.events(other)
    first_read_ends, other_read_starts = gate.log.index(("end", mine)), gate.log.index(("start", theirs))
    assert (other_read_starts > first_read_ends) == (limit == 1)  # one turn: the other waited for it
