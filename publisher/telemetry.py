"""OpenTelemetry for the publisher: one server span per request and the fan-out metrics.

The app takes a tracer provider and a meter provider (tests inject in-memory ones); the
CLI builds them from the standard ``OTEL_*`` variables with :func:`providers_from_env`,
which exports nothing unless ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` name an
installed exporter. Span attributes never hold the query string (it may carry a token).

Follows the OpenTelemetry semantic conventions for HTTP server spans.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

log = logging.getLogger(__name__)

SCOPE = "fanout.publisher"
"""Instrumentation scope name of the tracer and the meter."""


class Telemetry:
    """The tracer and every publisher instrument.

    Args:
        tracer_provider: Source of the tracer (``None``: the global one).
        meter_provider: Source of the meter (``None``: the global one).
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self.tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, meter_provider=meter_provider)
        self.open_connections = meter.create_up_down_counter(
            "fanout.publisher.connections.open", unit="{connection}", description="Open SSE responses"
        )
        self.delivered = meter.create_counter(
            "fanout.publisher.events.delivered", unit="{event}", description="Events written to SSE responses"
        )
        self.latency = meter.create_histogram(
            "fanout.publisher.delivery.latency",
            unit="ms",
            description="From the event's ts (worker emit time) to its write on the SSE response",
        )
        self.resumes = meter.create_counter(
            "fanout.publisher.resumes", unit="{request}", description="SSE requests with a position (Last-Event-ID)"
        )
        self.no_content = meter.create_counter(
            "fanout.publisher.responses.no_content", unit="{response}", description="204: client holds the end"
        )
        self.gone = meter.create_counter(
            "fanout.publisher.responses.gone", unit="{response}", description="410 answers, by cause"
        )
        self.overflows = meter.create_counter(
            "fanout.publisher.queue.overflows", unit="{reader}", description="Readers closed for a full queue"
        )
        self.gaps = meter.create_counter(
            "fanout.publisher.gaps", unit="{response}", description="Open responses closed on a history gap"
        )

    def record_delivery(self, ts_ms: int, phase: str) -> None:
        """Count one delivered event and its publish-to-delivery latency (ms).

        Args:
            ts_ms: The event's ``ts``; 0 (unknown) records no latency.
            phase: ``replay`` (read from history) or ``live``.
        """
        attributes = {"phase": phase}
        self.delivered.add(1, attributes)
        if ts_ms > 0:
            self.latency.record(max(0.0, time.time() * 1000 - ts_ms), attributes)


def providers_from_env(
    environ: Mapping[str, str],
) -> tuple[TracerProvider | None, MeterProvider | None]:
    """Build SDK providers from ``OTEL_*`` variables; ``(None, None)`` when nothing is asked.

    ``OTEL_SDK_DISABLED=true`` or unset exporter variables export nothing (the global
    no-op providers are used). The service name, resource attributes, sampler and
    batch/interval settings are read by the SDK itself from their ``OTEL_*`` variables.
    """
    if environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None, None
    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", "fanout-publisher")})
    tracer_provider = None
    for exporter in _exporters("opentelemetry_traces_exporter", environ.get("OTEL_TRACES_EXPORTER", "none")):
        tracer_provider = tracer_provider or TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    readers: list[MetricReader] = [
        PeriodicExportingMetricReader(exporter)
        for exporter in _exporters("opentelemetry_metrics_exporter", environ.get("OTEL_METRICS_EXPORTER", "none"))
    ]
    meter_provider = MeterProvider(resource=resource, metric_readers=readers) if readers else None
    return tracer_provider, meter_provider


def _exporters(group: str, names: str) -> list[Any]:
    """Instantiate the exporters named (comma-separated) from the entry points of ``group``."""
    found: list[Any] = []
    for name in (n.strip() for n in names.split(",")):
        if not name or name == "none":
            continue
        points = entry_points(group=group, name=name)
        if not points:
            log.warning("OpenTelemetry exporter %r is not installed (group %s); ignored", name, group)
            continue
        found.append(next(iter(points)).load()())
    return found
