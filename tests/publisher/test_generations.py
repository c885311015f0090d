"""Generations (contract 1.1) at the edge: SSE ids name the epoch, and a position in another one is refused.

A stream written again from seq 1 (Redis restored from an older snapshot) is another
generation with another epoch. Readers must learn it: a ``Last-Event-ID`` naming another
epoch is ``410 history-reset`` (never the new generation's suffix), a live reader whose
stream changes generation gets a ``stream.gap`` with ``reason: history-reset``, and the
status route says whether the caller's generation is the stream's.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from fanout_client import FanoutClient, HistoryResetError
from publisher.state import HUB
from schema.contract import parse_event_id
from tests.publisher.helpers import (
    SSEClient,
    StreamWriter,
    bearer,
    block_start,
    delta,
    done,
    eventually,
    start,
    stop,
    token_for,
)

EPOCH = b"aaaa1111"
OTHER = b"bbbb2222"


async def _get(ctx, path: str, last_event_id: str | None = None):
    headers = bearer(token_for(ctx.sid))
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    return await ctx.http.get(ctx.server.url(path), headers=headers)


async def _three(ctx, epoch: bytes = EPOCH, *, end: bool = False) -> StreamWriter:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=epoch)
    await writer.meta()
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0), full=True)
    if end:
        await writer.append(done(ctx.sid, 4), full=True)
    return writer


async def test_every_sse_id_names_the_streams_epoch(ctx) -> None:
    await _three(ctx, end=True)
    async with await _get(ctx, f"/v1/streams/{ctx.sid}/events") as resp:
        messages = await SSEClient(resp).events()
    assert [m["id"] for m in messages] == ["1.aaaa1111", "2.aaaa1111", "3.aaaa1111", "4.aaaa1111"]
    assert [json.loads(m["data"])["seq"] for m in messages] == [1, 2, 3, 4]  # data's seq stays the number


async def test_a_stream_without_an_epoch_keeps_bare_seq_ids(ctx) -> None:
    await _three(ctx, b"", end=True)
    async with await _get(ctx, f"/v1/streams/{ctx.sid}/events") as resp:
        assert [m["id"] for m in await SSEClient(resp).events()] == ["1", "2", "3", "4"]


@pytest.mark.parametrize("position", ["2.aaaa1111", "2"])
async def test_a_position_of_this_generation_or_a_bare_seq_resumes_exactly(ctx, position: str) -> None:
    await _three(ctx, end=True)
    async with await _get(ctx, f"/v1/streams/{ctx.sid}/events", position) as resp:
        assert [m["id"] for m in await SSEClient(resp).events()] == ["3.aaaa1111", "4.aaaa1111"]


async def test_a_position_of_another_generation_is_410_history_reset_never_the_new_suffix(ctx) -> None:
    await _three(ctx, OTHER)
    async with await _get(ctx, f"/v1/streams/{ctx.sid}/events", "2.aaaa1111") as resp:
        problem = await resp.json(content_type=None)
    assert resp.status == 410
    assert problem["type"].endswith("/history-reset")
    assert (problem["epoch"], problem["last_seq"]) == ("bbbb2222", 3)


async def test_a_position_with_an_epoch_on_a_stream_not_started_again_yet_is_410(ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta(state="queued")  # restored from a snapshot taken while queued: no epoch, nothing stored
    async with await _get(ctx, f"/v1/streams/{ctx.sid}/events", "5.aaaa1111") as resp:
        problem = await resp.json(content_type=None)
    assert (resp.status, problem["type"].rsplit("/", 1)[1], problem["epoch"]) == (410, "history-reset", None)


async def test_an_expired_stream_answers_by_its_tombstones_epoch(ctx) -> None:
    writer = await _three(ctx, end=True)
    await writer.expire(4)
    await ctx.redis.hset(ctx.keys.tomb(ctx.sid), "epoch", EPOCH)
    async with await _get(ctx, f"/v1/streams/{ctx.sid}/events", "4.aaaa1111") as resp:
        assert resp.status == 204
    async with await _get(ctx, f"/v1/streams/{ctx.sid}/events", "4.bbbb2222") as resp:
        assert (resp.status, (await resp.json(content_type=None))["type"].rsplit("/", 1)[1]) == (410, "history-reset")


@pytest.mark.parametrize("position", ["2.", ".2", "2.AA", "2.a.b", "2.a-b", "x.aaaa", "2." + "a" * 33])
async def test_a_malformed_event_id_is_400_invalid_position(ctx, position: str) -> None:
    await _three(ctx)
    async with await _get(ctx, f"/v1/streams/{ctx.sid}/events", position) as resp:
        assert resp.status == 400
        assert (await resp.json(content_type=None))["type"].endswith("/invalid-position")


async def test_a_live_reader_whose_stream_is_written_again_gets_a_history_reset_gap(ctx) -> None:
    await _three(ctx)
    async with await _get(ctx, f"/v1/streams/{ctx.sid}/events") as resp:
        client = SSEClient(resp)
        for _ in range(3):
            await client.next_event()
        again = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=OTHER)  # the stream's keys were restored empty
        await ctx.redis.delete(ctx.keys.events(ctx.sid))
        await again.meta(last_seq=0)
        await again.append(start(ctx.sid), block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0),
                           delta(ctx.sid, 4, 0, "spliced?"), full=True)
        gap = await client.next_event()
        assert gap is not None
        assert gap["event"] == "stream.gap"
        assert "id" not in gap
        assert json.loads(gap["data"])["reason"] == "history-reset"
        assert await client.next_event() is None  # the response ended: seq 4 of the new generation never came


async def test_status_names_the_epoch_and_a_callers_other_epoch_is_not_complete(ctx) -> None:
    await _three(ctx, end=True)
    for query, complete in (("", True), ("?epoch=aaaa1111", True), ("?epoch=bbbb2222", False)):
        async with await _get(ctx, f"/v1/streams/{ctx.sid}{query}") as resp:
            status = await resp.json()
        assert (status["epoch"], status["history_complete"]) == ("aaaa1111", complete)


@pytest.mark.parametrize("query", ["?epoch=A", "?epoch=aaaa1111&epoch=aaaa1111", "?epoch="])
async def test_status_refuses_a_malformed_epoch(ctx, query: str) -> None:
    await _three(ctx)
    async with await _get(ctx, f"/v1/streams/{ctx.sid}{query}") as resp:
        assert resp.status == 400


async def test_ui_reader_whose_stream_is_written_again_gets_an_error_chunk_without_done(ctx) -> None:
    await _three(ctx)
    async with await _get(ctx, f"/v1/streams/{ctx.sid}/ui") as resp:
        lines: list[str] = []
        while len([line for line in lines if line.startswith("data:")]) < 4:  # start, start-step, text-start, delta
            lines.append((await resp.content.readline()).decode().strip())
        again = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=OTHER)
        await ctx.redis.delete(ctx.keys.events(ctx.sid))
        await again.meta(last_seq=0)
        await again.append(start(ctx.sid), block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0),
                           delta(ctx.sid, 4, 0, "spliced?"), full=True)
        rest = (await resp.content.read()).decode()
    chunks = [json.loads(line[6:]) for line in rest.splitlines() if line.startswith("data: {")]
    assert [chunk["type"] for chunk in chunks] == ["error"]
    assert "history-reset" in chunks[0]["errorText"]
    assert "[DONE]" not in rest
    assert "spliced?" not in rest


def test_parse_event_id_takes_a_seq_or_seq_and_epoch() -> None:
    assert parse_event_id("17") == (17, None)
    assert parse_event_id("17.ab12") == (17, "ab12")
    for bad in ("", "-1", "1.", "1.A", "1.a.b", "a", "1 .a"):
        with pytest.raises(ValueError, match="not an event id"):
            parse_event_id(bad)


async def test_client_raises_history_reset_for_a_position_of_another_generation(ctx) -> None:
    await _three(ctx, OTHER, end=True)
    async with FanoutClient(ctx.server.url("")) as client:
        with pytest.raises(HistoryResetError) as raised:
            async for _event in client.events(ctx.sid, token=token_for(ctx.sid), last_event_id="2.aaaa1111"):
                pass
    assert (raised.value.status, raised.value.problem["epoch"]) == (410, "bbbb2222")


async def test_client_result_starts_over_when_the_stream_is_written_again_while_followed(ctx) -> None:
    await _three(ctx)
    async with FanoutClient(ctx.server.url("")) as client:
        result = asyncio.create_task(client.result(ctx.sid, token=token_for(ctx.sid)))
        await eventually(lambda: ctx.server.app[HUB].reader_count(ctx.sid) == 1)
        again = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=OTHER)
        await ctx.redis.delete(ctx.keys.events(ctx.sid))
        await again.meta(last_seq=0)
        await again.append(start(ctx.sid), block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0, "second"),
                           delta(ctx.sid, 4, 0, " generation"), stop(ctx.sid, 5, 0), done(ctx.sid, 6), full=True)
        assembled = await asyncio.wait_for(result, 10)
    assert [block.text for block in assembled.blocks] == ["second generation"]  # never "x" + "generation"
    assert assembled.status == "completed"
