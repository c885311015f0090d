"""OpenTelemetry providers from the standard ``OTEL_*`` variables, shared by the worker and the publisher.

The three exporter variables name exporters by their entry points, as
``opentelemetry-sdk``'s own configurator resolves them:

========================  ========================================  ===============================
variable                  entry-point group                         names shipped with ``[otel]``
========================  ========================================  ===============================
``OTEL_TRACES_EXPORTER``  ``opentelemetry_traces_exporter``         ``otlp``, ``otlp_proto_http``,
                                                                    ``otlp_proto_grpc``, ``console``
``OTEL_METRICS_EXPORTER`` ``opentelemetry_metrics_exporter``        the same, and ``prometheus``
``OTEL_LOGS_EXPORTER``    ``opentelemetry_logs_exporter``           the same as traces
========================  ========================================  ===============================

Values are comma-separated; ``none`` or unset exports nothing (fanout's default: the SDK's
own default is ``otlp``). ``otlp`` picks gRPC or HTTP from
``OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``grpc``, the
SDK's default, or ``http/protobuf``). Exporters are built with no arguments, so endpoints,
headers, timeouts, the export interval, the sampler and the resource
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``) are read by the SDK itself.
``prometheus`` is a pull reader: it serves ``/metrics`` on ``OTEL_EXPORTER_PROMETHEUS_HOST``
(default ``localhost``) : ``OTEL_EXPORTER_PROMETHEUS_PORT`` (default ``9464``).
``OTEL_SDK_DISABLED=true`` turns everything off. An exporter that is not installed, or
fails to start (a port in use: each process needs its own ``OTEL_EXPORTER_PROMETHEUS_PORT``,
as ``fanout demo`` gives its workers and publisher), is one warning line and that exporter is skipped.

No global provider is set: each process hands its providers to its ``Telemetry``.

Follows the OpenTelemetry specification, "Environment Variable Specification" (SDK
configuration, exporter selection, Prometheus exporter).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Final, Literal

import redis.exceptions
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from infra.redis_faults import classify

log = logging.getLogger("fanout.otel")

Signal = Literal["traces", "metrics", "logs"]

_GROUP: Final[dict[Signal, str]] = {
    "traces": "opentelemetry_traces_exporter",
    "metrics": "opentelemetry_metrics_exporter",
    "logs": "opentelemetry_logs_exporter",
}
_SHIPPED: Final[dict[Signal, frozenset[str]]] = {
    "traces": frozenset({"otlp_proto_grpc", "otlp_proto_http", "console"}),
    "metrics": frozenset({"otlp_proto_grpc", "otlp_proto_http", "console", "prometheus"}),
    "logs": frozenset({"otlp_proto_grpc", "otlp_proto_http", "console"}),
}
"""Entry-point names the ``[otel]`` extra installs, per signal (the module table)."""
_OTLP_BY_PROTOCOL: Final = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}

SECONDS_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                          900.0)
"""Histogram bucket bounds (seconds) for latencies and durations: 5 ms to the 900 s job limit."""

RedisErrorKind = Literal["connection", "timeout", "oom", "moved_ask", "refused", "permanent", "other"]
REDIS_ERROR_KINDS: Final[tuple[RedisErrorKind, ...]] = ("connection", "timeout", "oom", "moved_ask", "refused",
                                                         "permanent", "other")
"""Values of the ``kind`` attribute of ``fanout.redis.errors``."""

_KIND_OF_CODE: Final[dict[str, RedisErrorKind]] = {
    "OOM": "oom", "MOVED": "moved_ask", "ASK": "moved_ask", "TRYAGAIN": "moved_ask", "CLUSTERDOWN": "moved_ask",
}


def redis_error_kind(exc: BaseException) -> RedisErrorKind:
    """Sort a Redis client error into one of :data:`REDIS_ERROR_KINDS`, by :func:`infra.redis_faults.classify`.

    ``timeout`` (socket timeout), ``connection`` (refused, reset, closed), ``oom`` (``OOM``
    reply: ``maxmemory`` reached), ``moved_ask`` (cluster redirections, ``TRYAGAIN``,
    ``CLUSTERDOWN``, no slot map), ``refused`` (any other reply a retry cures:
    ``LOADING``, ``BUSY``, ``NOREPLICAS``, ``READONLY``, ``MASTERDOWN``, ``MISCONF``...),
    ``permanent`` (a reply or an authentication error that a retry will not change:
    ``WRONGTYPE``, ``NOPERM``, ``ERR``...), ``other`` (a client-side error).
    """
    if isinstance(exc, redis.exceptions.TimeoutError | TimeoutError):
        return "timeout"
    fault = classify(exc)
    if fault.code:
        return _KIND_OF_CODE.get(fault.code) or ("permanent" if fault.kind == "permanent" else "refused")
    if fault.kind == "transient":
        return "connection" if isinstance(exc, redis.exceptions.ConnectionError | OSError) else "moved_ask"
    return "permanent" if isinstance(exc, redis.exceptions.ConnectionError) else "other"


class Providers:
    """The SDK providers a process exports with; ``None`` for a signal exported nowhere.

    Args:
        tracer_provider: Spans, or ``None``.
        meter_provider: Metrics, or ``None``.
        logger_provider: Log records (a handler on the root logger feeds it), or ``None``.
    """

    def __init__(self, tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None,
                 logger_provider: LoggerProvider | None = None, handler: logging.Handler | None = None) -> None:
        self.tracer_provider, self.meter_provider = tracer_provider, meter_provider
        self.logger_provider, self._handler = logger_provider, handler

    def shutdown(self) -> None:
        """Flush and stop every provider (a pull reader stops serving)."""
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
        for provider in (self.tracer_provider, self.meter_provider, self.logger_provider):
            if provider is not None:
                provider.shutdown()


def providers_from_env(environ: Mapping[str, str], *, service_name: str) -> Providers:
    """Build the providers the ``OTEL_*`` variables of ``environ`` ask for (see the module docstring).

    Args:
        environ: The process environment (``os.environ``); the SDK reads the variables
            other than the exporter names from ``os.environ`` itself.
        service_name: ``service.name`` used unless ``OTEL_SERVICE_NAME`` or
            ``OTEL_RESOURCE_ATTRIBUTES`` name one.

    Returns:
        The providers; all ``None`` when nothing is asked or ``OTEL_SDK_DISABLED=true``.
        Never raises for a missing or failing exporter (one warning each).
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Providers()
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": service_name}))
    return Providers(_tracer_provider(environ, resource), _meter_provider(environ, resource),
                     *_logger_provider(environ, resource))


