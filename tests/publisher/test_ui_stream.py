"""``GET /v1/streams/{id}/ui``: the HTTP answers, headers, projection and chunk mapping on a real server."""

from __future__ import annotations

import json
from typing import Any

from publisher.wire.ui_chunks import UNUSABLE_CALL, UIMessageTranslator
from schema.contract import BlockDelta, BlockRef, BlockStart, BlockStop, Delta, ToolInfo
from tests.publisher.conftest import Ctx
from tests.publisher.helpers import (
    API_KEY,
    StreamWriter,
    bearer,
    block_start,
    delta,
    done,
    error,
    now_ms,
    start,
    stop,
    text_stream,
    token_for,
)


def ui(ctx: Ctx, query: str = "") -> str:
    return ctx.server.url(f"/v1/streams/{ctx.sid}/ui{query}")


def chunks_of(body: str) -> list[Any]:
    messages = [m for m in body.split("\n\n") if m and not m.startswith(":")]
    assert all(m.startswith("data: ") for m in messages), messages
    return [m[6:] if m[6:] == "[DONE]" else json.loads(m[6:]) for m in messages]


def tool_events(sid: str, seq: int, arguments: str) -> list[Any]:
    block = BlockRef(id="b0", index=0, kind="tool_call")
    return [
        BlockStart(stream_id=sid, seq=seq, ts=now_ms(), block=block,
                   tool=ToolInfo(call_id="call_1", name="get_weather")),
        BlockDelta(stream_id=sid, seq=seq + 1, ts=now_ms(), block=block, delta=Delta(kind="json_text", text=arguments)),
        BlockStop(stream_id=sid, seq=seq + 2, ts=now_ms(), block=block),
    ]


