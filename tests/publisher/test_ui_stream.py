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
