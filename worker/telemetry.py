"""The worker's traces and metrics (OpenTelemetry SDK), configured by the standard ``OTEL_*`` variables.

``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``: ``none`` (the default here, so nothing
is exported unless asked), ``console``, or ``otlp`` (only when an
``opentelemetry-exporter-otlp-proto-http`` or ``-grpc`` package is installed; otherwise one
warning line and nothing). The exporters themselves read the rest (``OTEL_SERVICE_NAME``,
``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_METRIC_EXPORT_INTERVAL``, ...). Tests inject their own
providers (``InMemorySpanExporter``, ``InMemoryMetricReader``); the global providers are
never touched.

Spans: ``fanout.job`` (one per job run) and its child ``fanout.upstream`` (one per upstream
attempt), attributes ``fanout.stream_id``, ``fanout.provider``, ``fanout.model``,
``fanout.status``. Metrics: :data:`METRICS`.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Final

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

log = logging.getLogger("fanout.worker.telemetry")

SCOPE: Final = "fanout.worker"
"""Instrumentation scope name of every span and instrument."""

METRICS: Final = {
    "fanout.worker.events_appended": "counter: contract events stored, by provider",
    "fanout.worker.upstream_ignored": "counter: upstream events skipped, by provider and event name",
    "fanout.worker.terminals": "counter: finished streams, by provider, status and error category",
    "fanout.worker.time_to_first_delta": "histogram (ms): claim to first stored block.delta",
    "fanout.worker.stream_duration": "histogram (ms): claim to stored terminal event",
    "fanout.worker.upstream_retries": "counter: upstream attempts retried, by provider and category",
}
"""Instrument name → what it counts."""

_OTLP_MODULES: Final = {
    "traces": ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
               "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"),
    "metrics": ("opentelemetry.exporter.otlp.proto.http.metric_exporter",
                "opentelemetry.exporter.otlp.proto.grpc.metric_exporter"),
}
_OTLP_CLASSES: Final = {"traces": "OTLPSpanExporter", "metrics": "OTLPMetricExporter"}


def _otlp_exporter(signal: str) -> Any | None:
    for module in _OTLP_MODULES[signal]:
        try:
            return getattr(importlib.import_module(module), _OTLP_CLASSES[signal])()
        except ImportError:
            continue
    log.warning("event=otel_exporter_missing signal=%s asked=otlp action=disabled "
                "hint='pip install opentelemetry-exporter-otlp'", signal)
    return None


def _exporter(signal: str, name: str) -> Any | None:
    choice = name.strip().lower() or "none"
    if choice == "none":
        return None
    if choice == "console":
        # sys.stdout as it is now, not as it was when the SDK was imported
        return ConsoleSpanExporter(out=sys.stdout) if signal == "traces" else ConsoleMetricExporter(out=sys.stdout)
    if choice == "otlp":
        return _otlp_exporter(signal)
    log.warning("event=otel_exporter_unknown signal=%s asked=%s action=disabled", signal, choice)
    return None


class Telemetry:
    """Spans and instruments of one worker process.

    Args:
        tracer_provider: Where spans go; default a no-op provider.
        meter_provider: Where measurements go; default a no-op provider.
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self._tracer_provider = tracer_provider or trace.NoOpTracerProvider()
        self._meter_provider = meter_provider or metrics.NoOpMeterProvider()
        self.tracer = self._tracer_provider.get_tracer(SCOPE)
        meter = self._meter_provider.get_meter(SCOPE)
        self._appended = meter.create_counter("fanout.worker.events_appended", unit="{event}")
        self._ignored = meter.create_counter("fanout.worker.upstream_ignored", unit="{event}")
        self._terminals = meter.create_counter("fanout.worker.terminals", unit="{stream}")
        self._ttfd = meter.create_histogram("fanout.worker.time_to_first_delta", unit="ms")
        self._duration = meter.create_histogram("fanout.worker.stream_duration", unit="ms")
        self._retries = meter.create_counter("fanout.worker.upstream_retries", unit="{attempt}")

    @classmethod
    def from_exporters(cls, *, traces: str = "none", metrics_exporter: str = "none") -> Telemetry:
        """Build SDK providers for the ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` values.

        ``none`` (or an exporter that is not installed) leaves that signal a no-op.
        """
        resource = Resource.create()  # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": "fanout-worker"}))
        tracer_provider: TracerProvider | None = None
        meter_provider: MeterProvider | None = None
        span_exporter: SpanExporter | None = _exporter("traces", traces)
        if span_exporter is not None:
            tracer_provider = TracerProvider(resource=resource)
            tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        metric_exporter = _exporter("metrics", metrics_exporter)
        if metric_exporter is not None:
            readers: list[MetricReader] = [PeriodicExportingMetricReader(metric_exporter)]
            meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        return cls(tracer_provider, meter_provider)

    def shutdown(self) -> None:
        """Flush and stop SDK providers (no-op providers have nothing to do)."""
        for provider in (self._tracer_provider, self._meter_provider):
            shutdown = getattr(provider, "shutdown", None)
            if callable(shutdown):
                shutdown()

    @contextlib.contextmanager
    def job_span(self, stream_id: str, provider: str, model: str) -> Iterator[trace.Span]:
        """Span of one job run; the caller sets ``fanout.status`` when the stream ends."""
        attributes: dict[str, str | int] = {"fanout.stream_id": stream_id, "fanout.provider": provider,
                                            "fanout.model": model}
        kind = trace.SpanKind.CONSUMER
        with self.tracer.start_as_current_span("fanout.job", kind=kind, attributes=attributes) as span:
            yield span

    @contextlib.contextmanager
    def upstream_span(self, stream_id: str, provider: str, model: str, attempt: int) -> Iterator[trace.Span]:
        """Span of one upstream request (child of the current job span)."""
        attributes: dict[str, str | int] = {"fanout.stream_id": stream_id, "fanout.provider": provider,
                                            "fanout.model": model, "fanout.attempt": attempt}
        kind = trace.SpanKind.CLIENT
        with self.tracer.start_as_current_span("fanout.upstream", kind=kind, attributes=attributes) as span:
            yield span

    def events_appended(self, count: int, provider: str) -> None:
        """Count ``count`` stored events."""
        self._appended.add(count, {"provider": provider})

    def ignored(self, counts: Mapping[str, int], provider: str) -> None:
        """Count the upstream events an adapter skipped, by event name."""
        for name, count in counts.items():
            if count:
                self._ignored.add(count, {"provider": provider, "event": name})

    def terminal(self, *, provider: str, status: str, category: str | None) -> None:
        """Count one finished stream by status and error category (``none`` for success)."""
        self._terminals.add(1, {"provider": provider, "status": status, "category": category or "none"})

    def first_delta(self, ms: float, provider: str) -> None:
        """Record the time from claim to the first stored delta, in milliseconds."""
        self._ttfd.record(max(0.0, ms), {"provider": provider})

    def duration(self, ms: float, provider: str) -> None:
        """Record the time from claim to the stored terminal event, in milliseconds."""
        self._duration.record(max(0.0, ms), {"provider": provider})

    def retry(self, *, provider: str, category: str) -> None:
        """Count one upstream retry and the error category that caused it."""
        self._retries.add(1, {"provider": provider, "category": category})
