"""The storage side of a job run: the claim, appends, the terminal on failure, the ack, the lease.

:class:`JobStorage` is the base of :class:`worker.job_run.JobRun`; it holds what touches
Redis for one job once it is claimed, and the Redis fault rules (:mod:`infra.storage`):
writes are retried within ``FANOUT_APPEND_RETRY_S`` (at most the lease), lease renewals
that fail are tried again soon and never stop the job by themselves (the append's token
check is the guarantee), and a write Redis refuses for good ends the stream
``failed``/``internal`` (:meth:`JobStorage._end_refused`) and acks the job.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Literal

import aiohttp
import redis.exceptions

from infra.redis_client import REDIS_ERRORS
from infra.redis_faults import fault_fields, redis_error_fields
from infra.storage import fault_kind, with_retry
from schema.contract import ErrorInfo, Event, StreamDone, StreamError
from schema.errors import FanoutError, StorageRefusedError
from schema.job import Job
from schema.upstreams import Upstreams
from worker.appender import Appender, FencedError, SeqConflictError, StreamClosedError, StreamWriter
from worker.auth import Authorizer
from worker.control import Stopped, Stopper
from worker.error_policy import STATUS_OF_CATEGORY, safe_message
from worker.lease import Claim, Leases
from worker.normalizer import Normalizer
from worker.pipeline import Pipeline
from worker.router import Router, cooldown_policy
from worker.settings import WorkerSettings
from worker.telemetry import Telemetry
from worker.upstream import Credentials, upstreams_of

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
        credentials: Endpoint secrets.
        telemetry: Spans and metrics.
        upstreams: Endpoints and routes (the upstreams file, else the default endpoints of ``settings``).
        clock_ms: Wall clock in ms since the epoch (event ``ts``).
        router: The process's cooldowns and endpoint slots; default one with no slot
            limits and the settings' cooldown policy.
    """

    def __init__(
        self, *, settings: WorkerSettings, appender: Appender, leases: Leases, session: aiohttp.ClientSession,
        credentials: Credentials, telemetry: Telemetry, clock_ms: Callable[[], int] | None = None,
        upstreams: Upstreams | None = None, router: Router | None = None,
    ) -> None:
        self.settings, self.appender, self.leases, self.session = settings, appender, leases, session
        self.credentials, self.telemetry = credentials, telemetry
        self.upstreams = upstreams or upstreams_of(settings)
        self.authorizer = Authorizer(credentials)
        """Google tokens and AWS signers, shared by the jobs of the process."""
        self.clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self.router = router or Router(cooldown_policy(settings))


