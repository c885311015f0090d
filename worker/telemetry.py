"""The worker's spans and metrics (OpenTelemetry SDK); the exporters come from ``OTEL_*`` (:mod:`infra.otel_setup`).

Spans: ``fanout.job`` (one per job run, CONSUMER; the child of the publisher's submit span
when the job carries W3C trace context) and its child ``fanout.upstream`` (one per upstream
attempt, CLIENT); attributes ``fanout.stream_id``, ``fanout.provider``, ``fanout.model``,
``fanout.status``. Metrics: :data:`METRICS` (the metrics table of docs/observability.md lists the same).
Attribute values come from small fixed sets (:data:`ATTRIBUTE_VALUES`), or are the names of
the upstreams file's endpoints (``endpoint``, ``fanout.endpoint``): never stream ids, model
names or upstream text. Tests inject their own providers (in-memory exporter and
reader); the global providers are never touched.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Final, get_args

from opentelemetry import metrics, propagate, trace
from opentelemetry.metrics import CallbackOptions, Observation

from infra.otel_setup import REDIS_ERROR_KINDS, SECONDS_BUCKETS, Providers, providers_from_env, redis_error_kind
from schema.contract import ErrorCategory, TerminalStatus
from schema.job import PROVIDERS, Job

SCOPE: Final = "fanout.worker"
"""Instrumentation scope name of every span and instrument."""

METRICS: Final = {
    "fanout.jobs.claimed": "counter: jobs this process claimed (a new fencing token)",
    "fanout.jobs.reclaimed": "counter: jobs taken over from a stopped owner (XAUTOCLAIM)",
    "fanout.jobs.in_flight": "up-down counter: jobs running in this process",
    "fanout.jobs.ended": "counter: job runs ended, by outcome",
    "fanout.jobs.pending": "observable gauge: jobs delivered to a worker and not yet acked, by shard",
    "fanout.jobs.lag": "observable gauge: jobs not yet delivered to any worker, by shard",
    "fanout.streams.ended": "counter: terminal events stored, by provider, status and category",
    "fanout.events.appended": "counter: contract events stored, by provider",
    "fanout.append.retries": "counter: appends retried after a Redis error, by kind",
    "fanout.time_to_first_delta": "histogram (s): claim to first stored block.delta",
    "fanout.stream.duration": "histogram (s): claim to stored terminal event",
    "fanout.upstream.retries": "counter: upstream attempts retried, by provider and category",
    "fanout.upstream.ignored": "counter: upstream events the adapter skipped (unknown or keep-alive), by provider",
    "fanout.upstream.attempts": "counter: upstream attempts ended, by endpoint and error category (none: content)",
    "fanout.upstream.fallbacks": "counter: jobs that left an endpoint for the next of their route, by endpoint",
    "fanout.endpoint.cooldowns": "counter: cooldowns started (Retry-After, or failures in a row), by endpoint",
    "fanout.redis.errors": "counter: Redis errors seen, by kind",
}
"""Instrument name → what it counts."""

OUTCOMES: Final = ("done", "skipped", "abandoned")
ATTRIBUTE_VALUES: Final[dict[str, frozenset[str]]] = {
    "provider": frozenset((*PROVIDERS, "other")),
    "status": frozenset(get_args(TerminalStatus)),
    "category": frozenset((*get_args(ErrorCategory), "none")),
    "outcome": frozenset(OUTCOMES),
    "kind": frozenset(REDIS_ERROR_KINDS),
}
"""Every value an attribute of a worker metric may take (``shard`` is a decimal shard number)."""


def _provider(name: str) -> str:
    return name if name in PROVIDERS else "other"  # an invalid job's stub may name anything


class Telemetry:
    """Spans and instruments of one worker process.

    Args:
        tracer_provider: Where spans go; default a no-op provider.
        meter_provider: Where measurements go; default a no-op provider.
        providers: SDK providers this object owns and shuts down (from :meth:`from_env`).
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None,
                 meter_provider: metrics.MeterProvider | None = None, *, providers: Providers | None = None) -> None:
        self._providers = providers
        self.metrics_enabled = meter_provider is not None
        """Whether measurements go anywhere (the job-groups poller runs only then)."""
        self.tracer = (tracer_provider or trace.NoOpTracerProvider()).get_tracer(SCOPE)
        meter = (meter_provider or metrics.NoOpMeterProvider()).get_meter(SCOPE)
        self._groups: dict[str, tuple[int, int | None]] = {}
        self._claimed = meter.create_counter("fanout.jobs.claimed", unit="{job}")
        self._reclaimed = meter.create_counter("fanout.jobs.reclaimed", unit="{job}")
        self._in_flight = meter.create_up_down_counter("fanout.jobs.in_flight", unit="{job}")
        self._jobs_ended = meter.create_counter("fanout.jobs.ended", unit="{job}")
        meter.create_observable_gauge("fanout.jobs.pending", [self._observe_pending], unit="{job}")
        meter.create_observable_gauge("fanout.jobs.lag", [self._observe_lag], unit="{job}")
        self._ended = meter.create_counter("fanout.streams.ended", unit="{stream}")
        self._appended = meter.create_counter("fanout.events.appended", unit="{event}")
        self._append_retries = meter.create_counter("fanout.append.retries", unit="{attempt}")
        self._ttfd = meter.create_histogram("fanout.time_to_first_delta", unit="s",
                                            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)
        self._duration = meter.create_histogram("fanout.stream.duration", unit="s",
                                                explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)
        self._retries = meter.create_counter("fanout.upstream.retries", unit="{attempt}")
        self._ignored = meter.create_counter("fanout.upstream.ignored", unit="{event}")
        self._attempts = meter.create_counter("fanout.upstream.attempts", unit="{attempt}")
        self._fallbacks = meter.create_counter("fanout.upstream.fallbacks", unit="{job}")
        self._cooldowns = meter.create_counter("fanout.endpoint.cooldowns", unit="{cooldown}")
        self._redis_errors = meter.create_counter("fanout.redis.errors", unit="{error}")
        self._start_at_zero()

    def _start_at_zero(self) -> None:
        """Export every counter from the start (0), so a rate is 0 rather than missing."""
        for counter in (self._claimed, self._reclaimed, self._in_flight):
            counter.add(0)
        for outcome in OUTCOMES:
            self._jobs_ended.add(0, {"outcome": outcome})
        for kind in REDIS_ERROR_KINDS:
            self._redis_errors.add(0, {"kind": kind})
            self._append_retries.add(0, {"kind": kind})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Telemetry:
        """Telemetry exporting where the ``OTEL_*`` variables say (nothing by default)."""
        providers = providers_from_env(environ, service_name="fanout-worker")
        return cls(providers.tracer_provider, providers.meter_provider, providers=providers)

    def shutdown(self) -> None:
        """Flush and stop the providers this object owns (none when injected)."""
        if self._providers is not None:
            self._providers.shutdown()

    @contextlib.contextmanager
    def job_span(self, job: Job) -> Iterator[trace.Span]:
        """Span of one job run, child of the submit span in ``job.trace_context`` (if any).

        The caller sets ``fanout.status`` when the stream ends.
        """
        attributes: dict[str, str | int] = {"fanout.stream_id": job.stream_id, "fanout.provider": job.provider,
                                            "fanout.model": job.model}
        parent = propagate.extract(job.trace_context) if job.trace_context else None
        with self.tracer.start_as_current_span("fanout.job", context=parent, kind=trace.SpanKind.CONSUMER,
                                               attributes=attributes) as span:
            yield span

    @contextlib.contextmanager
    def upstream_span(self, stream_id: str, provider: str, model: str, attempt: int,
                      endpoint: str | None = None) -> Iterator[trace.Span]:
        """Span of one upstream request (child of the current job span); ``fanout.endpoint`` names its endpoint."""
        attributes: dict[str, str | int] = {"fanout.stream_id": stream_id, "fanout.provider": provider,
                                            "fanout.model": model, "fanout.attempt": attempt}
        if endpoint is not None:
            attributes["fanout.endpoint"] = endpoint
        kind = trace.SpanKind.CLIENT
        with self.tracer.start_as_current_span("fanout.upstream", kind=kind, attributes=attributes) as span:
            yield span

    @contextlib.contextmanager
    def job_running(self) -> Iterator[None]:
        """Count one claimed job in flight for the duration of the block."""
        self._claimed.add(1)
        self._in_flight.add(1)
        try:
            yield
        finally:
            self._in_flight.add(-1)

    def job_ended(self, outcome: str) -> None:
        """Count one job run ended ``done``, ``skipped`` or ``abandoned``."""
        self._jobs_ended.add(1, {"outcome": outcome if outcome in OUTCOMES else "abandoned"})

    def jobs_reclaimed(self, count: int) -> None:
        """Count ``count`` jobs taken over from a stopped owner."""
        self._reclaimed.add(count)

    def job_groups(self, shard: str, *, pending: int, lag: int | None) -> None:
        """Remember one shard's consumer-group state (``XINFO GROUPS``) for the next collection.

        Args:
            shard: Decimal shard number (``"0"`` for the single jobs stream).
            pending: Entries delivered and not acked.
            lag: Entries not yet delivered, ``None`` when Redis cannot tell (then not exported).
        """
        self._groups[shard] = (pending, lag)

    def _observe_pending(self, _options: CallbackOptions) -> list[Observation]:
        return [Observation(pending, {"shard": shard}) for shard, (pending, _lag) in self._groups.items()]

    def _observe_lag(self, _options: CallbackOptions) -> list[Observation]:
        return [Observation(lag, {"shard": shard}) for shard, (_p, lag) in self._groups.items() if lag is not None]

    def events_appended(self, count: int, provider: str) -> None:
        """Count ``count`` stored events."""
        self._appended.add(count, {"provider": _provider(provider)})

    def append_retry(self, exc: BaseException) -> None:
        """Count one append retried after the Redis error ``exc`` (called by the appender's retry policy)."""
        self._append_retries.add(1, {"kind": redis_error_kind(exc)})

    def ignored(self, counts: Mapping[str, int], provider: str) -> None:
        """Count the upstream events an adapter skipped (the names stay out of the attributes)."""
        total = sum(counts.values())
        if total:
            self._ignored.add(total, {"provider": _provider(provider)})

    def terminal(self, *, provider: str, status: str, category: str | None) -> None:
        """Count one stored terminal event by status and error category (``none`` for success)."""
        self._ended.add(1, {"provider": _provider(provider), "status": status, "category": category or "none"})

    def first_delta(self, ms: float, provider: str) -> None:
        """Record the time from claim to the first stored delta (given in ms, exported in seconds)."""
        self._ttfd.record(max(0.0, ms) / 1000, {"provider": _provider(provider)})

    def duration(self, ms: float, provider: str, status: str) -> None:
        """Record the time from claim to the stored terminal event (given in ms, exported in seconds)."""
        self._duration.record(max(0.0, ms) / 1000, {"provider": _provider(provider), "status": status})

    def retry(self, *, provider: str, category: str) -> None:
        """Count one upstream retry and the error category that caused it."""
        self._retries.add(1, {"provider": _provider(provider), "category": category})

    def endpoints(self, names: Iterable[str]) -> None:
        """Export the per-endpoint counters of these endpoints from the start (0)."""
        for name in names:
            self._attempts.add(0, {"endpoint": name, "category": "none"})
            self._fallbacks.add(0, {"endpoint": name, "category": "none"})
            self._cooldowns.add(0, {"endpoint": name})

    def attempt_ended(self, endpoint: str, category: str | None) -> None:
        """Count one upstream attempt on ``endpoint``, by the category it failed with (``none``: it did not)."""
        self._attempts.add(1, {"endpoint": endpoint, "category": category or "none"})

    def fallback(self, endpoint: str, category: str) -> None:
        """Count one job leaving ``endpoint`` for the next endpoint of its route, after ``category``."""
        self._fallbacks.add(1, {"endpoint": endpoint, "category": category})

    def cooldown(self, endpoint: str) -> None:
        """Count one cooldown of ``endpoint`` started."""
        self._cooldowns.add(1, {"endpoint": endpoint})

    def redis_error(self, exc: BaseException) -> None:
        """Count one Redis error by kind (:func:`infra.otel_setup.redis_error_kind`)."""
        self._redis_errors.add(1, {"kind": redis_error_kind(exc)})
