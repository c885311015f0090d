"""History replay pages: a small first page, then full pages; the page parser's fast path equals the careful one."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from publisher.history.entries import Page, entries_of, parse_entry
from publisher.history.store import Store
from publisher.state import HUB
from schema.contract import encode_event
from tests.publisher.helpers import (
    API_KEY,
    HookedRedis,
    SSEClient,
    StreamWriter,
    bearer,
    ids,
    make_settings,
    recording_redis,
    text_stream,
)


@pytest.mark.parametrize("position", [0, 5])
async def test_replay_reads_a_small_first_page_then_full_pages_and_loses_nothing(ctx, position):
    wrap, hooked = recording_redis(ctx.keys.events(ctx.sid))
    server = await ctx.start_app(make_settings(read_page=8, read_first_page=3), wrap_redis=wrap)
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    events = text_stream(ctx.sid, 30)  # 34 events, ending with stream.done
    await writer.append(*events)
    headers = bearer(API_KEY) | ({"Last-Event-ID": str(position)} if position else {})
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=headers) as resp:
        assert resp.status == 200
        got = ids(await SSEClient(resp).events())
    assert got == list(range(position + 1, events[-1].seq + 1))
    replay = hooked[0].xrange_counts
    assert replay[0] == 3  # FANOUT_READ_FIRST_PAGE
    assert set(replay[1:]) == {8}  # FANOUT_READ_PAGE from then on
    assert hooked[0].xrange_calls[:2] == [f"(0-{position}", f"(0-{position + 3}"]


async def test_a_first_page_larger_than_the_page_is_cut_to_the_page(ctx):
    wrap, hooked = recording_redis(ctx.keys.events(ctx.sid))
    server = await ctx.start_app(make_settings(read_page=4, read_first_page=50), wrap_redis=wrap)
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    events = text_stream(ctx.sid, 6)
    await writer.append(*events)
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        assert ids(await SSEClient(resp).events()) == list(range(1, events[-1].seq + 1))
    assert set(hooked[0].xrange_counts) == {4}


# --- the page parser ------------------------------------------------------------------------------

def _event(seq: int, kind: str = "block.delta", **extra: object) -> bytes:
    body = {"type": kind, "stream_id": "st_p", "seq": seq, "ts": 1700000000000 + seq,
            "block": {"id": "b0", "index": 0, "kind": "reasoning" if seq % 3 else "text"}} | extra
    return msgspec.json.encode(body)


PAGES = {
    "plain": [(b"0-%d" % s, [b"e", _event(s)]) for s in range(4, 12)],
    "reasoning start with visibility": [(b"0-1", [b"e", _event(1, "block.start", visibility="internal")]),
                                        (b"0-2", [b"e", _event(2)])],
    "a line break in a JSON": [(b"0-1", [b"e", _event(1)]), (b"0-2", [b"e", b'{"type":"block.delta",\n"seq":2}'])],
    "a carriage return": [(b"0-7", [b"e", b'{"type":\r"stream.done","seq":7}'])],
    "invalid JSON": [(b"0-1", [b"e", _event(1)]), (b"0-2", [b"e", b"{not json"]), (b"0-3", [b"e", _event(3)])],
    "an unknown type": [(b"0-1", [b"e", b'{"type":"x.future","seq":1}']), (b"0-2", [b"e", b'{"type":"<bad>"}'])],
    "no event field": [(b"0-1", [b"x", b"1"]), (b"0-2", [b"e", _event(2)])],
    "two fields": [(b"0-1", [b"e", _event(1), b"z", b"2"])],
    "a foreign id on top": [(b"0-1", [b"e", _event(1)]), (b"5-1", [b"e", _event(2)])],
    "seqs that skip": [(b"0-1", [b"e", _event(1)]), (b"0-3", [b"e", _event(3)])],
    "a JSON that is not an object": [(b"0-1", [b"e", b"[1,2]"]), (b"0-2", [b"e", _event(2)])],
    "two objects in one item": [(b"0-1", [b"e", _event(1)]), (b"0-2", [b"e", _event(2) + b"," + _event(3)]),
                                (b"0-3", [b"e", _event(3)])],
    "an empty item": [(b"0-1", [b"e", b""]), (b"0-2", [b"e", _event(2)])],
    "a terminal last": [(b"0-1", [b"e", _event(1)]), (b"0-2", [b"e", _event(2, "stream.done")])],
    "a terminal inside": [(b"0-1", [b"e", _event(1, "stream.error")]), (b"0-2", [b"e", _event(2)])],
    "an unknown type inside": [(b"0-1", [b"e", _event(1)]), (b"0-2", [b"e", _event(2, "x.later")]),
                               (b"0-3", [b"e", _event(3)])],
    # items that are no JSON alone but join into an array of as many objects, boundaries shifted
    "halves of a string around the comma": [(b"0-1", [b"e", b'{"type":"block.delta","x":"']), (b"0-2", [b"e", b'"}']),
                                            (b"0-3", [b"e", b'{"type":"block.delta"},{"type":"block.delta"}'])],
    "halves of an array, a terminal inside": [
        (b"0-1", [b"e", b'{"type":"block.delta","x":[1']), (b"0-2", [b"e", b'2]}']),
        (b"0-3", [b"e", b'{"type":"stream.done"},{"type":"block.delta"}']), (b"0-4", [b"e", _event(4)])],
    "whitespace around an item": [(b"0-1", [b"e", b' ' + _event(1) + b'\t']), (b"0-2", [b"e", _event(2)])],
    "nested past the recursion limit": [(b"0-1", [b"e", _event(1)]),
                                        (b"0-2", [b"e", b'{"type":"x","x":' + b"[" * 5000 + b"]" * 5000 + b"}"]),
                                        (b"0-3", [b"e", _event(3)])],
}


@pytest.mark.parametrize("name", list(PAGES))
def test_the_page_parser_gives_what_parsing_each_entry_gives(name):
    raw = PAGES[name]
    careful = [parse_entry(entry_id, fields) for entry_id, fields in raw if entry_id.startswith(b"0-")]
    page = entries_of("st_p", raw)
    assert page == careful
    joined = Page(careful).frames()  # joined afresh from the careful entries
    assert page.frames() == joined
    for entry in careful:  # id, event, data lines and the blank line: no break inside the data
        assert entry.frame == b"" or (entry.frame.count(b"\n") == 4 and b"\r" not in entry.frame)


# --- shared reads -----------------------------------------------------------------------------------

class _GatedRedis(HookedRedis):
    """Holds the first XRANGE of the key until ``ready()`` is true, so later readers find it in flight."""

    def __init__(self, inner, key: str, ready) -> None:
        async def nothing() -> None:
            return None

        super().__init__(inner, key, lambda result: False, nothing)
        self._ready = ready
        self._held = False

    async def xrange(self, name, min="-", max="+", count=None):
        if name == self._key and not self._held:
            self._held = True
            for _ in range(2000):
                if self._ready():
                    break
                await asyncio.sleep(0.005)
        return await super().xrange(name, min, max, count)


async def test_readers_replaying_from_the_same_place_share_one_read_and_get_exact_streams(ctx):
    readers = 6
    gated: list[_GatedRedis] = []
    app_box: list = []

    def wrap(client):
        gated.append(_GatedRedis(client, ctx.keys.events(ctx.sid),
                                 lambda: bool(app_box) and app_box[0][HUB].reader_count(ctx.sid) == readers))
        return gated[0]

    server = await ctx.start_app(make_settings(read_page=8, read_first_page=3), wrap_redis=wrap)
    app_box.append(server.app)
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    events = text_stream(ctx.sid, 30)
    await writer.append(*events)

    async def read() -> list[int]:
        async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
            assert resp.status == 200
            return ids(await SSEClient(resp).events())

    got = await asyncio.gather(*(read() for _ in range(readers)))
    assert got == [list(range(1, events[-1].seq + 1))] * readers
    calls = gated[0].xrange_calls
    assert calls.count("(0-0") == 1  # one first-page read for the six readers
    assert len(calls) < readers * 2


async def test_reads_are_shared_only_under_the_same_key(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(*text_stream(ctx.sid, 3))
    store = Store(ctx.redis, ctx.keys, 8)
    one, other = object(), object()
    same = await asyncio.gather(store.read_after(ctx.sid, 0, share=one), store.read_after(ctx.sid, 0, share=one))
    assert same[0] is same[1]
    apart = await asyncio.gather(store.read_after(ctx.sid, 0, share=one), store.read_after(ctx.sid, 0, share=other),
                                 store.read_after(ctx.sid, 0), store.read_after(ctx.sid, 0))
    assert len({id(page) for page in apart}) == 4
    assert all(page == same[0] for page in apart)
    assert not store._inflight  # finished reads are forgotten


def test_a_page_joins_its_frames_once_and_only_when_whole():
    raw = PAGES["plain"]
    page = entries_of("st_p", raw)
    assert page.frames() is page.frames()
    assert page.frames() == b"".join(entry.frame for entry in page)
    assert entries_of("st_p", PAGES["invalid JSON"]).frames() is None  # an empty frame: the caller picks
    done_then_more = entries_of("st_p", [(b"0-1", [b"e", b'{"type":"stream.done","seq":1}']),
                                         (b"0-2", [b"e", _event(2)])])
    assert done_then_more.frames() is None


# --- the page parser against the careful one, on generated pages ----------------------------------

_ITEM = st.one_of(
    st.builds(lambda kind, extra: _event(0, kind, **extra),
              st.sampled_from(["block.delta", "block.start", "block.stop", "stream.start", "stream.done",
                               "stream.error", "x.later", "<bad>"]),
              st.dictionaries(st.sampled_from(["visibility", "note"]), st.sampled_from(["internal", "a\nb", 3]),
                              max_size=2)),
    st.sampled_from([b"", b"{not json", b"[1,2]", b"null", b'{"type":"block.delta"},{"type":"block.delta"}',
                     b'{"type":\r"stream.done"}', b'{"type":"block.delta",\n"seq":2}', b'"text"', b"{}",
                     b'{"type":"block.delta","x":"', b'"}', b'{"type":"stream.done","x":[1', b'2]}', b"1],[2",
                     b'"},{"type":"stream.done"}', b" {} "]),
)


@settings(max_examples=150, deadline=None)
@given(items=st.lists(_ITEM, min_size=1, max_size=12), first=st.integers(1, 10_000))
def test_generated_pages_parse_as_their_entries_one_by_one(items, first):
    """Whatever a page holds (events of any type, broken JSON, two objects in one item, an
    empty item, line breaks), the page parser's entries and joined frames are the careful
    parser's: the fast path may only be faster."""
    raw = [(b"0-%d" % (first + index), [b"e", item]) for index, item in enumerate(items)]
    careful = Page(parse_entry(entry_id, fields) for entry_id, fields in raw)
    page = entries_of("st_p", raw)
    assert page == careful
    assert page.frames() == careful.frames()


