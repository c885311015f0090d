"""A public reader resuming inside a reasoning block reads the history back to that block's start, no further."""

from __future__ import annotations

from typing import Any

import pytest

from schema.contract import Event, encode_event
from tests.publisher.helpers import (
    SSEClient,
    bearer,
    block_start,
    delta,
    done,
    ids,
    start,
    stop,
    token_for,
)

EARLIER = 3000
"""Entries of an earlier text block: what a whole-history read would have read too."""


class BackwardReads:
    """Forwards to the real client; counts the entries that multi-entry XREVRANGE calls of one key returned."""

    def __init__(self, inner: Any, key: str) -> None:
        self._inner, self._key = inner, key
        self.entries = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def xrevrange(self, name: str, *args: Any, count: int | None = None, **kwargs: Any) -> Any:
        result = await self._inner.xrevrange(name, *args, count=count, **kwargs)
        if name == self._key and (count or 0) > 1:  # not the top probe (COUNT 1)
            self.entries += len(result or [])
        return result


async def _store(ctx, events: list[Event]) -> None:
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for event in events:
            pipe.xadd(ctx.keys.events(ctx.sid), {"e": encode_event(event)}, id=f"0-{event.seq}")
        pipe.hset(ctx.keys.meta(ctx.sid), mapping={"state": "done", "status": "completed",
                                                   "last_seq": events[-1].seq})
        await pipe.execute()


async def _resume(ctx, position: int) -> tuple[list[int], int]:
    counted: list[BackwardReads] = []

    def wrap(client: Any) -> BackwardReads:
        counted.append(BackwardReads(client, ctx.keys.events(ctx.sid)))
        return counted[0]

    server = await ctx.start_app(wrap_redis=wrap)
    headers = bearer(token_for(ctx.sid, "public")) | {"Last-Event-ID": str(position)}
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=headers) as resp:
        assert resp.status == 200
        got = ids(await SSEClient(resp).events())
    return got, counted[0].entries


def _text_block(sid: str) -> list[Event]:
    """``stream.start`` and a text block 0 of :data:`EARLIER` deltas: seqs 1 .. EARLIER + 3."""
    events = [start(sid), block_start(sid, 2, 0)]
    events += [delta(sid, 3 + i, 0) for i in range(EARLIER)]
    events.append(stop(sid, 3 + EARLIER, 0))
    return events


@pytest.mark.parametrize(("visibility", "deltas", "back", "shown"), [
    ("public", 5, 2, True),  # a public block: its deltas after the position are shown
    ("internal", 99, 50, False),  # an internal one stays hidden
])
async def test_resume_inside_a_reasoning_block_reads_back_to_its_start_only(ctx, visibility, deltas, back, shown):
    sid, first = ctx.sid, EARLIER + 4
    events = _text_block(sid)
    events.append(block_start(sid, first, 1, "reasoning", visibility))
    events += [delta(sid, first + i, 1, "think", "reasoning") for i in range(1, deltas + 1)]
    end = first + deltas + 1
    events += [stop(sid, end, 1, "reasoning"), done(sid, end + 1)]
    await _store(ctx, events)
    got, read = await _resume(ctx, first + back)  # inside block 1, after its start
    assert got == (list(range(first + back + 1, end + 2)) if shown else [end + 1])
    assert read <= 64 + 256, f"read {read} entries backwards"  # a page or two, not the {EARLIER} before it
    if back < 64:
        assert read <= 64  # one small page


async def test_a_block_whose_start_is_gone_is_hidden_and_the_search_stops_at_the_block_before(ctx):
    sid, first = ctx.sid, EARLIER + 4
    events = _text_block(sid)
    events += [block_start(sid, first, 1, "reasoning", "public"), stop(sid, first + 1, 1, "reasoning")]
    events += [block_start(sid, first + 2, 2, "reasoning", "public")]
    events += [delta(sid, first + 2 + i, 2, "r", "reasoning") for i in range(1, 4)]
    events += [stop(sid, first + 6, 2, "reasoning"), done(sid, first + 7)]
    await _store(ctx, events)
    await ctx.redis.xdel(ctx.keys.events(sid), f"0-{first + 2}")  # block 2's start is gone (a writer's bug)
    got, read = await _resume(ctx, first + 3)
    assert got == [first + 7]  # block 2 is treated as internal: fail closed
    assert read <= 64  # stopped at block 1's start, never read block 0


async def test_a_start_missing_with_no_block_before_it_reads_to_the_first_entry(ctx):
    sid = ctx.sid
    events = [start(sid), block_start(sid, 2, 0, "reasoning", "public")]
    events += [delta(sid, 2 + i, 0, "r", "reasoning") for i in range(1, 299)]
    events += [stop(sid, 301, 0, "reasoning"), done(sid, 302)]
    await _store(ctx, events)
    await ctx.redis.xdel(ctx.keys.events(sid), "0-2")
    got, read = await _resume(ctx, 150)
    assert got == [302]
    assert read == 149  # seqs 150 .. 3 and 1: everything before the first entry sent, once
