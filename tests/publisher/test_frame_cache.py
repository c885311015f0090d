"""The rendered-frame cache gives the bytes rendering gives, from every seq, across compaction, epochs, its limit."""

from __future__ import annotations

import uuid
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from publisher.history.frame_cache import FrameCache, item_size
from publisher.history.pages import item_entries, page_of
from publisher.history.store import Store
from publisher.state import STORE, TELEMETRY
from schema.keys import Keys
from schema.stored import encode_stored
from tests.conftest import delete_prefix
from tests.publisher.helpers import API_KEY, StreamWriter, bearer, make_settings, text_stream
from tests.publisher.test_compact_log import _frame, _frames_from_every_position
from tests.schema.test_stored import GOLDENS, golden_events
from worker.compaction_plan import plan
from worker.compactor import Compactor

pytestmark = pytest.mark.topologies

TINY = 3000
"""A cache limit that holds a few items: every replay evicts."""


def _stores(redis, keys: Keys) -> dict[str, Store]:
    return {name: Store(redis, keys, page=7, frames=FrameCache(limit))
            for name, limit in (("off", 0), ("tiny", TINY), ("large", 1 << 30))}


async def _replays(stores: dict[str, Store], sid: str, last: int) -> dict[str, list[bytes]]:
    return {name: await _frames_from_every_position(store, sid, last) for name, store in stores.items()}


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
async def test_every_golden_gives_the_same_bytes_from_every_seq_with_and_without_the_cache_and_compaction(
        redis_client, path: Path) -> None:
    events = golden_events(path)
    sid, last = events[0].stream_id, events[-1].seq
    keys = Keys(prefix=f"fanouttest-{uuid.uuid4().hex[:12]}")
    try:
        writer = StreamWriter(redis_client, keys, sid, epoch=b"ep1", compact=True)
        await writer.meta(state="done")
        await writer.append(*events, notify=False)
        await redis_client.expire(keys.events(sid), 5000)
        stores = _stores(redis_client, keys)
        expected = [b"".join(_frame(e, b"ep1") for e in events if e.seq > position) for position in range(last + 1)]
        assert await _replays(stores, sid, last) == dict.fromkeys(stores, expected)
        assert await Compactor(redis_client, keys, run_deltas=4).compact(sid) == "ok"
        assert await _replays(stores, sid, last) == dict.fromkeys(stores, expected)  # the caches were warm
        assert await _replays(_stores(redis_client, keys), sid, last) == dict.fromkeys(stores, expected)  # cold
    finally:
        await delete_prefix(redis_client, keys.prefix)


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
async def test_every_golden_in_the_json_form_gives_the_same_bytes_from_the_cache(redis_client, path: Path) -> None:
    events = golden_events(path)
    sid, last = events[0].stream_id, events[-1].seq
    keys = Keys(prefix=f"fanouttest-{uuid.uuid4().hex[:12]}")
    try:
        await StreamWriter(redis_client, keys, sid, epoch=b"ep1").append(*events, notify=False)
        stores = _stores(redis_client, keys)
        replays = await _replays(stores, sid, last)
        assert replays["off"][0] == b"".join(_frame(e, b"ep1") for e in events)
        assert replays == dict.fromkeys(stores, replays["off"])
    finally:
        await delete_prefix(redis_client, keys.prefix)


async def test_a_second_replay_renders_nothing_and_a_compacted_run_is_expanded_once(redis_client, keys: Keys) -> None:
    sid, events = "st_twice", text_stream("st_twice", 40)
    writer = StreamWriter(redis_client, keys, sid, epoch=b"ep", compact=True)
    await writer.meta(state="done")
    await writer.append(*events, notify=False)
    await redis_client.expire(keys.events(sid), 5000)
    frames = FrameCache(1 << 30)
    store = Store(redis_client, keys, page=7, frames=frames)
    first = await _frames_from_every_position(store, sid, len(events))
    assert frames.rendered == len(events)  # each event once, though a replay from every seq read it
    assert await _frames_from_every_position(store, sid, len(events)) == first
    assert frames.rendered == len(events)
    assert await Compactor(redis_client, keys, run_deltas=4).compact(sid) == "ok"
    assert await _frames_from_every_position(store, sid, len(events)) == first
    rendered = frames.rendered
    assert rendered > len(events)  # the runs were rendered (expanded) once ...
    assert len(frames) == await redis_client.xlen(keys.events(sid))  # ... and replaced the items they hold
    assert await _frames_from_every_position(store, sid, len(events)) == first
    assert frames.rendered == rendered  # ... and never again


