"""``/events?snapshot=1``: one ``stream.snapshot`` then the tail, on real Redis and real sockets (contract 1.1)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from schema.contract import Event, decode_event
from schema.jsonschema import build_schema
from schema.reducer import AssembledResult, reduce
from schema.snapshot import StreamSnapshot, assembler_from, decode_snapshot
from tests.publisher.conftest import Ctx
from tests.publisher.helpers import (
    API_KEY,
    GUARD_S,
    HookedRedis,
    SSEClient,
    StreamWriter,
    bearer,
    block_start,
    delta,
    done,
    recording_redis,
    start,
    stop,
    text_stream,
    token_for,
)
from tests.publisher.test_ui_node import golden_events

pytestmark = pytest.mark.topologies

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = sorted((ROOT / "transcripts").glob("*/*.events.jsonl"))


def events_url(ctx: Ctx, sid: str, query: str = "?snapshot=1") -> str:
    return ctx.server.url(f"/v1/streams/{sid}/events{query}")


async def first_message(ctx: Ctx, sid: str, headers: dict[str, str], query: str = "?snapshot=1") -> dict[str, str]:
    """The first SSE message with data of one request; the connection is then closed."""
    async with ctx.http.get(events_url(ctx, sid, query), headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        message = await SSEClient(resp).next_event()
    assert message is not None
    return message


async def read_all(ctx: Ctx, sid: str, headers: dict[str, str], query: str = "") -> list[dict[str, str]]:
    """Every SSE message with data of one request read to its end (the stream must be finished)."""
    async with ctx.http.get(events_url(ctx, sid, query), headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        client, out = SSEClient(resp), []
        while (message := await client.next_event()) is not None:
            out.append(message)
    return out


def tail_events(messages: list[dict[str, str]]) -> list[Event]:
    events = [decode_event(message["data"]) for message in messages if message.get("event") != "stream.snapshot"]
    return [event for event in events if event is not None]


def continued(snapshot: StreamSnapshot, tail: list[Event]) -> AssembledResult:
    assembler = assembler_from(snapshot)
    for event in tail:
        assembler.apply(event)
    return assembler.result()


async def test_snapshot_then_tail_equals_the_full_replay_at_every_split_of_every_golden(ctx: Ctx) -> None:
    """For each golden, a snapshot taken with k events stored, then the tail after its id, assembles the whole."""
    for path in GOLDENS:
        sid = f"{ctx.sid}_{path.parent.name}_{path.name.split('.')[0]}"[:128]
        events = golden_events(path, sid)
        writer, auth = StreamWriter(ctx.redis, ctx.keys, sid), bearer(token_for(sid))
        await writer.meta(provider=getattr(events[0], "provider", "openai_chat"))
        snapshots = [await first_message(ctx, sid, auth)]
        for event in events:
            await writer.append(event, notify=False)
            snapshots.append(await first_message(ctx, sid, auth))
        whole = reduce(tail_events(await read_all(ctx, sid, auth)), sid)
        assert whole == reduce(events, sid)
        for split, message in enumerate(snapshots):
            snapshot = decode_snapshot(message["data"])
            assert (message["event"], message["id"], snapshot.seq) == ("stream.snapshot", str(split), split), path
            assert snapshot.result == reduce(events[:split], sid), (path, split)
            tail = [] if split == len(events) else tail_events(
                await read_all(ctx, sid, {**auth, "Last-Event-ID": message["id"]}))
            assert [event.seq for event in tail] == list(range(split + 1, len(events) + 1)), (path, split)
            assert continued(snapshot, tail) == whole, (path, split)


async def test_snapshot_of_a_finished_stream_is_its_whole_result_in_one_frame_and_the_response_ends(ctx: Ctx) -> None:
    events = text_stream(ctx.sid, 300)
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*events)
    messages = await read_all(ctx, ctx.sid, bearer(token_for(ctx.sid)), "?snapshot=1")
    assert [(m["event"], m["id"]) for m in messages] == [("stream.snapshot", str(len(events)))]
    snapshot = decode_snapshot(messages[0]["data"])
    assert snapshot.result == reduce(events)
    assert snapshot.result.blocks[0].text == "".join(f"t{i} " for i in range(300))  # type: ignore[union-attr]
    assert snapshot.ts == events[-1].ts
    jsonschema.validate(msgspec.json.decode(messages[0]["data"]), build_schema())


async def test_many_reloads_of_a_finished_stream_read_its_events_once(ctx: Ctx) -> None:
    wrap, hooked = recording_redis(ctx.keys.events(ctx.sid))
    server = await ctx.start_app(wrap_redis=wrap)
    events = text_stream(ctx.sid, 100)
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*events)
    url = server.url(f"/v1/streams/{ctx.sid}/events?snapshot=1")

    async def reload() -> bytes:
        async with ctx.http.get(url, headers=bearer(token_for(ctx.sid))) as resp:
            return await resp.read()

    bodies = set(await asyncio.gather(*(reload() for _ in range(20))))
    bodies.add(await reload())
    assert len(bodies) == 1  # the same bytes for every reader
    assert len(hooked[0].xrange_calls) == 1  # one assembly (one page) for all of them, shared and kept


async def test_late_joiner_of_a_running_stream_gets_the_current_text_in_one_frame_then_live_events(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=b"e1")
    first = [start(ctx.sid), block_start(ctx.sid, 2, 0)] + [delta(ctx.sid, 3 + i, 0, f"w{i} ") for i in range(50)]
    await writer.append(*first)
    async with ctx.http.get(events_url(ctx, ctx.sid), headers=bearer(token_for(ctx.sid))) as resp:
        assert resp.headers["Cache-Control"] == "no-store, no-transform"
        client = SSEClient(resp)
        message = await client.next_event()
        assert message is not None
        assert message["id"] == "52.e1"
        snapshot = decode_snapshot(message["data"])
        assert snapshot.result.status == "running"
        assert snapshot.result.blocks[0].text == "".join(f"w{i} " for i in range(50))  # type: ignore[union-attr]
        rest = [delta(ctx.sid, 53, 0, "live"), stop(ctx.sid, 54, 0), done(ctx.sid, 55)]
        await writer.append(*rest)
        live = []
        while (message := await client.next_event()) is not None:
            live.append(message)
    assert [m["id"] for m in live] == ["53.e1", "54.e1", "55.e1"]
    assert continued(snapshot, tail_events(live)) == reduce(first + rest)


async def test_resume_after_a_snapshot_continues_from_its_id_and_sends_no_second_snapshot(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=b"e7")
    events = text_stream(ctx.sid, 5)
    await writer.append(*events[:4])
    auth = bearer(token_for(ctx.sid))
    message = await first_message(ctx, ctx.sid, auth)
    assert message["id"] == "4.e7"
    await writer.append(*events[4:])
    # an EventSource reconnects to the same URL (snapshot=1) with Last-Event-ID: it resumes, no snapshot
    resumed = await read_all(ctx, ctx.sid, {**auth, "Last-Event-ID": message["id"]}, "?snapshot=1")
    assert [m["event"] for m in resumed] == ["block.delta"] * 3 + ["block.stop", "stream.done"]
    assert [m["id"] for m in resumed] == [f"{seq}.e7" for seq in range(5, 10)]
    stale = await ctx.http.get(events_url(ctx, ctx.sid), headers={**auth, "Last-Event-ID": "4.other"})
    assert stale.status == 410  # the snapshot's epoch is checked like any id's


async def test_public_snapshot_and_its_tail_leave_internal_reasoning_out_at_every_split(ctx: Ctx) -> None:
    sid = ctx.sid
    events = [start(sid), block_start(sid, 2, 0, "reasoning", "internal"), delta(sid, 3, 0, "secret ", "reasoning"),
              delta(sid, 4, 0, "plan", "reasoning"), stop(sid, 5, 0, "reasoning"), block_start(sid, 6, 1),
              delta(sid, 7, 1, "answer"), stop(sid, 8, 1), done(sid, 9)]
    writer = StreamWriter(ctx.redis, ctx.keys, sid)
    public, internal = bearer(token_for(sid)), bearer(API_KEY)
    visible = [e for e in events if getattr(getattr(e, "block", None), "kind", "") != "reasoning"]
    for split in range(1, len(events) + 1):
        await writer.append(events[split - 1], notify=False)
        for auth, expected in ((public, reduce(visible[:sum(e.seq <= split for e in visible)], sid)),
                               (internal, reduce(events[:split], sid))):
            message = await first_message(ctx, sid, auth)
            snapshot = decode_snapshot(message["data"])
            assert snapshot.result == expected, split
            assert "secret" not in message["data"] or auth is internal
    for split in range(1, len(events)):
        tail = await read_all(ctx, sid, {**public, "Last-Event-ID": str(split)})
        assert all("secret" not in m["data"] and "plan" not in m["data"] for m in tail), split


async def test_a_stream_written_again_while_its_snapshot_is_assembled_is_snapshotted_in_its_new_generation(
        ctx: Ctx) -> None:
    old, new = text_stream(ctx.sid, 3), [start(ctx.sid), block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0, "again")]

    async def written_again() -> None:  # between the entries read and the epoch read after them
        await ctx.redis.delete(ctx.keys.events(ctx.sid), ctx.keys.meta(ctx.sid))
        await StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=b"e2").append(*new, notify=False)

    server = await ctx.start_app(wrap_redis=lambda client: HookedRedis(client, ctx.keys.events(ctx.sid),
                                                                       bool, written_again))
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=b"e1").append(*old, notify=False)
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events?snapshot=1"),
                            headers=bearer(token_for(ctx.sid))) as resp:
        assert resp.status == 200
        message = await SSEClient(resp).next_event()
    assert message is not None
    assert message["id"] == "3.e2"
    assert decode_snapshot(message["data"]).result == reduce(new)  # nothing of the first generation


async def test_snapshot_of_a_queued_stream_is_empty_at_seq_0(ctx: Ctx) -> None:
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).meta(state="queued")
    message = await first_message(ctx, ctx.sid, bearer(token_for(ctx.sid)))
    snapshot = decode_snapshot(message["data"])
    assert (message["id"], snapshot.seq, snapshot.ts, snapshot.result.blocks) == ("0", 0, 0, [])
    assert snapshot.result.status == "running"


@pytest.mark.parametrize("query", ["?snapshot=yes", "?snapshot=1&snapshot=1"])
async def test_a_bad_snapshot_parameter_is_400_invalid_field(ctx: Ctx, query: str) -> None:
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*text_stream(ctx.sid, 1))
    async with ctx.http.get(events_url(ctx, ctx.sid, query), headers=bearer(token_for(ctx.sid))) as resp:
        assert resp.status == 400
        assert (await resp.json())["type"].endswith("/invalid-field")


async def test_snapshot_0_reads_the_history_as_without_it(ctx: Ctx) -> None:
    events = text_stream(ctx.sid, 2)
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*events)
    messages = await read_all(ctx, ctx.sid, bearer(token_for(ctx.sid)), "?snapshot=0")
    assert [int(m["id"]) for m in messages] == [event.seq for event in events]


async def test_snapshot_of_a_history_that_no_longer_starts_at_seq_1_is_410_trimmed(ctx: Ctx) -> None:
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*text_stream(ctx.sid, 4))
    await ctx.redis.xdel(ctx.keys.events(ctx.sid), "0-1", "0-2")
    async with ctx.http.get(events_url(ctx, ctx.sid), headers=bearer(token_for(ctx.sid))) as resp:
        assert resp.status == 410
        assert (await resp.json())["type"].endswith("/history-trimmed")


async def test_the_python_client_follows_a_snapshot_then_the_tail(ctx: Ctx) -> None:
    from fanout_client import FanoutClient

    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    events = text_stream(ctx.sid, 40)
    await writer.append(*events[:20])
    async with FanoutClient(ctx.server.base_url, session=ctx.http) as client:
        seen: list[Any] = []

        async def follow() -> None:
            async for item in client.events(ctx.sid, token=token_for(ctx.sid), snapshot=True):
                seen.append(item)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.05)
        await writer.append(*events[20:])
        await asyncio.wait_for(task, GUARD_S)
        assert isinstance(seen[0], StreamSnapshot)
        assert seen[0].seq == 20
        assert [event.seq for event in seen[1:]] == [event.seq for event in events[20:]]
        assert await client.result(ctx.sid, token=token_for(ctx.sid)) == reduce(events)
