"""The status route, /ui and fanout export answer the same for the JSON, the compact and the compacted form."""

from __future__ import annotations

import json

import pytest

from schema.contract import encode_event
from tests.publisher.helpers import API_KEY, StreamWriter, bearer, text_stream
from tests.tools.test_export import ListSink, usage_done
from tools.export import Exporter
from worker.appender import summary_fields
from worker.compactor import Compactor

pytestmark = pytest.mark.topologies

FORMS = ("json", "compact", "compacted")


async def _store(ctx, form: str, events) -> None:
    await ctx.redis.delete(ctx.keys.events(ctx.sid), ctx.keys.meta(ctx.sid))
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=b"e5", compact=form != "json")
    await writer.meta(created_ms=1_000)
    await writer.append(*events, notify=False)
    if form == "compacted":
        assert await Compactor(ctx.redis, ctx.keys, run_deltas=8).compact(ctx.sid) == "ok"


async def _get(ctx, path: str) -> tuple[int, bytes]:
    async with ctx.http.get(ctx.server.url(path), headers=bearer(API_KEY)) as resp:
        return resp.status, await resp.read()


async def test_status_and_ui_answer_the_same_in_every_stored_form(ctx) -> None:
    events = text_stream(ctx.sid, 30)
    answers = {}
    for form in FORMS:
        await _store(ctx, form, events)
        answers[form] = [await _get(ctx, f"/v1/streams/{ctx.sid}"), await _get(ctx, f"/v1/streams/{ctx.sid}/ui")]
    assert answers["compact"] == answers["json"]
    assert answers["compacted"] == answers["json"]
    status, body = answers["json"][0]
    assert status == 200
    assert json.loads(body)["result"]["blocks"][0]["text"] == "".join(f"t{i} " for i in range(30))


async def test_export_writes_the_same_event_rows_in_every_stored_form(ctx) -> None:
    events = text_stream(ctx.sid, 30)
    events[-1] = usage_done(events[-1], 30)
    fields = summary_fields(events[-1], provider="openai_chat", model="m", started_ms=0, first_delta_ms=0)  # type: ignore[arg-type]
    rows = {}
    for form in FORMS:
        await ctx.redis.delete(ctx.keys.done)
        await ctx.redis.xadd(ctx.keys.done, dict(zip(fields[::2], fields[1::2], strict=True)))
        await _store(ctx, form, events)
        sink = ListSink()
        await Exporter(ctx.redis, ctx.keys, sink, group=f"export-{form}").run()
        rows[form] = [(r["seq"], bytes(r["event"])) for r in sink.committed if r["kind"] == "event"]
    assert rows["json"] == [(e.seq, encode_event(e)) for e in events]
    assert rows["compact"] == rows["json"]
    assert rows["compacted"] == rows["json"]
