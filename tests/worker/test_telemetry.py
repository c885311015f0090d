"""Spans and metrics of real worker runs, read with the SDK's in-memory exporter and reader."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis.asyncio as aioredis
import redis.exceptions
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infra.groups import ensure_group
from infra.otel_setup import exporter_names, redis_error_kind
from schema.job import job_decoder, job_encoder
from schema.keys import Keys
from tests.worker.support import (
    GUARD_S,
    fake_upstream,
    make_job,
    running_worker,
    settings_for,
    stored_events,
    submit,
    wait_done,
    wait_for,
)
from worker.intake import Intake
from worker.job_groups import read_job_groups, watch_job_groups
from worker.telemetry import METRICS, Telemetry

ROOT = Path(__file__).resolve().parents[2]
CHAT = "simple_text_cyrillic_usage_chunk"
ANTHROPIC = "simple_text_ping_and_padding"


class Captured:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.telemetry = Telemetry(tracer_provider, MeterProvider(metric_readers=[self.reader]))

    def points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        data = self.reader.get_metrics_data()
        out = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        out += [(dict(p.attributes or {}), p) for p in metric.data.data_points]
        return out

    def total(self, name: str, **attributes: str) -> int:
        return sum(int(p.value) for attrs, p in self.points(name) if attributes.items() <= attrs.items())


async def _run(captured: Captured, redis_url: str, keys: Keys, redis: aioredis.Redis, *, provider: str, model: str,
               **limits: Any) -> str:
    async with fake_upstream() as (base, _state):
        settings = settings_for(base, redis_url, keys, **limits)
        async with running_worker(settings, keys, telemetry=captured.telemetry):
            job = make_job(provider, model)
            await submit(redis, keys, job)
            await wait_done(redis, keys, job.stream_id)
    return job.stream_id


async def test_job_and_upstream_spans_carry_stream_attributes(redis_url: str, keys: Keys,
                                                              redis_client: aioredis.Redis) -> None:
    captured = Captured()
    stream_id = await _run(captured, redis_url, keys, redis_client, provider="openai_chat", model=CHAT)
    spans = {span.name: span for span in captured.spans.get_finished_spans()}
    job, upstream = spans["fanout.job"], spans["fanout.upstream"]
    for span in (job, upstream):
        attributes = dict(span.attributes or {})
        assert attributes["fanout.stream_id"] == stream_id
        assert attributes["fanout.provider"] == "openai_chat"
        assert attributes["fanout.model"] == CHAT
        assert attributes["fanout.status"] == "completed"
    assert upstream.parent is not None
    assert job.context is not None
    assert upstream.parent.span_id == job.context.span_id
    assert dict(upstream.attributes or {})["http.response.status_code"] == 200


async def test_metrics_count_events_terminals_and_latencies(redis_url: str, keys: Keys,
                                                            redis_client: aioredis.Redis) -> None:
    captured = Captured()
    stream_id = await _run(captured, redis_url, keys, redis_client, provider="anthropic", model=ANTHROPIC)
    stored = await stored_events(redis_client, keys, stream_id)
    assert captured.total("fanout.events.appended", provider="anthropic") == len(stored)
    assert captured.total("fanout.streams.ended", status="completed", category="none") == 1
    (ttfd,) = captured.points("fanout.time_to_first_delta")
    (duration,) = captured.points("fanout.stream.duration")
    assert ttfd[1].count == 1
    assert duration[1].count == 1
    assert 0 <= ttfd[1].sum <= duration[1].sum


async def test_unknown_upstream_events_counted_by_provider(redis_url: str, keys: Keys,
                                                           redis_client: aioredis.Redis) -> None:
    captured = Captured()
    await _run(captured, redis_url, keys, redis_client, provider="anthropic", model=ANTHROPIC)
    assert captured.total("fanout.upstream.ignored", provider="anthropic") >= 1
    assert all(set(attrs) == {"provider"} for attrs, _ in captured.points("fanout.upstream.ignored"))


async def test_retries_and_failure_category_counted(redis_url: str, keys: Keys,
                                                    redis_client: aioredis.Redis) -> None:
    captured = Captured()
    await _run(captured, redis_url, keys, redis_client, provider="gemini", model="status-429", max_retries=2)
    assert captured.total("fanout.upstream.retries", category="rate_limited") == 2
    assert captured.total("fanout.streams.ended", status="failed", category="rate_limited") == 1
    upstream = [s for s in captured.spans.get_finished_spans() if s.name == "fanout.upstream"]
    assert sorted(dict(s.attributes or {})["fanout.attempt"] for s in upstream) == [1, 2, 3]
    assert {dict(s.attributes or {})["http.response.status_code"] for s in upstream} == {429}


def test_instruments_are_documented() -> None:
    captured = Captured()
    captured.telemetry.events_appended(1, "p")
    captured.telemetry.terminal(provider="p", status="failed", category="protocol")
    names = {m.name for r in captured.reader.get_metrics_data().resource_metrics for s in r.scope_metrics
             for m in s.metrics}
    assert names <= set(METRICS)


def test_default_exporters_are_noop() -> None:
    telemetry = Telemetry.from_env({})
    with telemetry.job_span(make_job("gemini", "m")) as span:
        assert not span.is_recording()
    assert not telemetry.metrics_enabled
    telemetry.shutdown()


CONSOLE_SCRIPT = """
from tests.worker.support import make_job
from worker.telemetry import Telemetry
telemetry = Telemetry.from_env()
job = make_job("gemini", "m", stream_id="st_console")
with telemetry.job_span(job):
    pass
