"""OpenTelemetry: a server span per request (no token), and the fan-out metrics."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from aiohttp import web
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from publisher.app import RUNNER_KWARGS, create_app
from publisher.state import GATE, HUB
from publisher.telemetry import providers_from_env
from schema.job import job_decoder
from schema.keys import JOB_FIELD
from tests.publisher.helpers import (
    API_KEY,
    SSEClient,
    StreamWriter,
    bearer,
    block_start,
    delta,
    eventually,
    make_settings,
    start,
    text_stream,
    token_for,
)
from tools.demo.stack import free_port


@pytest.fixture
def otel():
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield exporter, reader, {"tracer_provider": tracer_provider, "meter_provider": meter_provider}
    tracer_provider.shutdown()
    meter_provider.shutdown()


def points(reader: InMemoryMetricReader, name: str) -> list:
    data = reader.get_metrics_data()
    if data is None:
        return []
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def total(reader: InMemoryMetricReader, name: str, **attributes: str) -> float:
    return sum(
        getattr(p, "value", None) if hasattr(p, "value") else p.count
        for p in points(reader, name)
        if all(p.attributes.get(k) == v for k, v in attributes.items())
    )


async def test_server_span_per_request_without_query_or_token(ctx, otel):
    exporter, _, providers = otel
    server = await ctx.start_app(**providers)
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*text_stream(ctx.sid, 1))
    token = token_for(ctx.sid)
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events?token={token}")) as resp:
        await SSEClient(resp).events()
    async with ctx.http.post(server.url("/v1/streams"), json={}, headers=bearer(API_KEY)) as resp:
        assert resp.status == 400
    async with ctx.http.get(server.url("/nowhere")) as resp:
        assert resp.status == 404
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["GET /v1/streams/{stream_id}/events", "POST /v1/streams", "GET"]
    assert all(s.kind == SpanKind.SERVER for s in spans)
    events_span = spans[0]
    assert events_span.attributes["http.route"] == "/v1/streams/{stream_id}/events"
    assert events_span.attributes["http.response.status_code"] == 200
    assert events_span.attributes["url.path"] == f"/v1/streams/{ctx.sid}/events"
    assert spans[1].attributes["http.response.status_code"] == 400
    for span in spans:
        assert all(token not in str(value) for value in span.attributes.values())
        assert "url.query" not in span.attributes


def _awaiting(coro) -> list[str]:
    """Qualified names of the coroutine frames a task is suspended in, outermost first."""
    names = []
    while coro is not None and hasattr(coro, "cr_code"):
        names.append(f"{Path(coro.cr_code.co_filename).name}:{coro.cr_code.co_qualname}")
        coro = coro.cr_await
    return names


async def test_idle_live_reader_holds_no_span_no_handler_frames_and_no_task_of_ours(ctx, otel):
    exporter, _, providers = otel
    server = await ctx.start_app(**providers)
    hub, gate = server.app[HUB], server.app[GATE]
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    publisher_dir = str(Path(create_app.__code__.co_filename).parent)

    def ours() -> set[asyncio.Task]:
        return {t for t in asyncio.all_tasks()
                if publisher_dir in getattr(getattr(t.get_coro(), "cr_code", None), "co_filename", "")}

    url = server.url(f"/v1/streams/{ctx.sid}/events")
    responses = []
    try:
        for count in (1, 2):
            responses.append(resp := await ctx.http.get(url, headers=bearer(API_KEY)))
            assert (await SSEClient(resp).next_event())["id"] == "1"
            await eventually(lambda count=count: hub.reader_count(ctx.sid) == count)
            if count == 1:
                tasks_of_one = ours()  # the hub's own, shared by every reader
        assert ours() == tasks_of_one
        spans = [s for s in exporter.get_finished_spans() if s.name == "GET /v1/streams/{stream_id}/events"]
        assert len(spans) == 2  # ended at the headers, both readers still open
        for span in spans:
            assert span.attributes["http.response.status_code"] == 200
            assert span.attributes["fanout.sse.stream"] is True
        chains = [c for c in (_awaiting(t.get_coro()) for t in asyncio.all_tasks())
                  if any("EventStream.write_eof" in name for name in c)]
        assert len(chains) == 2
        for chain in chains:
            assert not [n for n in chain if "middleware.py" in n or "stream_events" in n or "_answer" in n]
        assert gate.open == 2
    finally:
        for resp in responses:
            resp.close()
    await eventually(lambda: hub.reader_count(ctx.sid) == 0 and gate.open == 0)


async def test_metrics_connections_deliveries_latency_and_resumes(ctx, otel):
    _, reader, providers = otel
    server = await ctx.start_app(**providers)
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0))
    headers = {**bearer(API_KEY), "Last-Event-ID": "1"}
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=headers) as resp:
        client = SSEClient(resp)
        assert (await client.next_event())["id"] == "2"
        assert total(reader, "fanout.sse.readers") == 1
        await writer.append(delta(ctx.sid, 3, 0))
        assert (await client.next_event())["id"] == "3"
    await eventually(lambda: total(reader, "fanout.sse.readers") == 0)
    assert total(reader, "fanout.sse.resumes") == 1
    assert total(reader, "fanout.sse.events.delivered", phase="replay") == 1
    assert total(reader, "fanout.sse.events.delivered", phase="live") == 1
    latency = points(reader, "fanout.delivery.latency")
    assert sum(p.count for p in latency) == 2
    assert all(p.min >= 0 for p in latency)


async def test_metrics_204_and_410_by_cause(ctx, otel):
    _, reader, providers = otel
    server = await ctx.start_app(**providers)
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(*text_stream(ctx.sid, 1))
    url = server.url(f"/v1/streams/{ctx.sid}/events")
    for position in ("5", "9"):
        async with ctx.http.get(url, headers={**bearer(API_KEY), "Last-Event-ID": position}) as resp:
            assert resp.status in (204, 410)
    await writer.expire(5)
    async with ctx.http.get(url, headers={**bearer(API_KEY), "Last-Event-ID": "2"}) as resp:
        assert resp.status == 410
    assert total(reader, "fanout.sse.no_content") == 1
    assert total(reader, "fanout.sse.gone", cause="position-ahead") == 1
    assert total(reader, "fanout.sse.gone", cause="history-expired") == 1


async def test_metric_queue_overflow(ctx, otel):
    _, reader, providers = otel
    server = await ctx.start_app(make_settings(client_queue=1), **providers)
    hub = server.app[HUB]
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid))
    host, port = server.base_url.removeprefix("http://").split(":")
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect((host, int(port)))
    stalled.sendall(f"GET /v1/streams/{ctx.sid}/events HTTP/1.1\r\nHost: x\r\n"
                    f"Authorization: Bearer {API_KEY}\r\n\r\n".encode())
    try:
        await eventually(lambda: hub.reader_count(ctx.sid) == 1)
        seq = 1
        while hub.reader_count(ctx.sid) == 1 and seq < 6000:  # a client that reads nothing falls behind
            seq += 1
            await writer.append(delta(ctx.sid, seq, 0, "z" * 4000))
        await eventually(lambda: total(reader, "fanout.sse.overflows") == 1)
    finally:
        stalled.close()


def test_nothing_is_exported_by_default():
    for environ in ({}, {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}):
        providers = providers_from_env(environ)
        assert (providers.tracer_provider, providers.meter_provider, providers.logger_provider) == (None, None, None)
    providers = providers_from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert isinstance(providers.tracer_provider, TracerProvider)
    assert providers.meter_provider is None
    assert providers.tracer_provider.resource.attributes["service.name"] == "fanout-publisher"
    providers.shutdown()


async def test_metric_refused_connections_by_reason(ctx, otel):
    _, reader, providers = otel
    server = await ctx.start_app(make_settings(max_connections=1), **providers)
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    url = server.url(f"/v1/streams/{ctx.sid}/events")
    async with ctx.http.get(url, headers=bearer(API_KEY)) as first:
        assert (await SSEClient(first).next_event())["id"] == "1"
        async with ctx.http.get(url, headers=bearer(API_KEY)) as second:
            assert second.status == 200  # an SSE request turned away gets a retry: hint, not a status EventSource drops
            assert (await second.text()).startswith("retry: ")
    assert total(reader, "fanout.sse.refused", reason="too-many-connections") == 1
    assert total(reader, "fanout.sse.refused", reason="shutting-down") == 0


async def test_submit_puts_trace_context_in_job_and_meta_and_sse_span_links_to_it(ctx, otel):
    exporter, _, providers = otel
    server = await ctx.start_app(**providers)
    body = {"provider": "anthropic", "model": "m", "request": {"messages": []}}
    async with ctx.http.post(server.url("/v1/streams"), json=body, headers=bearer(API_KEY)) as resp:
        assert resp.status == 201
        stream_id = (await resp.json())["stream_id"]
    (submit_span,) = [s for s in exporter.get_finished_spans() if s.name == "POST /v1/streams"]
    ids_of_submit = [f"{submit_span.context.trace_id:032x}", f"{submit_span.context.span_id:016x}"]
    ((_, fields),) = await ctx.redis.xrange(ctx.keys.jobs_shard(0))
    job = job_decoder.decode(fields[JOB_FIELD])
    assert job.trace_context["traceparent"].split("-")[1:3] == ids_of_submit
    meta_traceparent = (await ctx.redis.hget(ctx.keys.meta(stream_id), "traceparent")).decode()
    assert meta_traceparent == job.trace_context["traceparent"]
    await StreamWriter(ctx.redis, ctx.keys, stream_id).append(*text_stream(stream_id, 1))
    async with ctx.http.get(server.url(f"/v1/streams/{stream_id}/events"), headers=bearer(API_KEY)) as resp:
        await SSEClient(resp).events()
    (sse_span,) = [s for s in exporter.get_finished_spans() if s.name == "GET /v1/streams/{stream_id}/events"]
    assert [link.context.span_id for link in sse_span.links] == [submit_span.context.span_id]
    assert sse_span.links[0].context.trace_id == submit_span.context.trace_id
    assert sse_span.context.trace_id != submit_span.context.trace_id


async def test_metric_redis_errors_by_kind_when_redis_is_down(ctx, otel):
    _, reader, providers = otel
    port = free_port()  # nothing listens there: every command fails to connect
    app = create_app(make_settings(), keys=ctx.keys, redis_url=f"redis://127.0.0.1:{port}/0", **providers)
    runner = web.AppRunner(app, **RUNNER_KWARGS)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, bound = runner.addresses[0][:2]
        url = f"http://{host}:{bound}/v1/streams/{ctx.sid}"  # the status route: a problem document, not SSE
        async with ctx.http.get(url, headers=bearer(API_KEY)) as resp:
            assert resp.status == 503
            assert (await resp.json())["type"].endswith("redis-unavailable")
    finally:
        await runner.cleanup()
    assert total(reader, "fanout.redis.errors", kind="connection") == 1
    assert total(reader, "fanout.redis.errors", kind="timeout") == 0
