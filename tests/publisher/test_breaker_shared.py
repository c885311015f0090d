"""Adversarial review: a read shared with a reader that joined later must not look like lost history."""

from __future__ import annotations

import asyncio

from publisher.state import HUB
from tests.publisher.helpers import (
    API_KEY,
    HookedRedis,
    SSEClient,
    StreamWriter,
    bearer,
    delta,
    done,
    eventually,
    ids,
    make_settings,
    text_stream,
)


async def _late_joiner(ctx, first_reader_at: int, joiner_at: int) -> tuple[int, list[dict[str, str]]]:
    """Reader A's first read is answered by Redis, then (before A sees the reply) a worker appends
    one entry and reader B arrives at the same position: B reads meta after the append but joins A's
    read, answered before it."""
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    events = text_stream(ctx.sid, 6)[:-2]  # seqs 1..8 stored, running
    await writer.append(*events, full=True)
    top = events[-1].seq
    app_box: list = []
    late: list[asyncio.Task] = []

    async def joiner() -> tuple[int, list[dict[str, str]]]:
        headers = bearer(API_KEY) | {"Last-Event-ID": str(joiner_at)}
        async with ctx.http.get(app_box[0].url(f"/v1/streams/{ctx.sid}/events"), headers=headers) as resp:
            if resp.status != 200:
                return resp.status, []
            client = SSEClient(resp)
            got = []
            while (msg := await client.message()) is not None:
                if "data" in msg:
                    got.append(msg)
                    if msg.get("event") in ("stream.gap", "stream.done"):
                        break
                    if msg.get("id") == str(top + 1):  # the appended entry arrived: finish the stream
                        await writer.append(done(ctx.sid, top + 2), full=True)
            return resp.status, got

    async def append_then_join() -> None:
        await writer.append(delta(ctx.sid, top + 1, 0, "late"), full=True)
        late.append(asyncio.ensure_future(joiner()))
        # B has read meta and waits on a read now (A's, before the fix); with the fix it may be done already
        await eventually(lambda: app_box[0].app[HUB].reader_count(ctx.sid) == 2 or late[0].done())

    hooked: list[HookedRedis] = []

    def wrap(client):
        hooked.append(HookedRedis(client, ctx.keys.events(ctx.sid), lambda result: True, append_then_join))
        return hooked[0]

    server = await ctx.start_app(make_settings(), wrap_redis=wrap)
    app_box.append(server)
    headers = bearer(API_KEY) | {"Last-Event-ID": str(first_reader_at)}
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=headers) as resp:
        assert resp.status == 200
        await eventually(lambda: bool(late))
        return await late[0]


async def test_a_reader_that_joins_a_read_answered_before_its_meta_read_is_not_refused_410(ctx):
    status, got = await _late_joiner(ctx, 8, 8)
    assert status == 200  # before the fix: 410 history-trimmed, first_seq null, for a valid position
    assert ids(got) == [9, 10]


async def test_a_reader_that_joins_a_shorter_read_gets_no_false_gap(ctx):
    status, got = await _late_joiner(ctx, 5, 5)
    assert status == 200
    assert [m.get("event") for m in got if "id" not in m] == []  # before the fix: one stream.gap frame
    assert ids(got) == [6, 7, 8, 9, 10]