telemetry.events_appended(3, "gemini")
telemetry.shutdown()
"""


def test_console_exporters_when_asked() -> None:
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "console"}
    done = subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=True)
    assert '"name": "fanout.job"' in done.stdout
    assert "st_console" in done.stdout
    assert "fanout.events.appended" in done.stdout


def test_sdk_disabled_exports_nothing() -> None:
    telemetry = Telemetry.from_env({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"})
    with telemetry.job_span(make_job("gemini", "m")) as span:
        assert not span.is_recording()
    telemetry.shutdown()


def test_unknown_exporter_name_is_one_warning_naming_the_choices(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fanout.otel"):
        telemetry = Telemetry.from_env({"OTEL_TRACES_EXPORTER": "zipkin_json", "OTEL_METRICS_EXPORTER": "nope"})
    with telemetry.job_span(make_job("gemini", "m")) as span:
        assert not span.is_recording()
    unknown = [r.getMessage() for r in caplog.records if "otel_exporter_unknown" in r.getMessage()]
    assert len(unknown) == 2
    assert "asked=zipkin_json" in unknown[0]
    assert "group opentelemetry_traces_exporter" in unknown[0]
    assert "one of: console, otlp, otlp_proto_grpc, otlp_proto_http'" in unknown[0]
    assert "one of: console, otlp, otlp_proto_grpc, otlp_proto_http, prometheus'" in unknown[1]
    assert not [r for r in caplog.records if "otel_exporter_missing" in r.getMessage()]
    telemetry.shutdown()


def test_a_shipped_exporter_that_cannot_load_asks_for_the_extra(caplog: pytest.LogCaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from infra import otel_setup

    monkeypatch.setattr(otel_setup, "_entry_point", lambda signal, name: None)  # as without the [otel] extra
    with caplog.at_level(logging.WARNING, logger="fanout.otel"):
        telemetry = Telemetry.from_env({"OTEL_TRACES_EXPORTER": "console"})
    missing = [r.getMessage() for r in caplog.records if "otel_exporter_missing" in r.getMessage()]
    assert len(missing) == 1
    assert "asked=console" in missing[0]
    assert "fanout[otel]" in missing[0]
    telemetry.shutdown()


def test_otlp_protocol_picks_the_entry_point() -> None:
    assert exporter_names({"OTEL_TRACES_EXPORTER": "otlp"}, "traces") == ["otlp_proto_grpc"]
    http = {"OTEL_TRACES_EXPORTER": "otlp, console", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    assert exporter_names(http, "traces") == ["otlp_proto_http", "console"]
    per_signal = {**http, "OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc"}
    assert exporter_names(per_signal, "metrics") == ["otlp_proto_grpc"]
    assert exporter_names({"OTEL_LOGS_EXPORTER": "none"}, "logs") == []
    assert exporter_names({}, "metrics") == []


def test_job_span_is_child_of_the_submitted_trace_context() -> None:
    captured = Captured()
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    job = make_job("gemini", "m", trace_context={"traceparent": f"00-{trace_id}-{parent_id}-01"})
    with captured.telemetry.job_span(job):
        pass
    (span,) = captured.spans.get_finished_spans()
    assert span.context is not None
    assert span.parent is not None
    assert format(span.context.trace_id, "032x") == trace_id
    assert format(span.parent.span_id, "016x") == parent_id


def test_job_span_without_trace_context_is_a_root() -> None:
    captured = Captured()
    with captured.telemetry.job_span(make_job("gemini", "m")):
        pass
    (span,) = captured.spans.get_finished_spans()
    assert span.parent is None


def test_redis_errors_sorted_by_kind() -> None:
    cases = {
        "connection": redis.exceptions.ConnectionError("refused"),
        "timeout": redis.exceptions.TimeoutError("slow"),
        "oom": redis.exceptions.ResponseError("OOM command not allowed when used memory > 'maxmemory'."),
        "moved_ask": redis.exceptions.ResponseError("MOVED 3999 127.0.0.1:6381"),
        "refused": redis.exceptions.ResponseError("NOREPLICAS Not enough good replicas to write."),
        "permanent": redis.exceptions.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"),
        "other": redis.exceptions.RedisError("odd"),
    }
    assert {kind: redis_error_kind(exc) for kind, exc in cases.items()} == {kind: kind for kind in cases}
    captured = Captured()
    for exc in cases.values():
        captured.telemetry.redis_error(exc)
    assert {attrs["kind"]: int(p.value) for attrs, p in captured.points("fanout.redis.errors")} == dict.fromkeys(
        cases, 1)


async def test_reclaimed_job_counted_and_worker_lost_is_a_terminal(redis_url: str, keys: Keys,
                                                                   redis_client: aioredis.Redis) -> None:
    intake = Intake(redis_client, keys, consumer="dead-1", lease_s=30)
    await ensure_group(redis_client, keys.jobs_shard(0))
    job = make_job("openai_chat", CHAT)
    await submit(redis_client, keys, job)
    # delivered to a consumer that never acks
    assert len(await intake.read_new(keys.jobs_shard(0), 1, block_ms=100)) == 1
    captured = Captured()
    async with fake_upstream() as (base, _state):
        settings = settings_for(base, redis_url, keys, lease_s=0.3)
        async with running_worker(settings, keys, telemetry=captured.telemetry, consumer="heir"):
            await wait_done(redis_client, keys, job.stream_id)
    assert captured.total("fanout.jobs.reclaimed") == 1
    assert captured.total("fanout.jobs.claimed") == 1
    assert captured.total("fanout.jobs.ended", outcome="done") == 1
    assert captured.total("fanout.jobs.in_flight") == 0
    assert captured.total("fanout.streams.ended", provider="openai_chat", status="completed") == 1


async def _redis_version(client: aioredis.Redis) -> int:
    return int(str((await client.info("server"))["redis_version"]).split(".")[0])


async def test_job_groups_gauges_report_pending_and_lag_per_shard(keys: Keys, redis_client: aioredis.Redis) -> None:
    intake = Intake(redis_client, keys, consumer="c-1", lease_s=30)
    await ensure_group(redis_client, keys.jobs_shard(0))
    for _ in range(3):
        await submit(redis_client, keys, make_job("gemini", "m"))
    assert len(await intake.read_new(keys.jobs_shard(0), 1, block_ms=100)) == 1
    captured = Captured()
    missing = keys.jobs_shard(0) + "-absent"
    await read_job_groups(redis_client, [("0", keys.jobs_shard(0)), ("1", missing)], captured.telemetry)
    assert [(attrs, int(p.value)) for attrs, p in captured.points("fanout.jobs.pending")] == [({"shard": "0"}, 1)]
    lag = [(attrs, int(p.value)) for attrs, p in captured.points("fanout.jobs.lag")]
    assert lag == ([({"shard": "0"}, 2)] if await _redis_version(redis_client) >= 7 else [])
    assert captured.total("fanout.redis.errors") == 0  # a shard stream not created yet is no error


async def test_job_groups_poller_stops_with_the_worker_and_skips_without_metrics(
        keys: Keys, redis_client: aioredis.Redis) -> None:
    stop = asyncio.Event()
    stop.set()
    await asyncio.wait_for(watch_job_groups(redis_client, [("0", keys.jobs_shard(0))], Telemetry(), interval_s=0.01,
                                            stop=stop), GUARD_S)
    captured = Captured()
    stop.clear()
    task = asyncio.create_task(watch_job_groups(redis_client, [("0", keys.jobs_shard(0))], captured.telemetry,
                                                interval_s=0.01, stop=stop))
    await ensure_group(redis_client, keys.jobs_shard(0))
    async def observed() -> bool:
        return bool(captured.points("fanout.jobs.pending"))

    await wait_for(observed)
    stop.set()
    await asyncio.wait_for(task, GUARD_S)


class TraceCollector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []

    def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:  # noqa: N802
        self.requests.append(request)
        return ExportTraceServiceResponse()


def test_otlp_grpc_exporter_reaches_a_grpc_receiver(monkeypatch: pytest.MonkeyPatch) -> None:
    collector = TraceCollector()
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "fanout-worker-grpc-test")
        telemetry = Telemetry.from_env({"OTEL_TRACES_EXPORTER": "otlp"})  # otlp = gRPC unless a protocol says
        job = make_job("gemini", "m")
        with telemetry.job_span(job):
            pass
        telemetry.shutdown()  # flushes the batch
    finally:
        server.stop(grace=None)
    spans = [(rs.resource, span) for request in collector.requests for rs in request.resource_spans
             for ss in rs.scope_spans for span in ss.spans]
    assert [span.name for _, span in spans] == ["fanout.job"]
    resource, _ = spans[0]
    assert {kv.key: kv.value.string_value for kv in resource.attributes}["service.name"] == "fanout-worker-grpc-test"


def test_job_from_an_older_publisher_without_trace_context_decodes() -> None:
    old = b'{"stream_id":"st_old","provider":"gemini","model":"m","request":{},"created_ms":1}'
    job = job_decoder.decode(old)
    assert job.trace_context == {}
    assert job_decoder.decode(job_encoder.encode(job)) == job
