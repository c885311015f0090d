"""``history_complete`` of the status route is false whenever the result lacks stored events.

The status route assembles the stored events; ``history_complete`` tells a client (and
``fanout tail``/``submit``, which warn on it) whether that result is whole. It was computed
only from the first seq read being 1 or *nothing being read*, so a stream whose events key
vanished while its meta stayed (evicted under a ``maxmemory`` policy that evicts, deleted by
hand) answered ``history_complete: true`` with an empty result beside ``last_seq`` 6 and a
``completed`` status, and a hole inside the history (a failover lost events: meta
``lost_from``/``lost_to``, the terminal stored after them) read as complete too.
"""

from __future__ import annotations

import pytest

from tests.publisher.helpers import StreamWriter, bearer, text_stream, token_for

pytestmark = pytest.mark.topologies


async def status_of(ctx):
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}"), headers=bearer(token_for(ctx.sid))) as resp:
        assert resp.status == 200
        return await resp.json()


async def test_a_stream_whose_events_are_gone_under_its_meta_is_not_complete(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*text_stream(ctx.sid, 2))
    await ctx.redis.delete(ctx.keys.events(ctx.sid))  # what an evicting maxmemory policy does to one key
    body = await status_of(ctx)
    assert (body["state"], body["status"], body["last_seq"]) == ("done", "completed", 6)
    assert body["result"]["blocks"] == []
    assert body["history_complete"] is False


async def test_a_hole_inside_the_history_is_not_complete(ctx):
    events = text_stream(ctx.sid, 3)  # 1 start, 2 block.start, 3-5 deltas, 6 stop, 7 done
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*events)
    await ctx.redis.xdel(ctx.keys.events(ctx.sid), "0-3", "0-4")  # lost with a failed-over master
    body = await status_of(ctx)
    assert body["last_seq"] == 7
    assert body["history_complete"] is False


async def test_a_whole_history_and_a_queued_stream_are_complete(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta(state="queued")
    assert (await status_of(ctx))["history_complete"] is True
    await writer.append(*text_stream(ctx.sid, 2))
    assert (await status_of(ctx))["history_complete"] is True
