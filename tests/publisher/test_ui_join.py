"""``/ui``'s replay joins each block's deltas (``DeltaJoiner``): the same message, one delta per block run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from publisher.wire.ui_chunks import Chunk, UIMessageTranslator
from publisher.wire.ui_join import DeltaJoiner
from schema.contract import Event, decode_event
from tests.publisher.conftest import Ctx
from tests.publisher.helpers import (
    StreamWriter,
    bearer,
    block_start,
    delta,
    make_settings,
    start,
    text_stream,
    token_for,
)

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = sorted((ROOT / "transcripts").glob("*/*.events.jsonl"))
DELTAS = ("text-delta", "reasoning-delta", "tool-input-delta")


def golden(path: Path) -> list[Event]:
    events = [decode_event(line) for line in path.read_text(encoding="utf-8").split("\n") if line]
    return [event for event in events if event is not None]


def chunks_of(events: list[Event], *, join: bool) -> list[Chunk]:
    translator, joiner, out = UIMessageTranslator(), DeltaJoiner(1 << 20), []
    for event in events:
        chunks = translator.feed(event)
        out += joiner.feed(chunks) if join else chunks
    return out + (joiner.flush() if join else [])


def message_of(chunks: list[Chunk]) -> list[Any]:
    """What a UI message reader builds: every non-delta chunk in order, and each block's text."""
    texts: dict[str, str] = {}
    others = []
    for chunk in chunks:
        if chunk["type"] in DELTAS:
            key = chunk.get("id") or chunk["toolCallId"]
            texts[key] = texts.get(key, "") + (chunk.get("delta") or chunk.get("inputTextDelta") or "")
        else:
            others.append(chunk)
    return [others, texts]


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_joined_chunks_build_the_same_message_with_one_delta_per_block_run(path: Path) -> None:
    events = golden(path)
    joined, plain = chunks_of(events, join=True), chunks_of(events, join=False)
    assert message_of(joined) == message_of(plain)
    run: list[tuple[str, str]] = []
    for chunk in joined:  # between two other chunks, at most one delta per block
        if chunk["type"] in DELTAS:
            key = (chunk["type"], chunk.get("id") or chunk["toolCallId"])
            assert key not in run, chunk
            run.append(key)
        else:
            run = []


def test_interleaved_blocks_keep_their_own_text() -> None:
    joiner = DeltaJoiner(1 << 20)
    fed = [{"type": "tool-input-delta", "toolCallId": "a", "inputTextDelta": '{"x"'},
           {"type": "tool-input-delta", "toolCallId": "b", "inputTextDelta": '{"y"'},
           {"type": "tool-input-delta", "toolCallId": "a", "inputTextDelta": ":1}"}]
    assert joiner.feed(fed) == []
    assert joiner.feed([{"type": "finish-step"}]) == [
        {"type": "tool-input-delta", "toolCallId": "a", "inputTextDelta": '{"x":1}'},
        {"type": "tool-input-delta", "toolCallId": "b", "inputTextDelta": '{"y"'},
        {"type": "finish-step"}]


def test_held_text_is_released_once_it_passes_the_limit() -> None:
    joiner = DeltaJoiner(10)
    chunk = {"type": "text-delta", "id": "b0"}
    assert joiner.feed([{**chunk, "delta": "12345"}, {**chunk, "delta": "67890"}]) == []  # 10: at the limit
    assert joiner.feed([{**chunk, "delta": "X"}]) == [{**chunk, "delta": "1234567890X"}]  # 11: past it
    assert joiner.feed([{**chunk, "delta": "a"}, {"type": "text-end", "id": "b0"}]) == [
        {**chunk, "delta": "a"}, {"type": "text-end", "id": "b0"}]


async def test_a_long_ui_replay_arrives_in_deltas_of_about_the_limit(ctx: Ctx) -> None:
    server = await ctx.start_app(make_settings(ui_join_max_chars=100))
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(*text_stream(ctx.sid, 200))  # 200 deltas of 3 to 5 characters
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/ui"), headers=bearer(token_for(ctx.sid))) as resp:
        body = await resp.text()
    deltas = [json.loads(line[6:])["delta"] for line in body.split("\n\n") if '"text-delta"' in line]
    assert "".join(deltas) == "".join(f"t{i} " for i in range(200))
    assert all(101 <= len(text) <= 105 for text in deltas[:-1])  # released once past 100
    assert 1 <= len(deltas[-1]) <= 105


async def test_a_resumed_ui_request_of_a_running_stream_gets_each_blocks_text_in_one_delta(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0), *(delta(ctx.sid, 3 + i, 0, f"w{i} ")
                                                                       for i in range(100)))
    url = ctx.server.url(f"/v1/streams/{ctx.sid}/ui?resume=1")
    async with ctx.http.get(url, headers=bearer(token_for(ctx.sid))) as resp:
        assert resp.status == 200
        assert resp.headers["Cache-Control"] == "no-store, no-transform"
        seen = b""
        while b"text-delta" not in seen:
            seen += await resp.content.readany()
        await writer.append(delta(ctx.sid, 103, 0, "live"))
        while b'"live"' not in seen:
            seen += await resp.content.readany()
    deltas = [line for line in seen.decode().split("\n\n") if '"text-delta"' in line]
    assert len(deltas) == 2
    assert "".join(f"w{i} " for i in range(100)) in deltas[0]
    assert '"delta":"live"' in deltas[1]
