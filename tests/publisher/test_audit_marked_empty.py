"""A stream marked ended with no event of ours ends its live readers too.

When storage refuses a stream's every write, the worker ends it without an event
(:data:`worker.salvage.MARK_LUA`: meta ``state=done`` and the status). docs/reliability.md promises
that an SSE reader's response then ends at its next idle heartbeat and its reconnect gets
204. A reader that connected before the first event was stored (position 0, the stream
``queued``) is live with nothing fetched; when the refusal came at the very first append
(an entry fanout did not write sits in the events key: no ``XADD 0-1`` can succeed), the
stream is marked with no event of ours at all. The audit then reads state ``done`` and no
top: that reader must be closed as well, not left with heartbeats forever.
"""

from __future__ import annotations

import asyncio

import aiohttp

from publisher.state import HUB
from tests.publisher.helpers import GUARD_S, SSEClient, StreamWriter, bearer, eventually, make_settings, token_for
from worker.salvage import Salvage


async def test_a_reader_of_a_stream_marked_done_before_its_first_event_is_ended(ctx):
    server = await ctx.start_app(make_settings(heartbeat_s=0.4))  # audits every 0.2 s
    hub = server.app[HUB]
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta(state="queued", token=1)
    url = f"{server.base_url}/v1/streams/{ctx.sid}/events"
    timeout = aiohttp.ClientTimeout(total=GUARD_S)
    async with ctx.http.get(url, headers=bearer(token_for(ctx.sid)), timeout=timeout) as resp:
        assert resp.status == 200
        await eventually(lambda: any(r.sink is not None for r in hub.readers()))
        # someone else's entry in the events key: the worker's first XADD 0-1 is refused for good
        await ctx.redis.xadd(ctx.keys.events(ctx.sid), {"e": "not ours"})
        salvage = Salvage(ctx.redis, ctx.keys, ("600", "3600"))
        code, last = await salvage.mark(ctx.sid, token=1, status="failed", ended_ms=1, category="internal",
                                        message="storage error: an entry that fanout did not write sits above "
                                                "the stream's events")
        assert (code, last) == ("ok", "0")
        client = SSEClient(resp)
        async with asyncio.timeout(3):  # a few heartbeats; the guard of the read is GUARD_S
            while (msg := await client.message()) is not None:
                assert "id" not in msg, msg
    async with ctx.http.get(url, headers=bearer(token_for(ctx.sid))) as again:
        assert again.status == 204
