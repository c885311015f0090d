"""OpenTelemetry: a server span per request (no token), and the fan-out metrics."""

from __future__ import annotations

import socket

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from publisher.state import HUB
from publisher.telemetry import providers_from_env
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


async def test_metrics_connections_deliveries_latency_and_resumes(ctx, otel):
    _, reader, providers = otel
    server = await ctx.start_app(**providers)
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.append(start(ctx.sid), block_start(ctx.sid, 2, 0))
    headers = {**bearer(API_KEY), "Last-Event-ID": "1"}
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=headers) as resp:
        client = SSEClient(resp)
        assert (await client.next_event())["id"] == "2"
        assert total(reader, "fanout.publisher.connections.open") == 1
        await writer.append(delta(ctx.sid, 3, 0))
        assert (await client.next_event())["id"] == "3"
    await eventually(lambda: total(reader, "fanout.publisher.connections.open") == 0)
    assert total(reader, "fanout.publisher.resumes") == 1
    assert total(reader, "fanout.publisher.events.delivered", phase="replay") == 1
    assert total(reader, "fanout.publisher.events.delivered", phase="live") == 1
    latency = points(reader, "fanout.publisher.delivery.latency")
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
    assert total(reader, "fanout.publisher.responses.no_content") == 1
    assert total(reader, "fanout.publisher.responses.gone", cause="position-ahead") == 1
    assert total(reader, "fanout.publisher.responses.gone", cause="history-expired") == 1


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
        await eventually(lambda: total(reader, "fanout.publisher.queue.overflows") == 1)
    finally:
        stalled.close()


def test_nothing_is_exported_by_default():
    assert providers_from_env({}) == (None, None)
    assert providers_from_env({"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}) == (None, None)
    tracer_provider, meter_provider = providers_from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert isinstance(tracer_provider, TracerProvider)
    assert meter_provider is None
    tracer_provider.shutdown()