class JobStorage:
    """Redis writes of one claimed job (the base of :class:`worker.job_run.JobRun`)."""

    ctx: JobContext
    job: Job
    entry_id: str
    settings: WorkerSettings
    telemetry: Telemetry
    stopper: Stopper
    writer: StreamWriter | None
    token: int
    _pipeline: Pipeline | None
    _claim_ms: int

    def stop(self, reason: Literal["cancel", "fenced", "lost", "shutdown"]) -> None:
        """Stop the job: abort its upstream request; ``cancel`` then writes ``cancelled``."""
        self.stopper.stop(reason)

    # -- claim ------------------------------------------------------------------

    async def _duplicate(self, other: str) -> Claim | Outcome:
        """Ack this entry, a repeat of the job another entry (``other``) runs, or claim if ``other`` is gone.

        A job ``XADD`` re-sent after its reply was lost stores the job twice; claiming the
        second entry would fence the healthy run of the first one and end its stream
        ``worker_lost``. Only when ``other`` is no longer pending (nobody owns the stream)
        does this entry take the stream over.
        """
        if await self.ctx.leases.is_pending(other):
            log.warning("event=duplicate_job stream_id=%s job=%s runs_as=%s action=ack", self.job.stream_id,
                        self.entry_id, other)
            await self._ack()
            return "skipped"
        return await self._claim(force=True)

    async def _claim(self, *, force: bool = False) -> Claim | Outcome:
        """Claim the stream, retried like a write (:func:`infra.storage.with_retry`).

        A retried claim whose first try was applied only moves the token one further (the
        claim count then includes it). A claim Redis refuses for good (``WRONGTYPE`` on
        meta) acks the job (``skipped``); a shutdown while retrying leaves it pending
        (``abandoned``); a transient or pressure fault past the window raises.

        Raises:
            redis.exceptions.RedisError: Redis still failing past the window (the job stays pending).
        """
        job = self.job
        self._claim_ms = self.ctx.clock_ms()
        try:
            return await with_retry(
                lambda: self.ctx.leases.claim(stream_id=job.stream_id, provider=job.provider, model=job.model,
                                              entry_id=self.entry_id, now_ms=self._claim_ms, force=force),
                policy=self.ctx.appender.retry, sleep=self._storage_sleep, what="claim", stream_id=job.stream_id)
        except Stopped:
            return "abandoned"
        except StorageRefusedError as exc:
            cause = exc.__cause__
            if cause is not None and fault_kind(cause) != "permanent":
                raise cause from None  # OOM past the window: leave the job pending, as Redis being down does
            log.error("event=claim_refused stream_id=%s action=ack", job.stream_id)
            await self._ack()
            return "skipped"

    # -- writes -----------------------------------------------------------------

    async def _ack(self) -> None:
        """``XACK`` the job, retried like an append (a lost ack would only cost a later skip)."""
        await with_retry(lambda: self.ctx.leases.ack(self.entry_id), policy=self.ctx.appender.retry,
                         sleep=asyncio.sleep, what="ack", stream_id=self.job.stream_id)

    async def _ack_done(self) -> Outcome:
        try:
            await self._ack()
        except (redis.exceptions.RedisError, StorageRefusedError) as exc:
            log.error("event=ack_failed stream_id=%s %s", self.job.stream_id, redis_error_fields(exc))
        return "done"

    async def _storage_sleep(self, seconds: float) -> None:
        """Wait between write retries; a job fenced, lost or shut down stops waiting (a cancel does not)."""
        if self.stopper.reason not in (None, "cancel"):
            raise Stopped(self.stopper.reason)
        await asyncio.sleep(seconds)

    async def _end_after_loss(self, stored_seq: int) -> Outcome:
        """Redis lost events this job stored (a failover): end the stream right after them, then ack."""
        assert self.writer is not None
        lost = f"{stored_seq + 1}..{self.writer.last_seq}"
        log.error("event=storage_lost_events stream_id=%s seqs=%s", self.job.stream_id, lost)
        reason = f"Redis lost events {lost} of this stream (a failover before they were replicated)"
        return await self._end_refused(reason, jump=True, retryable=True)

    async def _append_refused(self, exc: SeqConflictError | FencedError) -> Outcome:
        """End the stream after Redis lost this writer's events, else leave the job to the stream's owner."""
        if isinstance(exc, SeqConflictError):
            if self.writer is not None and exc.stored_seq < self.writer.last_seq:
                return await self._end_after_loss(exc.stored_seq)
            log.warning("event=append_refused stream_id=%s error=SeqConflictError message=\"%s\"", self.job.stream_id,
                        exc)
            return "abandoned"
        log.warning("event=append_refused stream_id=%s error=%s message=\"%s\"", self.job.stream_id,
                    type(exc).__name__, exc)
        return "abandoned"

    async def _end_refused(self, reason: str, *, jump: bool = False, retryable: bool = False) -> Outcome:
        """End the stream ``failed``/``internal`` after Redis refused its writes for good, then ack."""
        assert self.writer is not None
        message = f"storage error: {reason}; the stream cannot be stored further"
        error = FanoutError(message, category="internal", retryable=retryable)
        try:
            stored = await self.writer.end_refused(self._error_events(error), jump=jump)
        except (StreamClosedError, FencedError) as exc:
            log.warning("event=storage_end_skipped stream_id=%s error=%s", self.job.stream_id, type(exc).__name__)
            return "abandoned" if isinstance(exc, FencedError) else await self._ack_done()
        except REDIS_ERRORS as exc:
            log.error("event=storage_end_failed stream_id=%s %s", self.job.stream_id, redis_error_fields(exc))
            return "abandoned"
        log.error("event=stream_ended_by_storage stream_id=%s stored=%s reason=\"%s\"", self.job.stream_id,
                  stored, reason)
        self.telemetry.terminal(provider=self.job.provider, status="failed", category="internal")
        return await self._ack_done()

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
                              metadata=job.metadata, reasoning_visibility=job.reasoning_visibility,
                              epoch=self.writer.epoch)
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
        failures = 0
        while True:
            renew_s = self.settings.lease_renew_s
            await asyncio.sleep(min(renew_s, self.ctx.appender.retry.delay_s(failures)) if failures else renew_s)
            try:
                outcome = await self.ctx.leases.renew(entry_id=self.entry_id, stream_id=self.job.stream_id,
                                                      token=self.token)
            except REDIS_ERRORS as exc:  # keep going: the append's token check decides
                failures += 1
                self.telemetry.redis_error(exc)
                log.warning("event=lease_renew_failed stream_id=%s try=%d %s", self.job.stream_id, failures,
                            fault_fields(exc))
                continue
            failures = 0
            if outcome == "cancel":
                self.stop("cancel")
            elif outcome != "ok":
                log.warning("event=lease_lost stream_id=%s outcome=%s", self.job.stream_id, outcome)
                self.stop(outcome)
                return
