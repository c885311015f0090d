"""The status route never answers ``running`` beside a result that holds the terminal event.

The route reads meta (``Store.info``), then the stored events (``XRANGE``): two round
trips. A stream whose worker stores its terminal event between them read as ``state:
running``, ``status: null`` and ``last_seq`` below the events assembled, while the result
said ``completed``. The terminal is stored here, by the worker's real append script,
right before the route's first ``XRANGE`` of the events reaches Redis.
"""

from __future__ import annotations

from typing import Any

from schema.contract import StreamDone, StreamStart, Usage
from tests.publisher.helpers import API_KEY, bearer
from worker.appender import Appender
from worker.lease import Leases


class BeforeFirstXrange:
    """Forwards to the real client; runs ``hook`` once, before the first XRANGE of ``key`` is sent."""

    def __init__(self, inner: Any, key: str, hook: Any) -> None:
        self._inner, self._key, self._hook = inner, key, hook
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def xrange(self, name: Any, min: Any = "-", max: Any = "+", count: Any = None) -> Any:
        if name == self._key and not self.fired:
            self.fired = True
            await self._hook()
        return await self._inner.xrange(name, min, max, count=count)


async def test_a_stream_ending_between_meta_and_events_reads_as_done(ctx):
    sid = ctx.sid
    claim = await Leases(ctx.redis, ctx.keys, consumer="c1", lease_s=30).claim(
        stream_id=sid, provider="openai_chat", model="m", entry_id="1-0", now_ms=1_000)
    writer = Appender(ctx.redis, ctx.keys).writer(sid, token=claim.token, last_seq=claim.last_seq)
    await writer.append([StreamStart(stream_id=sid, seq=1, ts=1_000, provider="openai_chat", model="m", metadata={})])

    async def finish() -> None:
        await writer.append([StreamDone(stream_id=sid, seq=2, ts=2_000, status="completed", finish_reason="stop",
                                        provider_finish_reason="stop", usage=Usage(input_tokens=1, output_tokens=1),
                                        response_id="r", model="m")])

    wrapped: list[BeforeFirstXrange] = []

    def wrap(client: Any) -> BeforeFirstXrange:
        wrapped.append(BeforeFirstXrange(client, ctx.keys.events(sid), finish))
        return wrapped[0]

    server = await ctx.start_app(wrap_redis=wrap)
    async with ctx.http.get(server.url(f"/v1/streams/{sid}"), headers=bearer(API_KEY)) as resp:
        assert resp.status == 200
        body = await resp.json()
    assert wrapped[0].fired
    assert body["result"]["status"] == "completed"
    assert (body["state"], body["status"], body["last_seq"]) == ("done", "completed", 2)