async def test_a_new_generation_is_served_with_its_epoch_even_when_its_stored_values_are_the_same(
        redis_client, keys: Keys) -> None:
    sid, events = "st_reset", text_stream("st_reset", 12)
    frames = FrameCache(1 << 30)
    store = Store(redis_client, keys, page=5, frames=frames)
    for epoch in (b"aaaa1111", b"bbbb2222"):
        await redis_client.delete(keys.events(sid), keys.meta(sid))  # history reset: the keys restored empty
        await StreamWriter(redis_client, keys, sid, epoch=epoch, compact=True).append(*events, notify=False)
        got = await _frames_from_every_position(store, sid, len(events))
        assert got[0] == b"".join(_frame(e, epoch) for e in events)
        assert len(frames) == len(events)  # the other generation's items were dropped


async def test_a_stream_written_again_without_an_epoch_is_rendered_again(redis_client, keys: Keys) -> None:
    sid = "st_again"
    store = Store(redis_client, keys, page=100, frames=FrameCache(1 << 30))
    for end in ("done", "error"):
        await redis_client.delete(keys.events(sid), keys.meta(sid))  # deleted after its tombstone, then reused
        events = text_stream(sid, 6, end=end)
        await StreamWriter(redis_client, keys, sid, compact=True).append(*events, notify=False)
        assert [entry.frame for entry in await store.read_after(sid, 0)] == [_bare(e) for e in events]


def _bare(event) -> bytes:
    """The frame of ``event`` with a bare ``id: <seq>`` (a stream without an epoch)."""
    return _frame(event, b"").replace(b"id: %d.\n" % event.seq, b"id: %d\n" % event.seq)


async def _kept_size(redis, keys: Keys, sid: str, epoch: bytes) -> tuple[int, int]:
    """Return how many stored items ``sid`` has and the bytes the cache counts for them all."""
    raw = await redis.xrange(keys.events(sid))
    return len(raw), sum(item_size(fields, item_entries(sid, entry_id, fields, epoch)) for entry_id, fields in raw)


@pytest.mark.parametrize("spare", [0, -1])
async def test_the_limit_holds_exactly_what_fits(redis_client, keys: Keys, spare: int) -> None:
    sid, events = "st_edge", text_stream("st_edge", 10)
    await StreamWriter(redis_client, keys, sid, epoch=b"ep", compact=True).append(*events, notify=False)
    items, size = await _kept_size(redis_client, keys, sid, b"ep")
    frames = FrameCache(size + spare)
    store = Store(redis_client, keys, page=100, frames=frames)
    first = [entry.frame for entry in await store.read_after(sid, 0)]
    assert (len(frames), frames.bytes) == ((items, size) if spare == 0 else (0, 0))  # one segment: whole or none
    assert [entry.frame for entry in await store.read_after(sid, 0)] == first
    assert frames.rendered == items * (1 if spare == 0 else 2)


async def test_the_least_recently_read_stream_goes_first(redis_client, keys: Keys) -> None:
    sizes = {}
    for sid in ("st_a", "st_b", "st_c"):
        await StreamWriter(redis_client, keys, sid, epoch=b"ep", compact=True).append(*text_stream(sid, 5),
                                                                                        notify=False)
        sizes[sid] = (await _kept_size(redis_client, keys, sid, b"ep"))[1]
    frames = FrameCache(sum(sizes.values()) - 1)
    store = Store(redis_client, keys, page=100, frames=frames)
    for sid in ("st_a", "st_b", "st_a", "st_c"):  # st_b is the least recently read when st_c comes
        await store.read_after(sid, 0)
    assert frames.bytes == sizes["st_a"] + sizes["st_c"]
    rendered = frames.rendered
    await store.read_after("st_a", 0)
    await store.read_after("st_c", 0)
    assert frames.rendered == rendered
    await store.read_after("st_b", 0)
    assert frames.rendered == rendered + 9


