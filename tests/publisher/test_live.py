"""The live channel carries the events: no read per notification, gaps repaired from the stream, exact order."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from publisher.live.notification import Notification, encode_notification, parse_notification
from schema.contract import encode_event
from tests.publisher.helpers import (
    API_KEY,
    GUARD_S,
    SSEClient,
    StreamWriter,
    bearer,
    block_start,
    delta,
    done,
    ids,
    make_settings,
    recording_redis,
    start,
    stop,
)
from worker.appender import Appender
from worker.lease import Leases


def test_parse_both_payload_shapes():
    events = [b'{"a":1}', b'{"b":2}']
    assert parse_notification(b"7") == Notification(last_seq=7, first_seq=7, events=None)
    assert parse_notification(b"7 6\n" + b"\n".join(events)) == Notification(last_seq=7, first_seq=6, events=events)
    assert parse_notification(encode_notification(6, events, 1000)) == parse_notification(b"7 6\n" + b"\n".join(events))


def test_payload_whose_lines_disagree_with_its_seqs_is_seq_only():
    assert parse_notification(b"9 6\n{}\n{}") == Notification(last_seq=9, first_seq=9, events=None)
    assert parse_notification(b"junk") is None


async def _hooked(ctx) -> tuple:
    wrap, hooked = recording_redis(ctx.keys.events(ctx.sid))
    server = await ctx.start_app(wrap_redis=wrap)
    return server, hooked


async def test_full_notifications_serve_live_readers_without_a_read(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    server, hooked = await _hooked(ctx)
    responses = [await ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY))
                 for _ in range(3)]
    clients = [SSEClient(resp) for resp in responses]
    for client in clients:
        assert (await client.next_event())["id"] == "1"
    before = len(hooked[0].xrange_calls)
    await writer.append(block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0), stop(ctx.sid, 4, 0), done(ctx.sid, 5),
                        full=True)
    for client in clients:
        assert ids(await client.events()) == [2, 3, 4, 5]
    assert len(hooked[0].xrange_calls) == before
    for resp in responses:
        resp.close()


async def test_dropped_notification_is_repaired_from_the_stream(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        client = SSEClient(resp)
        assert (await client.next_event())["id"] == "1"
        await writer.append(block_start(ctx.sid, 2, 0), full=True)
        assert (await client.next_event())["id"] == "2"
        await writer.append(delta(ctx.sid, 3, 0), notify=False)  # its notification is lost
        await writer.append(delta(ctx.sid, 4, 0), stop(ctx.sid, 5, 0), done(ctx.sid, 6), full=True)
        assert ids(await client.events()) == [3, 4, 5, 6]


async def test_reordered_notifications_deliver_each_event_once_in_order(ctx):
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        client = SSEClient(resp)
        assert (await client.next_event())["id"] == "1"
        events = [block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0), stop(ctx.sid, 4, 0), done(ctx.sid, 5)]
        await writer.append(*events, notify=False)
        await writer.notify(3, [encode_event(events[1])])  # seq 3 before seq 2
        await writer.notify(2, [encode_event(events[0])])
        await writer.notify(5, [encode_event(e) for e in events[2:]])
        assert ids(await client.events()) == [2, 3, 4, 5]


async def test_events_appended_by_the_worker_script_reach_a_live_reader(ctx):
    claim = await Leases(ctx.redis, ctx.keys, consumer="c1", lease_s=30).claim(
        stream_id=ctx.sid, provider="openai_chat", model="m", entry_id="1-0", now_ms=1_000)
    worker = Appender(ctx.redis, ctx.keys).writer(ctx.sid, token=claim.token, last_seq=claim.last_seq)
    await worker.append([start(ctx.sid)])
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        client = SSEClient(resp)
        assert (await client.next_event())["id"] == "1"
        await worker.append([block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0, "hi")])
        await worker.append([stop(ctx.sid, 4, 0), done(ctx.sid, 5)])
        messages = await client.events()
    assert ids(messages) == [2, 3, 4, 5]
    assert json.loads(messages[1]["data"])["delta"]["text"] == "hi"


async def test_reader_whose_history_disappears_gets_a_gap_within_one_heartbeat(ctx):
    server = await ctx.start_app(make_settings(heartbeat_s=0.6))
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0))
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        client = SSEClient(resp)
        assert [(await client.next_event())["id"] for _ in range(2)] == ["1", "2"]
        await ctx.redis.delete(ctx.keys.events(ctx.sid), ctx.keys.meta(ctx.sid))  # Redis lost the data
        messages = []
        async with asyncio.timeout(GUARD_S):  # pings alone would never end the loop
            while (message := await client.message()) is not None:
                messages.append(message)
    assert messages[-1]["event"] == "stream.gap"
    assert json.loads(messages[-1]["data"])["after_seq"] == 2
    assert all("id" not in m for m in messages)


async def test_lost_last_notification_is_found_by_the_audit(ctx):
    server = await ctx.start_app(make_settings(heartbeat_s=0.6))
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        client = SSEClient(resp)
        assert (await client.next_event())["id"] == "1"
        await writer.append(block_start(ctx.sid, 2, 0), stop(ctx.sid, 3, 0), done(ctx.sid, 4), notify=False)
        async with asyncio.timeout(GUARD_S):  # pings alone would never end the read
            assert ids(await client.events()) == [2, 3, 4]


async def test_reader_far_behind_catches_up_while_others_keep_up(ctx):
    server = await ctx.start_app(make_settings(client_queue=10_000))
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    url = server.url(f"/v1/streams/{ctx.sid}/events")
    fast_resp = await ctx.http.get(url, headers=bearer(API_KEY))
    slow_resp = await ctx.http.get(url, headers=bearer(API_KEY))
    fast, slow = SSEClient(fast_resp), SSEClient(slow_resp)
    assert (await fast.next_event())["id"] == "1"
    assert (await slow.next_event())["id"] == "1"
    text = "w" * 2000
    for seq in range(2, 602):
        await writer.append(delta(ctx.sid, seq, 0, text), full=True)
        assert int((await fast.next_event())["id"]) == seq  # the slow one reads nothing meanwhile
    await writer.append(done(ctx.sid, 602), full=True)
    assert ids(await fast.events()) == [602]
    assert ids(await slow.events()) == list(range(2, 603))


class _HeldAudit:
    """Forwards to the real client; once armed, holds the next audit pipeline (``HMGET``, ``XREVRANGE``) once run."""

    def __init__(self, inner: Any, hold_s: float) -> None:
        self._inner, self._hold_s = inner, hold_s
        self.armed = False
        self.held = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        return _HeldPipeline(self._inner.pipeline(*args, **kwargs), self)


class _HeldPipeline:
    def __init__(self, inner: Any, owner: _HeldAudit) -> None:
        self._inner, self._owner = inner, owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def __aenter__(self) -> _HeldPipeline:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._inner.__aexit__(*exc)

    async def execute(self, **kwargs: Any) -> Any:
        audit = any(args[0] == "HMGET" for args, _ in self._inner.command_stack)
        result = await self._inner.execute(**kwargs)
        if audit and self._owner.armed and not self._owner.held.is_set():
            self._owner.held.set()
            await asyncio.sleep(self._owner._hold_s)
        return result


async def test_an_event_delivered_while_the_audit_reads_the_top_is_no_gap(ctx):
    """The audit's top was read before an append its notification delivered: the top is stale, not lost history.

    Redis answers the audit's ``XREVRANGE`` (top 2), then the worker appends seq 3 and
    publishes it with its event; the publisher may handle that notification before it
    resumes the audit (the pub/sub connection is dispatched as it is read). The audit then
    sees a top below what live readers were sent: that is not history gone.
    """
    held: list[_HeldAudit] = []

    def wrap(client: Any) -> _HeldAudit:
        held.append(_HeldAudit(client, hold_s=0.5))
        return held[0]

    server = await ctx.start_app(make_settings(heartbeat_s=0.4), wrap_redis=wrap)
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0))
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(API_KEY)) as resp:
        client = SSEClient(resp)
        assert [(await client.next_event())["id"] for _ in range(2)] == ["1", "2"]
        held[0].armed = True
        async with asyncio.timeout(GUARD_S):
            await held[0].held.wait()  # the audit read top 2 (the stream was quiet) and is held
        await writer.append(delta(ctx.sid, 3, 0), full=True)
        assert (await client.next_event())["id"] == "3"
        await asyncio.sleep(0.6)  # the audit resumes with its top of 2
        await writer.append(stop(ctx.sid, 4, 0), done(ctx.sid, 5), full=True)
        messages = []
        while (message := await client.message()) is not None:
            messages.append(message)
    assert [m.get("event") for m in messages if "data" in m] == ["block.stop", "stream.done"]  # no stream.gap
