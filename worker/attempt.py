"""One upstream attempt of a job: send the request, pump the body through a fresh pipeline.

Each body read is raced against the job's stop signal and the soonest of three named
deadlines (:mod:`worker.control`):

* ``idle``: no byte for ``idle_timeout_s`` (the wait for the response headers gets
  ``connect_timeout_s + idle_timeout_s``, the connect itself being aiohttp's);
* ``progress``: no read that produced a contract event for ``progress_timeout_s`` (pings,
  SSE comments and ignored provider events do not count);
* ``total``: the job's overall limit.

The connect, idle and progress limits are the worker's settings, or the endpoint's own
from the upstreams file (:class:`AttemptLimits`).

Every failure becomes the pipeline's terminal event (``interrupted``/``timeout``,
``interrupted``/``transport``, or the HTTP error's category), handed to
:meth:`AttemptHost.deliver`, which stores it or raises :class:`RetryAttempt` when the
attempt may be retried.
"""

from __future__ import annotations

import time
from typing import Protocol

import aiohttp
import msgspec
from opentelemetry import trace

from schema.contract import ErrorInfo, Event
from schema.errors import UpstreamError
from schema.job import Job
from worker.control import Deadline, Stopper
from worker.pipeline import Pipeline
from worker.settings import WorkerSettings
from worker.telemetry import Telemetry
from worker.upstream import UpstreamRequest, open_stream, read_chunk


class RetryAttempt(Exception):  # noqa: N818 - a control signal for the retry loop
    """The attempt failed retryably before any output was stored; nothing of it was stored.

    Attributes:
        events: The attempt's unstored final batch (ends with its ``stream.error``); stored
            as is when no retry is left.
        error: That ``stream.error``'s error info.
        retry_after_s: The provider's ``Retry-After``, when it sent one.
    """

    def __init__(self, events: list[Event], error: ErrorInfo, retry_after_s: float | None) -> None:
        super().__init__(error.message)
        self.events, self.error, self.retry_after_s = events, error, retry_after_s


class AttemptLimits(msgspec.Struct, frozen=True, kw_only=True):
    """The deadlines of one attempt: the worker's settings, or an upstreams-file endpoint's own."""

    connect_timeout_s: float
    """TCP (and TLS) connect, seconds."""
    idle_timeout_s: float
    """No byte for this long ends the attempt ``timeout``, seconds."""
    progress_timeout_s: float
    """No contract event for this long ends the attempt ``timeout``, seconds."""

    @classmethod
    def of(cls, settings: WorkerSettings, **overrides: float | None) -> AttemptLimits:
        """Return the settings' limits with the given ones (``None``: the setting's) replaced."""
        values = {"connect_timeout_s": settings.connect_timeout_s, "idle_timeout_s": settings.idle_timeout_s,
                  "progress_timeout_s": settings.progress_timeout_s}
        values.update({name: value for name, value in overrides.items() if value is not None})
        return cls(**values)


class AttemptHost(Protocol):
    """What an attempt needs from its job run."""

    job: Job
    settings: WorkerSettings
    session: aiohttp.ClientSession
    telemetry: Telemetry
    stopper: Stopper
    total_at: float
    """Monotonic time the whole job must end by."""

    def new_pipeline(self, framing: str) -> Pipeline:
        """Return a pipeline that continues the stored seq."""

    async def deliver(self, pipeline: Pipeline, events: list[Event], *, retry_after_s: float | None = None) -> None:
        """Store ``events`` or raise :class:`RetryAttempt`."""


class Attempt:
    """One request to the provider and its body.

    Args:
        host: The job run (settings, session, stop signal, storage).
        request: The prepared provider request.
        number: 1 for the first attempt, then 2, 3, ...
        endpoint: The upstreams-file endpoint called (the span's ``fanout.endpoint``), if any.
        limits: Its deadlines; default the worker's settings.
    """

    def __init__(self, host: AttemptHost, request: UpstreamRequest, number: int, *, endpoint: str | None = None,
                 limits: AttemptLimits | None = None) -> None:
        self.host, self.request, self.number, self.endpoint = host, request, number, endpoint
        self.limits = limits or AttemptLimits.of(host.settings)

    async def run(self) -> Pipeline:
        """Run the attempt to its terminal event (stored, or raised as :class:`RetryAttempt`).

        Returns:
            The attempt's pipeline, its terminal stored.

        Raises:
            RetryAttempt: Retryable failure before any output was stored.
            worker.control.Stopped: The job was stopped; nothing more was stored.
            worker.appender.AppendRefusedError: Redis refused a batch (fenced, closed, seq).
        """
        host, job = self.host, self.host.job
        pipeline = host.new_pipeline(self.request.framing)
        await host.deliver(pipeline, pipeline.start())
        with host.telemetry.upstream_span(job.stream_id, job.provider, job.model, self.number,
                                          self.endpoint) as span:
            try:
                await self._exchange(pipeline, span)
            finally:
                host.telemetry.ignored(pipeline.adapter.ignored, job.provider)
                terminal = pipeline.terminal
                span.set_attribute("fanout.status", getattr(terminal, "status", "aborted"))
        return pipeline

    async def _exchange(self, pipeline: Pipeline, span: trace.Span) -> None:
        host, limits = self.host, self.limits
        started = time.monotonic()
        headers_by = Deadline(("idle", started + limits.connect_timeout_s + limits.idle_timeout_s),
                              ("total", host.total_at))
        opening = open_stream(host.session, self.request, connect_timeout_s=limits.connect_timeout_s)
        try:
            response = await host.stopper.race(opening, headers_by)
        except UpstreamError as exc:
            status = getattr(exc, "status", None)
            if isinstance(status, int):
                span.set_attribute("http.response.status_code", status)
            await host.deliver(pipeline, pipeline.fail(exc), retry_after_s=getattr(exc, "retry_after_s", None))
            return
        span.set_attribute("http.response.status_code", response.status)
        try:
            await self._pump(pipeline, response)
        finally:
            if response.content.at_eof():
                response.release()
            else:
                response.close()  # abort: drop the connection so the provider stops generating

    async def _pump(self, pipeline: Pipeline, response: aiohttp.ClientResponse) -> None:
        host, limits = self.host, self.limits
        progress_at = time.monotonic() + limits.progress_timeout_s
        while True:
            now = time.monotonic()
            deadline = Deadline(("idle", now + limits.idle_timeout_s), ("progress", progress_at),
                                ("total", host.total_at))
            try:
                chunk = await host.stopper.race(read_chunk(response), deadline)
            except UpstreamError as exc:
                await host.deliver(pipeline, pipeline.fail(exc))
                return
            events = pipeline.feed(chunk) if chunk else pipeline.finish()
            await host.deliver(pipeline, events)
            if events:  # counted after the store, so time waiting out a Redis fault is not the provider's
                progress_at = time.monotonic() + limits.progress_timeout_s
            if pipeline.terminal is not None or not chunk:
                return