def _tracer_provider(environ: Mapping[str, str], resource: Resource) -> TracerProvider | None:
    exporters = _build(environ, "traces")
    if not exporters:
        return None
    provider = TracerProvider(resource=resource)  # the sampler comes from OTEL_TRACES_SAMPLER
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _meter_provider(environ: Mapping[str, str], resource: Resource) -> MeterProvider | None:
    readers = [item if isinstance(item, MetricReader) else PeriodicExportingMetricReader(item)
               for item in _build(environ, "metrics")]
    return MeterProvider(resource=resource, metric_readers=readers) if readers else None


def _logger_provider(environ: Mapping[str, str],
                     resource: Resource) -> tuple[LoggerProvider | None, logging.Handler | None]:
    exporters = _build(environ, "logs")
    if not exporters:
        return None, None
    try:
        from opentelemetry.instrumentation.logging.handler import LoggingHandler  # noqa: PLC0415 (optional extra)
    except ImportError:
        _missing("logs", "LoggingHandler")
        return None, None
    provider = LoggerProvider(resource=resource)
    for exporter in exporters:
        provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    handler = LoggingHandler(logger_provider=provider)
    logging.getLogger().addHandler(handler)
    return provider, handler


def exporter_names(environ: Mapping[str, str], signal: Signal) -> list[str]:
    """Return the entry-point names ``OTEL_<SIGNAL>_EXPORTER`` asks for, ``otlp`` resolved by protocol.

    Returns:
        Names in order, possibly empty (``none``, unset). An unknown
        ``OTEL_EXPORTER_OTLP_PROTOCOL`` leaves ``otlp`` as the SDK's default (gRPC), with a warning.
    """
    raw = environ.get(f"OTEL_{signal.upper()}_EXPORTER", "none")
    names = [name.strip().lower() for name in raw.split(",") if name.strip()]
    protocol = (environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip()
    if "otlp" in names and protocol not in _OTLP_BY_PROTOCOL:
        log.warning("event=otel_protocol_unknown signal=%s protocol=%s action=grpc", signal, protocol)
    otlp = _OTLP_BY_PROTOCOL.get(protocol, "otlp_proto_grpc")
    return [otlp if name == "otlp" else name for name in names if name != "none"]


def _build(environ: Mapping[str, str], signal: Signal) -> list[Any]:
    built: list[Any] = []
    for name in exporter_names(environ, signal):
        point = _entry_point(signal, name)
        if point is None:
            _missing(signal, name)
            continue
        try:
            built.append(point.load()())
        except ImportError:
            _missing(signal, name)
        except Exception as exc:  # an exporter that cannot start (port in use, bad endpoint)
            log.warning("event=otel_exporter_failed signal=%s asked=%s error=%r action=disabled%s", signal, name,
                        str(exc), _failure_hint(name, exc))
    return built


def _failure_hint(name: str, exc: Exception) -> str:
    """Return a `` hint=...`` for a Prometheus port in use (each process needs its own), else nothing."""
    if name != "prometheus" or not isinstance(exc, OSError) or exc.errno != errno.EADDRINUSE:
        return ""
    port = os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464")
    return (f" hint='port {port} is taken, often by another fanout process on this machine: give each process "
            "its own OTEL_EXPORTER_PROMETHEUS_PORT'")


def _entry_point(signal: Signal, name: str) -> EntryPoint | None:
    return next(iter(entry_points(group=_GROUP[signal], name=name)), None)


def _missing(signal: Signal, name: str) -> None:
    """Warn about an exporter that cannot be loaded: the ``[otel]`` extra is missing, or the name is unknown."""
    shipped = _SHIPPED[signal]
    if name in shipped:
        log.warning("event=otel_exporter_missing signal=%s asked=%s action=disabled "
                    "hint='install the image or pip install \"fanout[otel]\"'", signal, name)
        return
    log.warning("event=otel_exporter_unknown signal=%s asked=%s action=disabled "
                "hint='no installed package provides entry point %s in group %s; with fanout[otel] use one of: %s'",
                signal, name, name, _GROUP[signal], ", ".join(sorted({"otlp", *shipped})))