async def test_a_cache_of_zero_bytes_keeps_nothing_and_renders_every_read(redis_client, keys: Keys) -> None:
    sid, events = "st_off", text_stream("st_off", 10)
    await StreamWriter(redis_client, keys, sid, epoch=b"ep", compact=True).append(*events, notify=False)
    frames = FrameCache(0)
    store = Store(redis_client, keys, page=100, frames=frames)
    assert [e.frame for e in await store.read_after(sid, 0)] == [e.frame for e in await store.read_after(sid, 0)]
    assert (len(frames), frames.bytes, frames.rendered, frames.served) == (0, 0, 2 * len(events), 0)


async def test_a_second_readers_replay_over_http_renders_nothing_new(ctx) -> None:
    server = await ctx.start_app(make_settings(frame_cache_bytes=1 << 24))
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=b"e1", compact=True)
    await writer.meta(state="done")
    await writer.append(*text_stream(ctx.sid, 26), notify=False)
    frames, telemetry = server.app[STORE].frames, server.app[TELEMETRY]
    assert telemetry.frames is frames  # fanout.frames.rendered / .served / .cache.size report it

    async def body(http: aiohttp.ClientSession) -> bytes:
        async with http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
            assert resp.status == 200
            return await resp.content.read()

    first = await body(ctx.http)
    rendered = frames.rendered
    assert rendered == 30
    assert await body(ctx.http) == first
    assert (frames.rendered, frames.served) == (rendered, 30)


async def test_an_expired_streams_frames_are_let_go_once_its_tombstone_is_seen(redis_client, keys: Keys) -> None:
    sid, events = "st_expired", text_stream("st_expired", 4)
    await StreamWriter(redis_client, keys, sid, epoch=b"ep", compact=True).append(*events, notify=False)
    frames = FrameCache(1 << 30)
    store = Store(redis_client, keys, page=100, frames=frames)
    await store.read_after(sid, 0)
    assert len(frames) == len(events)
    await redis_client.delete(keys.events(sid))
    await redis_client.hset(keys.tomb(sid), mapping={"last_seq": len(events), "status": "done", "epoch": "ep"})
    assert (await store.info(sid)).tomb_last_seq == len(events)
    assert (len(frames), frames.bytes) == (0, 0)


def _forms(sid: str, deltas: int) -> dict[str, list[tuple[bytes, list[bytes]]]]:
    """One stream's stored items as written (compact), as compacted (runs of 3), and as JSON."""
    events = text_stream(sid, deltas)
    written = [(b"0-%d" % e.seq, [b"c", encode_stored(e)]) for e in events]
    compacted = [(b"0-%d" % seq, [b"c", value]) for seq, value in
                 plan(sid, [(i, {b"c": v[1]}) for i, v in written], run_deltas=3).entries]
    return {"written": written, "compacted": compacted,
            "json": [(b"0-%d" % e.seq, [b"e", _frame(e, b"")[:-2].split(b"data: ", 1)[1]]) for e in events]}


@settings(max_examples=80, deadline=None)
@given(reads=st.lists(st.tuples(st.sampled_from(["written", "compacted", "json"]), st.sampled_from([b"e1", b"e2"]),
                                st.integers(min_value=0, max_value=26), st.integers(min_value=1, max_value=12)),
                      min_size=1, max_size=25),
       limit=st.sampled_from([0, 2500, 9000, 1 << 30]))
def test_any_sequence_of_reads_gets_what_rendering_gives(reads, limit: int) -> None:
    sid = "st_prop"
    forms = _forms(sid, 20)
    frames = FrameCache(limit)
    for form, epoch, after, count in reads:
        raw = [item for item in forms[form] if int(item[0][2:]) > after][:count]  # XRANGE (0-<after> + COUNT
        got = frames.page(sid, raw, epoch, after=after, limit=count)
        want = page_of(sid, raw, epoch, after=after, limit=count)
        cut = min(len(got), len(want))
        assert [e for e in got if e.seq > after][:count] == [e for e in want if e.seq > after][:count]
        assert got[:cut] == want[:cut]
        assert frames.bytes <= limit


def test_items_read_one_at_a_time_live_join_one_segment_a_replay_slices() -> None:
    sid = "st_live"
    raw = _forms(sid, 20)["written"]
    frames = FrameCache(1 << 30)
    for at in range(len(raw)):  # the hub's live reads: each new item alone
        frames.page(sid, raw[at:at + 1], b"e1", after=at, limit=100)
    rendered = frames.rendered
    assert list(frames.page(sid, raw, b"e1", limit=100)) == list(page_of(sid, raw, b"e1"))
    assert (frames.rendered, len(frames._lru)) == (rendered, 1)
