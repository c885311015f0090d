"""OpenTelemetry for the publisher: one server span per request and the fan-out metrics.

The app takes a tracer provider and a meter provider (tests inject in-memory ones); the
CLI builds them from the standard ``OTEL_*`` variables with :func:`providers_from_env`
(:mod:`infra.otel_setup`: nothing is exported unless an exporter variable asks). Span
attributes never hold the query string (it may carry a token). The SSE span of a reader
links to the submit span of its stream (meta field ``traceparent``). Metric attribute
values come from small fixed sets (:data:`ATTRIBUTE_VALUES`), never stream ids.

Follows the OpenTelemetry semantic conventions for HTTP server spans.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Final

from opentelemetry import metrics, propagate, trace

from infra.otel_setup import REDIS_ERROR_KINDS, SECONDS_BUCKETS, Providers, redis_error_kind
from infra.otel_setup import providers_from_env as _providers_from_env

if TYPE_CHECKING:
    from publisher.history.entries import Entry
    from publisher.history.frame_cache import FrameCache

SCOPE: Final = "fanout.publisher"
"""Instrumentation scope name of the tracer and the meter."""

PHASES: Final = ("replay", "live")
GONE_CAUSES: Final = ("history-expired", "history-trimmed", "position-ahead", "history-reset")
REFUSALS: Final = ("too-many-connections", "shutting-down", "too-many-requests")
SHARE_ROUTES: Final = ("sse", "status")
ASSEMBLY_KINDS: Final = ("full", "incremental")
BUDGETS: Final = ("reader", "total")
ATTRIBUTE_VALUES: Final[dict[str, frozenset[str]]] = {
    "phase": frozenset(PHASES),
    "cause": frozenset(GONE_CAUSES),
    "reason": frozenset(REFUSALS),
    "kind": frozenset(REDIS_ERROR_KINDS) | frozenset(ASSEMBLY_KINDS),
    "route": frozenset(SHARE_ROUTES),
    "budget": frozenset(BUDGETS),
}
"""Every value an attribute of a publisher metric may take."""


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
            "fanout.sse.readers", unit="{reader}", description="Open SSE responses")
        self.delivered: dict[str, int] = dict.fromkeys(PHASES, 0)
        """Events written to SSE responses, by phase: plain ints on the hot path, read by the
        meter at each collection (an observable counter), so a delivery costs no SDK call."""
        meter.create_observable_counter(
            "fanout.sse.events.delivered", callbacks=[self._observe_delivered], unit="{event}",
            description="Events written to SSE responses, by phase")
        self._read_ahead_instruments(meter)
        self._frame_instruments(meter)
        self.latency = meter.create_histogram(
            "fanout.delivery.latency", unit="s", explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
            description="From the event's ts (worker emit time) to its write on the SSE response")
        self._response_instruments(meter)
        self.refused: dict[str, int] = dict.fromkeys(REFUSALS, 0)
        """SSE requests turned away, by reason: plain ints read by the meter, so a refusal (many a
        second under a flood of one credential's connections) costs no metrics call."""
        meter.create_observable_counter(
            "fanout.sse.refused", callbacks=[self._observe_refused], unit="{request}",
            description="SSE requests turned away (200 with only a retry: hint), by reason")
        self.redis_errors = meter.create_counter(
            "fanout.redis.errors", unit="{error}", description="Redis errors seen, by kind")
        self._fair_share_instruments(meter)
        self._start_at_zero()

    def _read_ahead_instruments(self, meter: metrics.Meter) -> None:
        """Instruments of the history pages read ahead (plain ints, read by the meter)."""
        self.read_ahead_started = 0
        """History pages read ahead: read while the page before them was written."""
        self.read_ahead_pages = 0
        """History pages read ahead and held by SSE responses (in flight, or landed and
        waiting for the write before them): a plain int, read by the meter (a gauge)."""
        self.read_ahead_dropped = 0
        """Read-ahead pages let go because the write they overlapped outlasted
        ``FANOUT_READ_AHEAD_HOLD_MS`` (each is read again after that write)."""
        meter.create_observable_counter(
            "fanout.sse.read_ahead.started", callbacks=[self._reporting("read_ahead_started")], unit="{page}",
            description="History pages read ahead, while the page before them was written")
        meter.create_observable_gauge(
            "fanout.sse.read_ahead.pages", callbacks=[self._reporting("read_ahead_pages")], unit="{page}",
            description="History pages read ahead and held by SSE responses")
        meter.create_observable_counter(
            "fanout.sse.read_ahead.dropped", callbacks=[self._reporting("read_ahead_dropped")], unit="{page}",
            description="Read-ahead pages let go: the write they overlapped outlasted the hold")

    def _frame_instruments(self, meter: metrics.Meter) -> None:
        """Instruments of the rendered-frame cache (:class:`publisher.history.frame_cache.FrameCache`)."""
        self.frames: FrameCache | None = None
        """The cache the app's store renders through; its counts are reported while it is set."""
        for name, attribute, kind, unit, description in (
                ("fanout.frames.rendered", "rendered", "counter", "{event}", "Stored events rendered to SSE frames"),
                ("fanout.frames.served", "served", "counter", "{event}", "Stored events served from the frame cache"),
                ("fanout.frames.cache.size", "bytes", "gauge", "{byte}", "Estimated memory of the frames kept")):
            create = meter.create_observable_counter if kind == "counter" else meter.create_observable_gauge
            create(name, callbacks=[self._frame_count(attribute)], unit=unit, description=description)

    def _frame_count(self, attribute: str) -> Callable[[metrics.CallbackOptions], Iterable[metrics.Observation]]:
        """Return a meter callback that reports ``attribute`` of :attr:`frames` (nothing while unset)."""
        return lambda options: [metrics.Observation(getattr(self.frames, attribute))] if self.frames is not None else []

    def _response_instruments(self, meter: metrics.Meter) -> None:
        """Counters of SSE requests and responses by how they went (resumed, 204, 410, overflow, gap)."""
        self.resumes = meter.create_counter(
            "fanout.sse.resumes", unit="{request}", description="SSE requests with a position (Last-Event-ID)")
        self.no_content = meter.create_counter(
            "fanout.sse.no_content", unit="{response}", description="204: the client holds the end")
        self.gone = meter.create_counter(
            "fanout.sse.gone", unit="{response}", description="410 answers, by cause")
        self.overflows = meter.create_counter(
            "fanout.sse.overflows", unit="{reader}", description="Readers closed for a full queue or a stalled write")
        self.gaps = meter.create_counter(
            "fanout.sse.gaps", unit="{response}", description="Responses ended by a stream.gap frame")

    def _fair_share_instruments(self, meter: metrics.Meter) -> None:
        """Instruments of the fair shares, the status results and the readers' memory budgets."""
        self.shares_refused: dict[str, int] = dict.fromkeys(SHARE_ROUTES, 0)
        """Requests refused for their credential's (or address's) limit, by route (plain ints)."""
        meter.create_observable_counter(
            "fanout.fair_share.refused", callbacks=[self._observe_shares_refused], unit="{request}",
            description="Requests refused for holding their credential's (or address's) limit, by route")
        self.status_assemblies: dict[str, int] = dict.fromkeys(ASSEMBLY_KINDS, 0)
        """Reads of stored events by the status route: ``full`` (from seq 1) or ``incremental``."""
        meter.create_observable_counter(
            "fanout.status.assemblies", callbacks=[self._observe_assemblies], unit="{assembly}",
            description="Reads of stored events by the status route, full or incremental")
        self.status_cache_bytes = 0
        """Estimated memory of the status results kept, bytes."""
        meter.create_observable_gauge(
            "fanout.status.cache.size", callbacks=[self._reporting("status_cache_bytes")], unit="{byte}",
            description="Estimated memory of the assembled status results kept")
        self.stalled_bytes = 0
        """Estimated memory held by SSE readers waiting on their clients (shared pages once), bytes."""
        meter.create_observable_gauge(
            "fanout.sse.stalled.size", callbacks=[self._reporting("stalled_bytes")], unit="{byte}",
            description="Estimated memory held by SSE readers waiting on their clients")
        self.budget_drops = meter.create_counter(
            "fanout.sse.budget_drops", unit="{reader}",
            description="Readers dropped for holding more than their memory budget, by budget")

    def _start_at_zero(self) -> None:
        """Export every counter from the start (0), so a rate is 0 rather than missing."""
        for counter in (self.open_connections, self.resumes, self.no_content, self.overflows, self.gaps):
            counter.add(0)
        for cause in GONE_CAUSES:
            self.gone.add(0, {"cause": cause})
        for budget in BUDGETS:
            self.budget_drops.add(0, {"budget": budget})
        for kind in REDIS_ERROR_KINDS:
            self.redis_errors.add(0, {"kind": kind})

    def _observe_delivered(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        """Report :attr:`delivered` to the meter (monotonic totals, one point per phase)."""
        return [metrics.Observation(count, {"phase": phase}) for phase, count in self.delivered.items()]

    def _observe_refused(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        """Report :attr:`refused` to the meter (monotonic totals, one point per reason)."""
        return [metrics.Observation(count, {"reason": reason}) for reason, count in self.refused.items()]

    def _observe_shares_refused(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        """Report :attr:`shares_refused` to the meter (monotonic totals, one point per route)."""
        return [metrics.Observation(count, {"route": route}) for route, count in self.shares_refused.items()]

    def _observe_assemblies(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        """Report :attr:`status_assemblies` to the meter (monotonic totals, one point per kind)."""
        return [metrics.Observation(count, {"kind": kind}) for kind, count in self.status_assemblies.items()]

    def _reporting(self, attribute: str) -> Callable[[metrics.CallbackOptions], Iterable[metrics.Observation]]:
        """Return a meter callback that reports the plain int ``attribute`` of this object."""
        return lambda options: [metrics.Observation(getattr(self, attribute))]

    def record_write(self, entries: list[Entry], phase: str, *, sample: bool = True) -> None:
        """Count the events of one write and record the publish-to-delivery latency of its last one.

        One latency sample per write, not per event: a live write nearly always holds one
        event, and a replayed page is one write, so the histogram costs nothing per
        replayed event.

        Args:
            entries: The entries written, in seq order, non-empty.
            phase: ``replay`` (read from history) or ``live``.
            sample: False counts the events only: a live batch written to many readers
                at once gives the histogram one sample, from its first write.
        """
        self.delivered[phase] += len(entries)
        ts_ms = entries[-1].ts_ms
        if sample and ts_ms > 0:
            self.latency.record(max(0.0, time.time() - ts_ms / 1000), {"phase": phase})

    def redis_error(self, exc: BaseException) -> None:
        """Count one Redis error by kind (:func:`infra.otel_setup.redis_error_kind`)."""
        self.redis_errors.add(1, {"kind": redis_error_kind(exc)})

    def refusal(self, slug: str) -> None:
        """Count one refused SSE request (``too-many-connections``, ``shutting-down`` or ``too-many-requests``)."""
        self.refused[slug if slug in REFUSALS else "too-many-connections"] += 1

    @staticmethod
    def link_submit(meta: Mapping[str, str]) -> None:
        """Link the current (SSE) span to the submit span whose ``traceparent`` the stream's meta holds."""
        traceparent = meta.get("traceparent")
        if not traceparent:
            return
        context = trace.get_current_span(propagate.extract({"traceparent": traceparent})).get_span_context()
        if context.is_valid:
            trace.get_current_span().add_link(context, {"fanout.link": "submit"})


def providers_from_env(environ: Mapping[str, str]) -> Providers:
    """Build the SDK providers the ``OTEL_*`` variables ask for (see :mod:`infra.otel_setup`)."""
    return _providers_from_env(environ, service_name="fanout-publisher")
