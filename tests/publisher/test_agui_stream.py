"""``GET /v1/streams/{id}/agui``: the HTTP answers, ids, exact resume and visibility on a real server and Redis."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tests.publisher.conftest import Ctx
from tests.publisher.helpers import (
    API_KEY,
    StreamWriter,
    bearer,
    block_start,
    delta,
    done,
    make_settings,
    start,
    stop,
    text_stream,
    token_for,
)


def agui(ctx: Ctx, query: str = "") -> str:
    return ctx.server.url(f"/v1/streams/{ctx.sid}/agui{query}")


def messages_of(body: str) -> list[tuple[str | None, dict[str, Any]]]:
    """(id or None, event) per SSE message; comments (pings) left out."""
    out = []
    for message in body.split("\n\n"):
        lines = [line for line in message.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        fields = dict(line.split(": ", 1) for line in lines)
        assert set(fields) <= {"id", "data"}, lines
        out.append((fields.get("id"), json.loads(fields["data"])))
    return out


async def test_agui_serves_a_finished_stream_as_one_run_with_ids_on_each_events_last_message(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=b"ep1")
    await writer.meta()
    await writer.append(*text_stream(ctx.sid, 2))
    async with ctx.http.get(agui(ctx), headers=bearer(token_for(ctx.sid))) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["Cache-Control"] == "no-cache, no-transform"
        got = messages_of(await response.text())
    assert [event["type"] for _, event in got] == [
        "RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "RUN_FINISHED"]
    assert [event_id for event_id, _ in got] == ["1.ep1", "2.ep1", "3.ep1", "4.ep1", "5.ep1", "6.ep1"]
    assert got[0][1]["runId"] == ctx.sid
    assert got[-1][1]["metadata"]["fanout"]["status"] == "completed"


async def test_agui_resume_sends_nothing_twice_and_reopens_the_open_message(ctx: Ctx) -> None:
    sid = ctx.sid
    writer = StreamWriter(ctx.redis, ctx.keys, sid, epoch=b"ep1")
    await writer.meta()
    await writer.append(start(sid), block_start(sid, 2, 0), delta(sid, 3, 0, "Hel"), delta(sid, 4, 0, "lo"))
    headers = {**bearer(token_for(sid)), "Last-Event-ID": "3.ep1"}
    async with ctx.http.get(agui(ctx), headers=headers) as response:
        assert response.status == 200
        reader = asyncio.ensure_future(response.text())
        await writer.append(stop(sid, 5, 0), done(sid, 6))
        got = messages_of(await reader)
    assert [(event_id, event["type"]) for event_id, event in got] == [
        (None, "RUN_STARTED"), ("3.ep1", "TEXT_MESSAGE_START"), ("4.ep1", "TEXT_MESSAGE_CONTENT"),
        ("5.ep1", "TEXT_MESSAGE_END"), ("6.ep1", "RUN_FINISHED")]
    assert got[1][1]["messageId"] == f"{sid}:0"
    assert got[2][1]["delta"] == "lo"


async def test_agui_resume_by_query_parameter_and_204_when_the_terminal_is_held(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=b"ep1")
    await writer.meta()
    await writer.append(*text_stream(ctx.sid, 1))
    token = token_for(ctx.sid)
    async with ctx.http.get(agui(ctx, f"?last_event_id=4.ep1&token={token}")) as response:
        got = messages_of(await response.text())
    assert [event["type"] for _, event in got] == ["RUN_STARTED", "RUN_FINISHED"]
    async with ctx.http.get(agui(ctx), headers={**bearer(token), "Last-Event-ID": "5.ep1"}) as response:
        assert response.status == 204


async def test_agui_answers_positions_as_events_does(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=b"ep1")
    await writer.meta()
    await writer.append(*text_stream(ctx.sid, 1))
    token = token_for(ctx.sid)
    for position, status, slug in (("3.other", 410, "history-reset"), ("9", 410, "position-ahead"),
                                   ("x", 400, "invalid-position")):
        async with ctx.http.get(agui(ctx), headers={**bearer(token), "Last-Event-ID": position}) as response:
            assert response.status == status, position
            assert (await response.json())["type"].endswith(slug)


async def test_agui_unknown_stream_is_404_and_a_missing_token_is_401(ctx: Ctx) -> None:
    async with ctx.http.get(agui(ctx), headers=bearer(API_KEY)) as response:
        assert response.status == 404
    async with ctx.http.get(agui(ctx)) as response:
        assert response.status == 401


async def test_agui_leaves_internal_reasoning_out_of_public_tokens(ctx: Ctx) -> None:
    sid = ctx.sid
    writer = StreamWriter(ctx.redis, ctx.keys, sid)
    await writer.meta()
    await writer.append(start(sid), block_start(sid, 2, 0, "reasoning", "internal"),
                        delta(sid, 3, 0, "secret", "reasoning"), stop(sid, 4, 0, "reasoning"),
                        block_start(sid, 5, 1), delta(sid, 6, 1, "answer"), stop(sid, 7, 1), done(sid, 8))
    async with ctx.http.get(agui(ctx), headers=bearer(token_for(sid))) as response:
        public = messages_of(await response.text())
    async with ctx.http.get(agui(ctx), headers=bearer(token_for(sid, "internal"))) as response:
        internal = messages_of(await response.text())
    assert "REASONING_MESSAGE_START" not in [event["type"] for _, event in public]
    assert [event["delta"] for _, event in public if event["type"] == "TEXT_MESSAGE_CONTENT"] == ["answer"]
    contents = [event["delta"] for _, event in internal if event["type"] == "REASONING_MESSAGE_CONTENT"]
    assert contents == ["secret"]


async def test_agui_history_reset_mid_response_ends_with_a_run_error(ctx: Ctx) -> None:
    sid = ctx.sid
    writer = StreamWriter(ctx.redis, ctx.keys, sid, epoch=b"ep1")
    await writer.meta()
    await writer.append(start(sid), block_start(sid, 2, 0), delta(sid, 3, 0, "Hel"))
    async with ctx.http.get(agui(ctx), headers=bearer(token_for(sid))) as response:
        seen = b""
        while b"TEXT_MESSAGE_CONTENT" not in seen:  # the history is sent: the response is live
            seen += await response.content.readline()
        again = StreamWriter(ctx.redis, ctx.keys, sid, epoch=b"ep2")
        await again.notify(1, [b"{}"])
        got = messages_of((seen + await response.content.read()).decode())
    assert got[-1][0] is None
    assert got[-1][1]["type"] == "RUN_ERROR"
    assert got[-1][1]["code"] == "history_reset"


async def test_agui_counts_in_the_credentials_share_and_answers_429_one_past_it(ctx: Ctx) -> None:
    server = await ctx.start_app(make_settings(max_connections_per_token=1, share_retry_after_s=4))
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    url, token = server.url(f"/v1/streams/{ctx.sid}/agui"), token_for(ctx.sid)
    held = await ctx.http.get(url, headers=bearer(token))
    assert held.status == 200
    assert await held.content.readline() == b"id: 1\n"  # the response is open: its place is held
    async with ctx.http.get(url, headers=bearer(token)) as response:
        assert response.status == 429
        assert response.headers["Retry-After"] == "4"
        assert (await response.json())["type"].endswith("too-many-requests")
    held.close()


def counted(reader: InMemoryMetricReader, name: str, **attributes: str) -> float:
    data = reader.get_metrics_data()
    return sum(point.value for resource in (data.resource_metrics if data else [])
               for scope in resource.scope_metrics for metric in scope.metrics if metric.name == name
               for point in metric.data.data_points
               if all(point.attributes.get(k) == v for k, v in attributes.items()))


async def test_agui_counts_resumes_204s_and_410s_as_events_does(ctx: Ctx) -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    try:
        server = await ctx.start_app(meter_provider=meters)
        writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
        await writer.meta()
        await writer.append(*text_stream(ctx.sid, 1))
        url = server.url(f"/v1/streams/{ctx.sid}/agui")
        for position, status in (("2", 200), ("5", 204), ("9", 410)):
            async with ctx.http.get(url, headers={**bearer(API_KEY), "Last-Event-ID": position}) as response:
                assert response.status == status
                await response.read()
        assert counted(reader, "fanout.sse.resumes") == 3
        assert counted(reader, "fanout.sse.no_content") == 1
        assert counted(reader, "fanout.sse.gone", cause="position-ahead") == 1
    finally:
        meters.shutdown()


async def test_agui_answers_503_with_retry_after_past_the_publishers_connections(ctx: Ctx) -> None:
    server = await ctx.start_app(make_settings(max_connections=1, busy_retry_after_s=3))
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    url = server.url(f"/v1/streams/{ctx.sid}/agui")
    held = await ctx.http.get(url, headers=bearer(token_for(ctx.sid)))
    assert await held.content.readline() == b"id: 1\n"  # the one connection is open
    async with ctx.http.get(url, headers=bearer(API_KEY)) as response:
        assert response.status == 503
        assert response.headers["Retry-After"] == "3"
        assert (await response.json())["type"].endswith("too-many-connections")
    held.close()