async def test_ui_replays_a_finished_stream_with_the_sdk_headers_and_done(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(*text_stream(ctx.sid, 2))
    async with ctx.http.get(ui(ctx), headers=bearer(token_for(ctx.sid))) as response:
        assert response.status == 200
        assert response.headers["X-Vercel-AI-UI-Message-Stream"] == "v1"
        assert response.headers["Content-Type"].startswith("text/event-stream")
        chunks = chunks_of(await response.text())
    assert [c if c == "[DONE]" else c["type"] for c in chunks] == [
        "start", "start-step", "text-start", "text-delta", "text-end", "finish-step", "finish", "[DONE]"]
    assert chunks[3]["delta"] == "t0 t1 "  # the replay joins a block's deltas into one
    assert chunks[0]["messageId"] == ctx.sid
    assert chunks[-2]["finishReason"] == "stop"
    assert chunks[-2]["messageMetadata"]["fanout"]["status"] == "completed"


async def test_ui_resume_request_gets_204_once_the_stream_ended(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(*text_stream(ctx.sid, 1))
    async with ctx.http.get(ui(ctx, "?resume=1"), headers=bearer(API_KEY)) as response:
        assert response.status == 204
    await writer.expire(5)
    async with ctx.http.get(ui(ctx, "?resume=1"), headers=bearer(API_KEY)) as response:
        assert response.status == 204
    async with ctx.http.get(ui(ctx), headers=bearer(API_KEY)) as response:
        assert response.status == 410
        assert (await response.json())["type"].endswith("history-expired")


async def test_ui_unknown_stream_is_404_and_a_missing_token_is_401(ctx: Ctx) -> None:
    async with ctx.http.get(ui(ctx), headers=bearer(API_KEY)) as response:
        assert response.status == 404
    async with ctx.http.get(ui(ctx)) as response:
        assert response.status == 401


async def test_ui_serves_live_events_of_a_running_stream(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0))
    async with ctx.http.get(ui(ctx, f"?token={token_for(ctx.sid)}")) as response:
        assert response.status == 200
        first = await response.content.readuntil(b'"text-start","id":"b0"}\n\n')
        assert b'"start"' in first
        await writer.append(delta(ctx.sid, 3, 0, "live"), stop(ctx.sid, 4, 0), done(ctx.sid, 5))
        rest = chunks_of((await response.read()).decode())
    types = [c if c == "[DONE]" else c["type"] for c in rest]
    assert types == ["text-delta", "text-end", "finish-step", "finish", "[DONE]"]
    assert rest[0]["delta"] == "live"


async def test_ui_leaves_internal_reasoning_out_of_public_tokens(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    sid = ctx.sid
    await writer.append(start(sid), block_start(sid, 2, 0, "reasoning", "internal"),
                        delta(sid, 3, 0, "secret", "reasoning"), stop(sid, 4, 0, "reasoning"),
                        block_start(sid, 5, 1), delta(sid, 6, 1, "answer"), stop(sid, 7, 1), done(sid, 8))
    async with ctx.http.get(ui(ctx), headers=bearer(token_for(sid))) as response:
        public = await response.text()
    async with ctx.http.get(ui(ctx), headers=bearer(token_for(sid, "internal"))) as response:
        internal = await response.text()
    assert "secret" not in public
    assert "answer" in public
    assert "secret" in internal
    assert '"reasoning-start"' in internal


async def test_ui_failed_stream_ends_with_an_error_chunk_and_no_executable_tool_input(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    sid = ctx.sid
    await writer.append(start(sid), *tool_events(sid, 2, '{"city": "Oslo"}'), error(sid, 5))
    async with ctx.http.get(ui(ctx), headers=bearer(token_for(sid))) as response:
        chunks = chunks_of(await response.text())
    types = [c if c == "[DONE]" else c["type"] for c in chunks]
    assert "tool-input-available" not in types
    assert types[-5:] == ["tool-input-error", "error", "finish-step", "finish", "[DONE]"]
    assert chunks[-5]["errorText"] == UNUSABLE_CALL
    assert chunks[-4]["errorText"] == "failed: boom"
    assert chunks[-2]["finishReason"] == "error"


def test_a_completed_call_with_valid_arguments_becomes_tool_input_available() -> None:
    sid = "st_x"
    translator = UIMessageTranslator()
    events = [start(sid), *tool_events(sid, 2, '{"city": "Oslo"}'), done(sid, 5)]
    chunks = [c for e in events for c in translator.feed(e)]
    available = [c for c in chunks if c["type"] == "tool-input-available"]
    assert available == [{"type": "tool-input-available", "toolCallId": "call_1", "toolName": "get_weather",
                          "input": {"city": "Oslo"}}]


def test_a_completed_call_with_bad_arguments_is_a_tool_input_error() -> None:
    sid = "st_x"
    translator = UIMessageTranslator()
    events = [start(sid), *tool_events(sid, 2, '{"city": '), done(sid, 5)]
    chunks = [c for e in events for c in translator.feed(e)]
    assert [c["type"] for c in chunks if c["type"].startswith("tool-input-")] == [
        "tool-input-start", "tool-input-delta", "tool-input-error"]


def test_parallel_calls_sharing_an_id_get_unique_tool_call_ids_keeping_the_providers() -> None:
    sid = "st_x"
    second = [BlockStart(stream_id=sid, seq=5, ts=0, block=BlockRef(id="b1", index=1, kind="tool_call"),
                         tool=ToolInfo(call_id="call_1", name="get_weather")),
              BlockDelta(stream_id=sid, seq=6, ts=0, block=BlockRef(id="b1", index=1, kind="tool_call"),
                         delta=Delta(kind="json_text", text='{"city": "Nice"}')),
              BlockStop(stream_id=sid, seq=7, ts=0, block=BlockRef(id="b1", index=1, kind="tool_call"))]
    translator = UIMessageTranslator()
    events = [start(sid), *tool_events(sid, 2, '{"city": "Oslo"}'), *second, done(sid, 8)]
    chunks = [c for e in events for c in translator.feed(e)]
    starts = [c for c in chunks if c["type"] == "tool-input-start"]
    assert [c["toolCallId"] for c in starts] == ["call_1", "call_1~1"]
    assert "providerMetadata" not in starts[0]
    assert starts[1]["providerMetadata"] == {"fanout": {"call_id": "call_1"}}
    assert {c["inputEncoding"] for c in starts} == {"json"}
    available = [c for c in chunks if c["type"] == "tool-input-available"]
    assert [(c["toolCallId"], c["input"]) for c in available] == [("call_1", {"city": "Oslo"}),
                                                                   ("call_1~1", {"city": "Nice"})]
    assert available[1]["providerMetadata"] == {"fanout": {"call_id": "call_1"}}
    deltas = [c["toolCallId"] for c in chunks if c["type"] == "tool-input-delta"]
    assert deltas == ["call_1", "call_1~1"]


def test_a_cancelled_stream_ends_with_an_abort_chunk_not_an_error() -> None:
    sid = "st_x"
    translator = UIMessageTranslator()
    chunks = [c for e in [start(sid), *tool_events(sid, 2, "{}"), error(sid, 5, "cancelled")]
              for c in translator.feed(e)]
    assert [c["type"] for c in chunks[-4:]] == ["tool-input-error", "abort", "finish-step", "finish"]
    assert chunks[-3]["reason"] == "cancelled: boom"
    assert "finishReason" not in chunks[-1]
    assert chunks[-1]["messageMetadata"]["fanout"]["status"] == "cancelled"


def test_a_redacted_reasoning_start_says_so_and_a_calls_signature_rides_on_its_outcome() -> None:
    sid = "st_x"
    reasoning = BlockRef(id="b0", index=0, kind="reasoning")
    call = BlockRef(id="b1", index=1, kind="tool_call")
    events = [start(sid), BlockStart(stream_id=sid, seq=2, ts=0, block=reasoning, visibility="public", redacted=True),
              BlockStop(stream_id=sid, seq=3, ts=0, block=reasoning),
              BlockStart(stream_id=sid, seq=4, ts=0, block=call, tool=ToolInfo(call_id="c", name="f")),
              BlockDelta(stream_id=sid, seq=5, ts=0, block=call, delta=Delta(kind="signature", text="sig")),
              BlockStop(stream_id=sid, seq=6, ts=0, block=call), done(sid, 7)]
    translator = UIMessageTranslator()
    chunks = [c for e in events for c in translator.feed(e)]
    assert chunks[2] == {"type": "reasoning-start", "id": "b0", "providerMetadata": {"fanout": {"redacted": True}}}
    outcome = next(c for c in chunks if c["type"] == "tool-input-available")
    assert outcome["providerMetadata"] == {"fanout": {"signature": "sig"}}
