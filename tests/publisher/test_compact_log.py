"""The compact stored log serves the same SSE bytes as the JSON-stored log, from every position, replayed and live."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from publisher.history.pages import item_entries, page_of
from publisher.history.store import Store
from schema.contract import BlockDelta, BlockRef, Delta, Event, encode_event
from schema.keys import Keys
from schema.stored import encode_stored
from tests.conftest import delete_prefix
from tests.publisher.helpers import API_KEY, StreamWriter, bearer, make_settings, text_stream
from tests.schema.test_stored import GOLDENS, golden_events
from worker.compaction_plan import plan

pytestmark = pytest.mark.topologies


def _frame(event: Event, epoch: bytes) -> bytes:
    """The SSE message of ``event`` as the JSON-stored log serves it (CONTRACT.md, "SSE projection")."""
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return b"id: %d.%s\nevent: %s\ndata: %s\n\n" % (event.seq, epoch, tag.encode(), encode_event(event))


async def _frames_from_every_position(store: Store, sid: str, last: int) -> list[bytes]:
    out = []
    for position in range(last + 1):
        frames = []
        after = position
        while True:
            page = await store.read_after(sid, after, 7)
            frames += [entry.frame for entry in page]
            if len(page) < 7:
                break
            after = page[-1].seq
        out.append(b"".join(frames))
    return out


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
async def test_every_golden_replays_the_same_bytes_from_every_seq_in_both_forms(redis_client, path: Path) -> None:
    events = golden_events(path)
    sid = events[0].stream_id
    forms = {}
    for compact in (False, True):
        keys = Keys(prefix=f"fanouttest-{uuid.uuid4().hex[:12]}")
        try:
            await StreamWriter(redis_client, keys, sid, epoch=b"ep1", compact=compact).append(*events, notify=False)
            store = Store(redis_client, keys, page=7)
            forms[compact] = await _frames_from_every_position(store, sid, events[-1].seq)
        finally:
            await delete_prefix(redis_client, keys.prefix)
    assert forms[True] == forms[False]
    assert forms[True][0] == b"".join(_frame(e, b"ep1") for e in events)


async def _body(ctx, position: str) -> bytes:
    headers = bearer(API_KEY) | ({"Last-Event-ID": position} if position else {})
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=headers) as resp:
        assert resp.status == 200
        return await resp.content.read()


async def test_the_publisher_serves_the_same_body_from_bare_and_epoch_positions_in_both_forms(ctx) -> None:
    events = text_stream(ctx.sid, 40)
    bodies = {}
    for compact in (False, True):
        await ctx.redis.delete(ctx.keys.events(ctx.sid), ctx.keys.meta(ctx.sid))
        writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=b"e7", compact=compact)
        await writer.meta()
        await writer.append(*events, notify=False)
        bodies[compact] = [await _body(ctx, position) for position in ("", "1", "17", "17.e7", "43.e7")]
    assert bodies[True] == bodies[False]
    assert b"id: 18.e7\nevent: block.delta\n" in bodies[True][2]


async def test_live_readers_get_compact_notifications_as_the_json_frames(ctx) -> None:
    server = await ctx.start_app(make_settings())
    events = text_stream(ctx.sid, 12)
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=b"e9", compact=True)
    await writer.meta()
    await writer.append(events[0], notify=False)
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        assert resp.status == 200
        first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 10)
        await writer.append(*events[1:], full=True)
        rest = await asyncio.wait_for(resp.content.read(), 10)
    got = first + rest.replace(b": ping\n\n", b"")
    assert got.endswith(b"".join(_frame(e, b"e9") for e in events[1:]))


@settings(max_examples=60)
@given(texts=st.lists(st.text(min_size=1), min_size=1, max_size=12), first=st.integers(min_value=1, max_value=10**9),
       corrupt=st.integers(min_value=-1, max_value=11))
def test_the_fast_compact_page_equals_the_careful_one(texts: list[str], first: int, corrupt: int) -> None:
    sid = "st_Fast-1"
    events = [BlockDelta(stream_id=sid, seq=first + i, ts=i * 7, block=BlockRef(id="b2", index=2, kind="reasoning"),
                         delta=Delta(kind="text", text=text)) for i, text in enumerate(texts)]
    raw = [(b"0-%d" % e.seq, [b"c", encode_stored(e)]) for e in events]
    if 0 <= corrupt < len(raw):
        raw[corrupt] = (raw[corrupt][0], [b"c", b"\xc1"])
    fast = page_of(sid, raw, b"ep")
    careful = [entry for entry_id, fields in raw for entry in item_entries(sid, entry_id, fields, b"ep")]
    assert list(fast) == careful
    assert [e.frame for e in fast if e.frame] == [_frame(e, b"ep") for i, e in enumerate(events) if i != corrupt]


def test_a_reply_of_compacted_runs_is_expanded_only_as_far_as_the_reader_asked() -> None:
    sid = "st_runs"
    events = text_stream(sid, 200)
    raw = [(b"0-%d" % e.seq, {b"c": encode_stored(e)}) for e in events]
    planned = plan(sid, raw, run_deltas=5)
    compacted = [(b"0-%d" % seq, [b"c", value]) for seq, value in planned.entries]
    page = page_of(sid, compacted, b"", after=12, limit=7)
    assert len([e for e in page if e.seq > 12]) >= 7
    assert page[-1].seq <= 12 + 7 + 5
    whole = page_of(sid, compacted, b"")
    assert [e.frame for e in whole] == [_frame_bare(e) for e in events]


def _frame_bare(event: Event) -> bytes:
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (event.seq, tag.encode(), encode_event(event))