@pytest.mark.parametrize("last_event_id", [None, 2, 3])
async def test_a_replay_through_items_that_only_join_into_json_sends_what_each_item_alone_gives(ctx, last_event_id):
    """Stored items that are no JSON alone ('{..."x":"' then '","y":{"type":"stream.done"}}')
    join into an array of as many objects; the page parser must not take the shifted
    objects for theirs (that made seq 5 a ``stream.done`` and ended the replay there), and
    an item nested past the decoder's limit is an invalid entry, not a failed response."""
    server = await ctx.start_app(make_settings(read_page=4, read_first_page=2))
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    events = text_stream(ctx.sid, 3)  # seqs 1-3 here, the crafted items at 4-7, the rest after
    crafted = [b'{"type":"block.delta","x":"', b'","y":{"type":"stream.done"}}',
               b'{"type":"stream.done"},{"type":"block.delta"}',
               b'{"type":"block.delta","x":' + b"[" * 5000 + b"]" * 5000 + b"}"]
    items = [encode_event(event) for event in events[:3]] + crafted + [encode_event(event) for event in events[3:]]
    for seq, item in enumerate(items, 1):
        await ctx.redis.xadd(ctx.keys.events(ctx.sid), {"e": item}, id=f"0-{seq}")
    await writer.meta(last_seq=len(items), state="done", status="completed")
    headers = bearer(API_KEY) | ({"Last-Event-ID": str(last_event_id)} if last_event_id else {})
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=headers) as resp:
        assert resp.status == 200
        got = await SSEClient(resp).events()
    expected = [seq for seq in [1, 2, 3, 8, 9, 10, 11] if seq > (last_event_id or 0)]
    assert ids(got) == expected
    assert [m["event"] for m in got][-1] == "stream.done"
