"""``/agui?snapshot=1`` on a real server and Redis: the snapshot, its id, what follows it, visibility."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from schema.contract import Event
from tests.publisher.agui_support import Applied, expected_view
from tests.publisher.conftest import Ctx
from tests.publisher.helpers import StreamWriter, bearer, block_start, delta, done, start, stop, text_stream, token_for
from tests.publisher.node_support import GOLDENS, golden_events
from tests.publisher.test_agui_stream import messages_of


def agui(ctx: Ctx, sid: str, query: str = "?snapshot=1") -> str:
    return ctx.server.url(f"/v1/streams/{sid}/agui{query}")


async def read_split(ctx: Ctx, events: list[Event], k: int) -> list[tuple[str | None, dict[str, Any]]]:
    """Store ``events[:k]``, read ``?snapshot=1``; once the snapshot arrived, store the rest; return every message."""
    sid = events[0].stream_id
    writer = StreamWriter(ctx.redis, ctx.keys, sid, epoch=b"ep")
    await writer.meta()
    await writer.append(*events[:k], notify=False)
    async with ctx.http.get(agui(ctx, sid), headers=bearer(token_for(sid))) as response:
        assert response.status == 200
        seen = b""
        while b'"MESSAGES_SNAPSHOT"' not in seen:
            line = await response.content.readline()
            assert line, seen
            seen += line
        await writer.append(*events[k:])
        return messages_of((seen + await response.content.read()).decode())


@pytest.mark.parametrize("path", GOLDENS, ids=lambda path: f"{path.parent.name}/{path.name.split('.')[0]}")
async def test_a_snapshot_read_of_every_golden_at_a_few_splits_assembles_what_the_full_replay_does(
    ctx: Ctx, path: Any,
) -> None:
    n = len(golden_events(path, "st_x"))
    for k in sorted({1, n // 2 or 1, max(1, n - 1), n}):
        events = golden_events(path, f"st_{uuid.uuid4().hex}")
        got = await read_split(ctx, events, k)
        kinds = [event["type"] for _, event in got]
        assert kinds[:2] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"]
        assert kinds.count("MESSAGES_SNAPSHOT") == 1
        ids = [event_id for event_id, _ in got if event_id]
        if k < n:
            assert got[1][0] == f"{k}.ep", "the snapshot carries the id of the seq it reflects"
        else:
            assert got[1][0] is None, "a finished stream's id rides on its terminal"
            assert got[-1][0] == f"{n}.ep"
        assert ids[-1] == f"{n}.ep"
        expected = expected_view(events)
        ended = expected["ended"] if k < n else []
        assert Applied().apply([event for _, event in got]).view() == {**expected, "ended": ended}, f"split {k}/{n}"


async def test_a_mid_stream_snapshot_continues_the_open_message_and_resumes_from_its_id(ctx: Ctx) -> None:
    sid = ctx.sid
    writer = StreamWriter(ctx.redis, ctx.keys, sid, epoch=b"ep1")
    await writer.meta()
    await writer.append(start(sid), block_start(sid, 2, 0), delta(sid, 3, 0, "Hel"), delta(sid, 4, 0, "lo"))
    token = token_for(sid)
    async with ctx.http.get(agui(ctx, sid), headers=bearer(token)) as response:
        seen = b""
        while b"TEXT_MESSAGE_START" not in seen:  # the snapshot and the reopened message are sent
            seen += await response.content.readline()
        await writer.append(delta(sid, 5, 0, "!"), stop(sid, 6, 0), done(sid, 7))
        got = messages_of((seen + await response.content.read()).decode())
    assert [(event_id, event["type"]) for event_id, event in got] == [
        (None, "RUN_STARTED"), ("4.ep1", "MESSAGES_SNAPSHOT"), (None, "TEXT_MESSAGE_START"),
        ("5.ep1", "TEXT_MESSAGE_CONTENT"), ("6.ep1", "TEXT_MESSAGE_END"), ("7.ep1", "RUN_FINISHED")]
    assert got[1][1]["messages"] == [{"id": f"{sid}:0", "role": "assistant", "content": "Hello"}]
    assert Applied().apply([event for _, event in got]).view()["messages"][0]["content"] == "Hello!"
    async with ctx.http.get(agui(ctx, sid), headers={**bearer(token), "Last-Event-ID": "4.ep1"}) as response:
        resumed = messages_of(await response.text())
    assert [event["type"] for _, event in resumed][:2] == ["RUN_STARTED", "TEXT_MESSAGE_START"]
    assert "MESSAGES_SNAPSHOT" not in [event["type"] for _, event in resumed], "a position wins over snapshot=1"


async def test_a_public_snapshot_has_no_internal_reasoning_and_an_internal_one_has_it(ctx: Ctx) -> None:
    sid = ctx.sid
    writer = StreamWriter(ctx.redis, ctx.keys, sid)
    await writer.meta()
    await writer.append(start(sid), block_start(sid, 2, 0, "reasoning", "internal"),
                        delta(sid, 3, 0, "secret", "reasoning"), stop(sid, 4, 0, "reasoning"),
                        block_start(sid, 5, 1), delta(sid, 6, 1, "answer"), stop(sid, 7, 1), done(sid, 8))
    snapshots = {}
    for scope in ("public", "internal"):
        async with ctx.http.get(agui(ctx, sid), headers=bearer(token_for(sid, scope))) as response:
            got = messages_of(await response.text())
        snapshots[scope] = next(event for _, event in got if event["type"] == "MESSAGES_SNAPSHOT")["messages"]
    assert [m["content"] for m in snapshots["public"]] == ["answer"]
    assert "secret" not in str(snapshots["public"])
    internal = [(m["role"], m["content"]) for m in snapshots["internal"]]
    assert internal == [("reasoning", "secret"), ("assistant", "answer")]


async def test_snapshot_values_as_on_events(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=b"ep1")
    await writer.meta()
    await writer.append(*text_stream(ctx.sid, 1))
    token = token_for(ctx.sid)
    async with ctx.http.get(agui(ctx, ctx.sid, "?snapshot=2"), headers=bearer(token)) as response:
        assert response.status == 400
        assert (await response.json())["type"].endswith("invalid-field")
    async with ctx.http.get(agui(ctx, ctx.sid, "?snapshot=0"), headers=bearer(token)) as response:
        plain = [event["type"] for _, event in messages_of(await response.text())]
    assert "MESSAGES_SNAPSHOT" not in plain
    assert plain[1] == "TEXT_MESSAGE_START"
