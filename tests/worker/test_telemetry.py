"""Spans and metrics of real worker runs, read with the SDK's in-memory exporter and reader."""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from schema.keys import Keys
from tests.worker.support import fake_upstream, make_job, running_worker, settings_for, stored_events, submit, wait_done
from worker.telemetry import METRICS, Telemetry

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
    assert captured.total("fanout.worker.events_appended", provider="anthropic") == len(stored)
    assert captured.total("fanout.worker.terminals", status="completed", category="none") == 1
    (ttfd,) = captured.points("fanout.worker.time_to_first_delta")
    (duration,) = captured.points("fanout.worker.stream_duration")
    assert ttfd[1].count == 1
    assert duration[1].count == 1
    assert 0 <= ttfd[1].sum <= duration[1].sum


async def test_unknown_upstream_events_counted_by_name(redis_url: str, keys: Keys,
                                                       redis_client: aioredis.Redis) -> None:
    captured = Captured()
    await _run(captured, redis_url, keys, redis_client, provider="anthropic", model=ANTHROPIC)
    assert captured.total("fanout.worker.upstream_ignored", event="ping") >= 1


async def test_retries_and_failure_category_counted(redis_url: str, keys: Keys,
                                                    redis_client: aioredis.Redis) -> None:
    captured = Captured()
    await _run(captured, redis_url, keys, redis_client, provider="gemini", model="status-429", max_retries=2)
    assert captured.total("fanout.worker.upstream_retries", category="rate_limited") == 2
    assert captured.total("fanout.worker.terminals", status="failed", category="rate_limited") == 1
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
    telemetry = Telemetry.from_exporters()
    with telemetry.job_span("st_x", "gemini", "m") as span:
        assert not span.is_recording()
    telemetry.shutdown()


def test_console_exporters_when_asked(capfd: pytest.CaptureFixture[str]) -> None:
    telemetry = Telemetry.from_exporters(traces="console", metrics_exporter="console")
    with telemetry.job_span("st_console", "gemini", "m") as span:
        assert span.is_recording()
    telemetry.events_appended(3, "gemini")
    telemetry.shutdown()
    printed = capfd.readouterr().out
    assert "st_console" in printed
    assert "fanout.worker.events_appended" in printed


def _otlp_installed() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry.exporter.otlp") is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.skipif(_otlp_installed(), reason="an OTLP exporter is installed here")
def test_otlp_without_exporter_package_falls_back_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fanout.worker.telemetry"):
        telemetry = Telemetry.from_exporters(traces="otlp", metrics_exporter="otlp")
    with telemetry.job_span("st_x", "gemini", "m") as span:
        assert not span.is_recording()
    assert sum("otel_exporter_missing" in r.getMessage() for r in caplog.records) == 2
