"""One job from claim to ack: decide by what is stored, run the attempts, keep the lease.

At the claim (a new fencing token, :mod:`worker.lease`) the stored stream decides:

==========================  ===============================================================
found                       does
==========================  ===============================================================
stream done / tombstone     XACK, nothing else
cancel flag set             ``stream.error`` ``cancelled`` (after ``stream.start`` if none), XACK
``last_seq >= 2``           a previous owner died mid-output: ``stream.error`` ``worker_lost``
                            (``interrupted``, retryable), then XACK
invalid job                 ``stream.error`` ``invalid_request`` (after ``stream.start`` if none), XACK
``last_seq`` 0 or 1         run the upstream attempts (a stored ``stream.start`` is not repeated)
==========================  ===============================================================

Attempts retry (tenacity: at most ``max_retries`` more, full-jitter exponential backoff,
or the provider's ``Retry-After`` capped at ``retry_after_max_s``) only while nothing but
``stream.start`` is stored and the attempt's terminal error is retryable. Stopping:
``cancel`` writes ``cancelled``; ``fenced``, ``lost`` and ``shutdown`` write nothing and
leave the job pending for the next owner. The job is XACKed only after its terminal event
is stored (or found stored).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Literal

import aiohttp
import redis.exceptions
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_random_exponential

from schema.contract import ErrorInfo, Event, StreamDone, StreamError
from schema.errors import FanoutError
from schema.job import Job
from worker.appender import Appender, FencedError, SeqConflictError, StreamClosedError, StreamWriter
from worker.attempt import Attempt, RetryAttempt
from worker.control import Stopped, Stopper
from worker.error_policy import STATUS_OF_CATEGORY, safe_message
from worker.lease import Claim, Leases
from worker.normalizer import Normalizer
from worker.pipeline import Pipeline, build_pipeline
from worker.settings import WorkerSettings
from worker.telemetry import Telemetry
from worker.upstream import Credentials, UpstreamRequest, build_request

log = logging.getLogger("fanout.worker.job")

Outcome = Literal["done", "skipped", "abandoned"]
"""``done``: terminal stored and acked; ``skipped``: already finished, acked;
``abandoned``: stopped without a terminal, left pending for another owner."""


class JobContext:
    """What every job of one worker process shares.

    Args:
        settings: The worker's settings.
        appender: Fenced appends.
        leases: Claims, renewals, acks.
        session: The aiohttp client session for providers.
        credentials: Provider API keys.
        telemetry: Spans and metrics.
        clock_ms: Wall clock in ms since the epoch (event ``ts``).
    """

    def __init__(
        self, *, settings: WorkerSettings, appender: Appender, leases: Leases, session: aiohttp.ClientSession,
        credentials: Credentials, telemetry: Telemetry, clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.settings, self.appender, self.leases, self.session = settings, appender, leases, session
        self.credentials, self.telemetry = credentials, telemetry
        self.clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)


class JobRun:
    """Runs one claimed job; :meth:`stop` may be called from outside at any time.

    Args:
        ctx: The process's shared context.
        entry_id: The job's entry id in the jobs stream.
        job: The decoded job (a stub naming only its stream when ``problem`` is set).
        problem: Why the job cannot run (:func:`worker.jobentry.decode_entry`), or ``None``.
    """

    def __init__(self, ctx: JobContext, entry_id: str, job: Job, *, problem: str | None = None) -> None:
        self.ctx, self.entry_id, self.job, self.problem = ctx, entry_id, job, problem
        self.settings, self.session, self.telemetry = ctx.settings, ctx.session, ctx.telemetry
        self.stopper = Stopper()
        self.total_at = time.monotonic() + ctx.settings.total_timeout_s
        self.writer: StreamWriter | None = None
        self.token = 0
        self._pipeline: Pipeline | None = None
        self._claim_ms = 0
        self._attempts = 0

    def stop(self, reason: Literal["cancel", "fenced", "lost", "shutdown"]) -> None:
        """Stop the job: abort its upstream request; ``cancel`` then writes ``cancelled``."""
        self.stopper.stop(reason)

    async def run(self) -> Outcome:
        """Claim the stream and run the job to its outcome.

        Raises:
            redis.exceptions.RedisError: Redis failed during the claim (the job stays pending).
        """
        job = self.job
        self._claim_ms = self.ctx.clock_ms()
        claim = await self.ctx.leases.claim(stream_id=job.stream_id, provider=job.provider, model=job.model,
                                            entry_id=self.entry_id, now_ms=self._claim_ms)
        if claim.done:
            await self.ctx.leases.ack(self.entry_id)
            self.telemetry.job_ended("skipped")
            return "skipped"
        self.token = claim.token
        self.writer = self.ctx.appender.writer(job.stream_id, token=claim.token, last_seq=claim.last_seq,
                                               provider=job.provider, model=job.model, started_ms=claim.started_ms)
        lease = asyncio.create_task(self._keep_lease())
        with self.telemetry.job_span(job) as span, self.telemetry.job_running():
            try:
                outcome = await self._drive(claim)
            finally:
                lease.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await lease
            terminal = self.writer.terminal
            span.set_attribute("fanout.status", terminal.status if terminal else outcome)
        self.telemetry.job_ended(outcome)
        log.info("event=job_end stream_id=%s provider=%s outcome=%s status=%s attempts=%d", job.stream_id,
                 job.provider, outcome, terminal.status if terminal else "-", self._attempts)
        return outcome

    async def _drive(self, claim: Claim) -> Outcome:
        try:
            try:
                await self._body(claim)
            except Stopped as stopped:
                if stopped.reason != "cancel":
                    log.info("event=job_stopped stream_id=%s reason=%s", self.job.stream_id, stopped.reason)
                    return "abandoned"
                await self._write_error(FanoutError("the client cancelled the stream", category="cancelled"))
        except StreamClosedError:
            pass  # finished by someone else: nothing may follow its terminal
        except (FencedError, SeqConflictError) as exc:
            log.warning("event=append_refused stream_id=%s error=%s", self.job.stream_id, type(exc).__name__)
            return "abandoned"
        except redis.exceptions.RedisError as exc:
            self.telemetry.redis_error(exc)
            log.error("event=redis_error stream_id=%s error=%s", self.job.stream_id, type(exc).__name__)
            return "abandoned"
        except Exception:
            log.exception("event=job_crashed stream_id=%s", self.job.stream_id)
            return await self._write_internal_error()
        await self.ctx.leases.ack(self.entry_id)
        return "done"

    async def _write_internal_error(self) -> Outcome:
        try:
            await self._write_error(FanoutError("internal error in the worker", category="internal"))
            await self.ctx.leases.ack(self.entry_id)
        except Exception:  # Redis or the writer is unusable: leave the job to be reclaimed
            log.exception("event=internal_error_unwritten stream_id=%s", self.job.stream_id)
            return "abandoned"
        return "done"

    async def _body(self, claim: Claim) -> None:
        if await self.ctx.leases.is_cancelled(self.job.stream_id):
            raise Stopped("cancel")
        if claim.last_seq >= 2:
            message = "the worker running this stream stopped mid-output"
            await self._write_error(FanoutError(message, category="worker_lost", retryable=True))
            return
        if self.problem is not None:
            await self._write_error(FanoutError(self.problem, category="invalid_request"))
            return
        try:
            request = build_request(self.job, self.settings, self.ctx.credentials)
        except FanoutError as exc:  # the job's request cannot be sent as is (invalid_request)
            await self._write_error(exc)
            return
        await self._run_attempts(request)

    # -- attempts ---------------------------------------------------------------

    async def _run_attempts(self, request: UpstreamRequest) -> None:
        retrying = AsyncRetrying(
            stop=self._no_more_retries, wait=self._backoff, retry=retry_if_exception_type(RetryAttempt),
            sleep=self.stopper.sleep, before_sleep=self._before_retry, reraise=True,
        )
        try:
            await retrying(self._attempt, request)
        except RetryAttempt as last:
            await self._append(last.events)

    async def _attempt(self, request: UpstreamRequest) -> None:
        self._attempts += 1
        await Attempt(self, request, self._attempts).run()

    def _no_more_retries(self, state: RetryCallState) -> bool:
        late = time.monotonic() + (state.upcoming_sleep or 0.0) >= self.total_at
        return state.attempt_number > self.settings.max_retries or late or self.stopper.reason is not None

    def _backoff(self, state: RetryCallState) -> float:
        failure = state.outcome.exception() if state.outcome else None
        if isinstance(failure, RetryAttempt) and failure.retry_after_s is not None:
            return min(failure.retry_after_s, self.settings.retry_after_max_s)
        jitter = wait_random_exponential(multiplier=self.settings.backoff_base_s, max=self.settings.backoff_max_s)
        return float(jitter(state))

    def _before_retry(self, state: RetryCallState) -> None:
        failure = state.outcome.exception() if state.outcome else None
        category = failure.error.category if isinstance(failure, RetryAttempt) else "internal"
        self.telemetry.retry(provider=self.job.provider, category=category)
        log.info("event=upstream_retry stream_id=%s attempt=%d category=%s delay_s=%.3f", self.job.stream_id,
                 state.attempt_number, category, state.upcoming_sleep)

    # -- storage (AttemptHost) --------------------------------------------------

    def new_pipeline(self, framing: str) -> Pipeline:
        """Return a pipeline for one attempt that continues the stored seq (0 or 1)."""
        assert self.writer is not None
        job = self.job
        self._pipeline = build_pipeline(
            provider=job.provider, framing="json_array" if framing == "json_array" else "sse",
            stream_id=job.stream_id, model=job.model, clock=self.ctx.clock_ms, metadata=job.metadata,
            reasoning_visibility=job.reasoning_visibility, stored_seq=self.writer.last_seq,
            max_frame_bytes=self.settings.max_frame_bytes,
        )
        return self._pipeline

    async def deliver(self, pipeline: Pipeline, events: list[Event], *, retry_after_s: float | None = None) -> None:
        """Store one batch, unless it ends the attempt in a retryable error before any output.

        Raises:
            RetryAttempt: The batch ends with a retryable ``stream.error``, only
                ``stream.start`` is stored and the attempt emitted no delta.
        """
        assert self.writer is not None
        last = events[-1] if events else None
        if (isinstance(last, StreamError) and last.error.retryable and self.writer.last_seq <= 1
                and pipeline.adapter.norm.deltas_emitted == 0):
            raise RetryAttempt(events, last.error, retry_after_s)
        await self._append(events)

    async def _append(self, events: list[Event]) -> None:
        assert self.writer is not None
        had_delta = self.writer.first_delta_ms is not None
        await self.writer.append(events)
        if not events:
            return
        provider = self.job.provider
        self.telemetry.events_appended(len(events), provider)
        if not had_delta and self.writer.first_delta_ms is not None:
            self.telemetry.first_delta(self.writer.first_delta_ms - self._claim_ms, provider)
        last = events[-1]
        if isinstance(last, StreamDone | StreamError):
            category = last.error.category if isinstance(last, StreamError) else None
            self.telemetry.terminal(provider=provider, status=last.status, category=category)
            self.telemetry.duration(last.ts - self._claim_ms, provider, last.status)

    async def _write_error(self, error: FanoutError) -> None:
        assert self.writer is not None
        if self.writer.terminal is None:
            await self._append(self._error_events(error))

    def _error_events(self, error: FanoutError) -> list[Event]:
        assert self.writer is not None
        if self.writer.last_seq == 0:  # no adapter: the job's provider may be one this worker lacks
            job = self.job
            norm = Normalizer(stream_id=job.stream_id, provider=job.provider, model=job.model, clock=self.ctx.clock_ms,
                              metadata=job.metadata, reasoning_visibility=job.reasoning_visibility)
            norm.start()
            norm.fail(category=error.category, message=error.message, retryable=error.retryable)
            return norm.take()
        info = ErrorInfo(category=error.category, retryable=error.retryable, provider_code=None,
                         message=safe_message(error.message))
        usage = self._pipeline.adapter.norm.usage if self._pipeline else None
        return [StreamError(
            stream_id=self.job.stream_id, seq=self.writer.last_seq + 1, ts=self.ctx.clock_ms(),
            status=STATUS_OF_CATEGORY.get(error.category, "failed"), error=info, usage=usage, finish_reason=None,
        )]

    # -- lease ------------------------------------------------------------------

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_renew_s)
            try:
                outcome = await self.ctx.leases.renew(entry_id=self.entry_id, stream_id=self.job.stream_id,
                                                      token=self.token)
            except redis.exceptions.RedisError as exc:
                self.telemetry.redis_error(exc)
                log.warning("event=lease_renew_failed stream_id=%s error=%s", self.job.stream_id, type(exc).__name__)
                continue
            if outcome == "cancel":
                self.stop("cancel")
            elif outcome != "ok":
                log.warning("event=lease_lost stream_id=%s outcome=%s", self.job.stream_id, outcome)
                self.stop(outcome)
                return
