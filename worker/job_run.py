"""One job from claim to ack: decide by what is stored, run the attempts, keep the lease.

At the claim (a new fencing token, :mod:`worker.lease`) the stored stream decides:

==========================  ===============================================================
found                       does
==========================  ===============================================================
stream done / tombstone     XACK, nothing else
cancel flag set             ``stream.error`` ``cancelled`` (after ``stream.start`` if none), XACK
meta ``bg_id``              a background response: re-attached (:mod:`worker.reattach`)
``last_seq >= 2``           a previous owner died mid-output: ``stream.error``
                            ``worker_lost`` (``interrupted``, retryable), then XACK
invalid job                 ``stream.error`` ``invalid_request`` (after ``stream.start`` if none), XACK
``last_seq`` 0 or 1         run the upstream attempts (a stored ``stream.start`` is not repeated)
==========================  ===============================================================

The attempts run over the job's route (:mod:`worker.route_run`): each endpoint's retries
(tenacity: at most ``max_retries`` more, full-jitter exponential backoff, or the
provider's ``Retry-After`` capped at ``retry_after_max_s``), then the next endpoint, only
while nothing but ``stream.start`` is stored and the attempt's terminal error is
retryable. Stopping:
``cancel`` writes ``cancelled``; ``fenced``, ``lost`` and ``shutdown`` write nothing and
leave the job pending for the next owner. The job is XACKed only after its terminal event
is stored (or found stored).

Redis faults (:mod:`infra.storage`, one table: :mod:`schema.redis_replies`): the claim,
appends, the terminal write and the ack are retried within ``FANOUT_APPEND_RETRY_S`` (at
most the lease) through connection errors and transient refusals (``BUSY``,
``NOREPLICAS``, ``LOADING``, ``READONLY``, ...); lease renewals that fail are tried
again every ``FANOUT_APPEND_RETRY_MAX_DELAY_S`` at most and never stop the job by
themselves (fencing at the append is the guarantee). A write Redis refuses for good
(:class:`~schema.errors.StorageRefusedError`), and a stream claimed more than
``FANOUT_MAX_CLAIMS`` times, end the stream ``failed``/``internal`` with a message naming
storage (:meth:`StreamWriter.end_refused`: the event if Redis takes it, else the
terminal status in meta and tombstone); the job is acked either way, so it never loops.
A claim Redis refuses for good (``WRONGTYPE`` on meta) is acked too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Final

from infra.redis_client import REDIS_ERRORS
from infra.redis_faults import fault_fields
from schema.contract import Event, StreamError
from schema.errors import FanoutError, StorageRefusedError
from schema.job import Job
from worker.adapters.base import Framing
from worker.appender import FencedError, SeqConflictError, StreamClosedError, StreamWriter, new_epoch
from worker.attempt import RetryAttempt
from worker.background import cancel_background, cursor_pipeline, writer_fields
from worker.control import Stopped, Stopper
from worker.job_storage import JobContext, Outcome
from worker.lease import Claim
from worker.pipeline import Pipeline, build_pipeline
from worker.reattach import reattach
from worker.route_run import RouteRun, RouteTarget
from worker.routing import OnFull
from worker.targets import job_targets

log = logging.getLogger("fanout.worker.job")

FRAMINGS: Final[dict[str, Framing]] = {"sse": "sse", "json_array": "json_array", "eventstream": "eventstream"}
"""A request's framing name → the pipeline's framing."""

__all__ = ["JobContext", "JobRun", "Outcome"]


class JobRun(RouteRun):
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

    async def run(self) -> Outcome:
        """Claim the stream and run the job to its outcome.

        Raises:
            redis.exceptions.RedisError: Redis failed during the claim (the job stays pending).
        """
        job = self.job
        claim = await self._claim()
        if isinstance(claim, Claim) and claim.duplicate_of:
            claim = await self._duplicate(claim.duplicate_of)
        if not isinstance(claim, Claim):
            return claim
        if claim.done:  # its writer may have died before scheduling the compaction: schedule it (NX) again
            if self.ctx.appender.compactor is not None:
                await self.ctx.appender.compactor.schedule(job.stream_id)
            await self._ack()
            self.telemetry.job_ended("skipped")
            return "skipped"
        self.token = claim.token
        self.writer = self._open_writer(claim)
        outcome = await self._run_leased(claim)
        terminal = self.writer.terminal
        self.telemetry.job_ended(outcome)
        log.info("event=job_end stream_id=%s provider=%s outcome=%s status=%s attempts=%d", job.stream_id,
                 job.provider, outcome, terminal.status if terminal else "-", self._attempts)
        return outcome

    def _open_writer(self, claim: Claim) -> StreamWriter:
        """Return the writer of the claimed stream; nothing stored yet starts a new generation (epoch)."""
        job = self.job
        epoch = new_epoch() if claim.last_seq == 0 else claim.epoch  # nothing stored: a new generation
        writer = self.ctx.appender.writer(job.stream_id, token=claim.token, last_seq=claim.last_seq,
                                          provider=job.provider, model=job.model, started_ms=claim.started_ms,
                                          epoch=epoch)
        writer.sleep = self._storage_sleep
        return writer

    async def _run_leased(self, claim: Claim) -> Outcome:
        """Drive the job inside its span while a task keeps the lease; stop renewing at the end."""
        assert self.writer is not None
        lease = asyncio.create_task(self._keep_lease())
        with self.telemetry.job_span(self.job) as span, self.telemetry.job_running():
            try:
                outcome = await self._drive(claim)
            finally:
                lease.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await lease
            terminal = self.writer.terminal
            span.set_attribute("fanout.status", terminal.status if terminal else outcome)
        return outcome

    async def _drive(self, claim: Claim) -> Outcome:
        """Run the job's body and turn how it ended (a stop, a refusal, a failure) into the outcome."""
        try:
            if not await self._body_unless_stopped(claim):
                return "abandoned"
        except StreamClosedError:
            pass  # finished by someone else: nothing may follow its terminal
        except (SeqConflictError, FencedError) as exc:
            return await self._append_refused(exc)
        except StorageRefusedError as exc:
            return await self._end_refused(exc.reason)
        except REDIS_ERRORS as exc:
            self.telemetry.redis_error(exc)
            log.error("event=redis_error stream_id=%s action=leave_pending %s", self.job.stream_id,
                      fault_fields(exc))
            return "abandoned"
        except Exception:
            log.exception("event=job_crashed stream_id=%s", self.job.stream_id)
            return await self._write_internal_error()
        return await self._ack_done()

    async def _body_unless_stopped(self, claim: Claim) -> bool:
        """Run the body; a cancel writes ``cancelled``; any other stop returns False (the job stays pending)."""
        try:
            await self._body(claim)
        except Stopped as stopped:
            if stopped.reason != "cancel":
                log.info("event=job_stopped stream_id=%s reason=%s", self.job.stream_id, stopped.reason)
                return False
            await cancel_background(self)
            await self._write_error(FanoutError("the client cancelled the stream", category="cancelled"))
        return True

    async def _write_internal_error(self) -> Outcome:
        try:
            await self._write_error(FanoutError("internal error in the worker", category="internal"))
            await self._ack()
        except Exception:  # Redis or the writer is unusable: leave the job to be reclaimed
            log.exception("event=internal_error_unwritten stream_id=%s", self.job.stream_id)
            return "abandoned"
        return "done"

    async def _body(self, claim: Claim) -> None:
        if await self.ctx.leases.is_cancelled(self.job.stream_id):
            raise Stopped("cancel")
        if self.token > self.settings.max_claims:
            raise StorageRefusedError("claimed too often", reason=(
                f"the stream was claimed {self.token} times without finishing (limit FANOUT_MAX_CLAIMS="
                f"{self.settings.max_claims})"))
        if claim.last_seq >= 1 and await reattach(self, claim.last_seq):
            return
        if claim.last_seq >= 2:
            message = "the worker running this stream stopped mid-output"
            await self._write_error(FanoutError(message, category="worker_lost", retryable=True))
            return
        if self.problem is not None:
            await self._write_error(FanoutError(self.problem, category="invalid_request"))
            return
        try:
            targets, on_full = self._targets()
        except FanoutError as exc:  # no endpoint can serve the job as it is (invalid_request)
            await self._write_error(exc)
            return
        await self._run_route(targets, on_full)

    def _targets(self) -> tuple[list[RouteTarget], OnFull]:
        """Return the endpoints the job may go to, in route order, and its route's rule for a full one.

        Raises:
            FanoutError: ``invalid_request``: an unknown endpoint, one that does not speak the
                job's API, or a model that is no route with no default endpoint.
        """
        ctx = self.ctx
        return job_targets(self.job, ctx.upstreams, self.settings, ctx.credentials, ctx.authorizer)

    # -- storage (AttemptHost) --------------------------------------------------

    def new_pipeline(self, framing: str) -> Pipeline:
        """Return a pipeline for one attempt that continues the stored seq (0 or 1)."""
        assert self.writer is not None
        job = self.job
        target = self._target
        endpoint = target.endpoint if target else None
        self._pipeline = build_pipeline(
            provider=job.provider, framing=FRAMINGS.get(framing, "sse"),
            stream_id=job.stream_id, model=job.model, clock=self.ctx.clock_ms, metadata=job.metadata,
            reasoning_visibility=job.reasoning_visibility, stored_seq=self.writer.last_seq,
            max_frame_bytes=self.settings.max_frame_bytes, epoch=self.writer.epoch,
            endpoint=endpoint, upstream_model=target.model if target and endpoint else None,
        )
        if target and self.ctx.upstreams.endpoints[target.name].background:
            self._pipeline = cursor_pipeline(self._pipeline, max_frame_bytes=self.settings.max_frame_bytes)
        return self._pipeline

    async def deliver(self, pipeline: Pipeline, events: list[Event], *, retry_after_s: float | None = None) -> None:
        """Store one batch, unless it ends the attempt in a retryable error before any output.

        Raises:
            RetryAttempt: The batch ends with a retryable ``stream.error``, only
                ``stream.start`` is stored and the attempt emitted no delta.
        """
        assert self.writer is not None
        self.writer.background = writer_fields(pipeline, self._target.name) if self._target else None
        last = events[-1] if events else None
        if (isinstance(last, StreamError) and last.error.retryable and self.writer.last_seq <= 1
                and pipeline.adapter.norm.deltas_emitted == 0):
            raise RetryAttempt(events, last.error, retry_after_s)
        await (self._append(events) if events else self.writer.note_background())

