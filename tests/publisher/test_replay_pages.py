"""History replay pages: a small first page, then full pages; the page parser's fast path equals the careful one."""

from __future__ import annotations

import msgspec
import pytest

from publisher.store import entries_of, parse_entry
from tests.publisher.helpers import (
    API_KEY,
    HookedRedis,
    SSEClient,
    StreamWriter,
    bearer,
    ids,
    make_settings,
    text_stream,
)


def _hooked(ctx, hooked: list[HookedRedis]):
    async def nothing() -> None:
        return None

    def wrap(client):
        hooked.append(HookedRedis(client, ctx.keys.events(ctx.sid), lambda result: False, nothing))
        return hooked[0]

    return wrap


@pytest.mark.parametrize("position", [0, 5])
async def test_replay_reads_a_small_first_page_then_full_pages_and_loses_nothing(ctx, position):
    hooked: list[HookedRedis] = []
    server = await ctx.start_app(make_settings(read_page=8, read_first_page=3), wrap_redis=_hooked(ctx, hooked))
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
    hooked: list[HookedRedis] = []
    server = await ctx.start_app(make_settings(read_page=4, read_first_page=50), wrap_redis=_hooked(ctx, hooked))
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
}


@pytest.mark.parametrize("name", list(PAGES))
def test_the_page_parser_gives_what_parsing_each_entry_gives(name):
    raw = PAGES[name]
    careful = [parse_entry(entry_id, fields) for entry_id, fields in raw if entry_id.startswith(b"0-")]
    assert entries_of("st_p", raw) == careful
    for entry in careful:  # id, event, data lines and the blank line: no break inside the data
        assert entry.frame == b"" or (entry.frame.count(b"\n") == 4 and b"\r" not in entry.frame)
