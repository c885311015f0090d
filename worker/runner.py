"""The worker process's run loop: take as many jobs as there are free slots, run them, drain.

Loop: while running and slots are free, first take over jobs of dead workers
(``XAUTOCLAIM``, min-idle = the lease), else wait for new ones (``XREADGROUP COUNT <free>
BLOCK <block_ms>``); each job runs as its own task (:class:`~worker.job_run.JobRun`). One
Pub/Sub subscription stops cancelled jobs (:mod:`worker.cancel`). An entry whose job
cannot run is acked, after ending its stream ``failed`` when it names one
(:mod:`worker.jobentry`).

Shutdown (SIGTERM, :meth:`Worker.run`'s ``stop`` event): take no new jobs; let running
streams finish for up to ``drain_s``; then stop the rest WITHOUT writing a terminal event
and release their pending entries (meta ``token`` check, then ``XCLAIM ... IDLE <lease>
JUSTID`` on the jobs stream: :meth:`worker.lease.Leases.release`), so another worker
reclaims them at once and either retries (only ``stream.start`` stored) or writes
``worker_lost``. Why no terminal: this process cannot know whether a successor would
have been able to retry, and a pending entry is exactly the state a crash leaves, so
the crash path (tested) is the only recovery path. Entries read after the stop began
are released unstarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import aiohttp
import redis.asyncio as aioredis
import redis.exceptions

from schema.keys import Keys
from worker.appender import Appender
from worker.cancel import CancelListener
from worker.intake import Intake, JobEntry, consumer_name
from worker.job_run import JobContext, JobRun
from worker.jobentry import decode_entry
from worker.lease import Leases
from worker.settings import WorkerSettings
from worker.telemetry import Telemetry
from worker.upstream import Credentials

log = logging.getLogger("fanout.worker")

STOP_GRACE_S = 5.0
"""After ``drain_s``, how long stopped jobs get to close their upstream before being cancelled."""
REDIS_RETRY_DELAY_S = 1.0
"""Pause of the intake loop after a Redis error."""


class Worker:
    """One worker process: a consumer of the ``workers`` group running up to N jobs at once.

    Args:
        redis: asyncio client (``decode_responses`` off).
        keys: Key layout (tests pass a unique prefix).
        ctx: Shared job context (settings, appender, leases, session, telemetry); its
            ``leases`` name this process's consumer.
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys, ctx: JobContext) -> None:
        self.redis, self.keys, self.ctx = redis, keys, ctx
        self.consumer = ctx.leases.consumer
        self.settings = ctx.settings
        self.intake = Intake(redis, keys, consumer=self.consumer, lease_s=self.settings.lease_s)
        self.cancels = CancelListener(redis, keys, self._on_cancel)
        self.runs: dict[str, JobRun] = {}
        """Running jobs by entry id."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()
        self.ready = asyncio.Event()
        """Set once the group exists and the cancel subscription is active."""

    @classmethod
    def create(
        cls, redis: aioredis.Redis, keys: Keys, settings: WorkerSettings, *, session: aiohttp.ClientSession,
        credentials: Credentials | None = None, telemetry: Telemetry | None = None, consumer: str | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> Worker:
        """Wire a worker from its parts (consumer name default :func:`worker.intake.consumer_name`)."""
        name = consumer or consumer_name()
        appender = Appender(redis, keys, stream_ttl_s=settings.stream_ttl_s, tombstone_ttl_s=settings.tombstone_ttl_s,
                            done_maxlen=settings.done_maxlen, live_max_bytes=settings.live_max_bytes)
        ctx = JobContext(
            settings=settings, appender=appender, leases=Leases(redis, keys, consumer=name, lease_s=settings.lease_s),
            session=session, credentials=credentials or Credentials(), telemetry=telemetry or Telemetry(),
            clock_ms=clock_ms,
        )
        return cls(redis, keys, ctx)

    @property
    def free_slots(self) -> int:
        """How many more jobs this process may start now."""
        return self.settings.concurrency - len(self._tasks)

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then drain and return.

        Raises:
            redis.exceptions.RedisError: Redis unreachable when creating the group.
        """
        await self.intake.ensure_group()
        listener = asyncio.create_task(self.cancels.run())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.cancels.ready.wait(), timeout=5.0)
        self.ready.set()
        log.info("event=worker_start consumer=%s concurrency=%d", self.consumer, self.settings.concurrency)
        try:
            await self._intake_loop(stop)
            await self._drain()
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        log.info("event=worker_stop consumer=%s", self.consumer)

    async def _intake_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self.free_slots <= 0:
                await self._wait_for_slot(stop)
                continue
            try:
                entries = await self._next_entries()
            except redis.exceptions.RedisError as exc:
                log.error("event=intake_failed error=%s", type(exc).__name__)
                await self._pause(stop, REDIS_RETRY_DELAY_S)
                continue
            for entry in entries:
                await (self._release_unstarted(entry) if stop.is_set() else self._start(entry))

    async def _next_entries(self) -> list[JobEntry]:
        taken = await self.intake.reclaim(self.free_slots)
        fresh = [entry for entry in taken if entry[0] not in self.runs]
        if fresh:
            log.info("event=jobs_reclaimed count=%d", len(fresh))
            return fresh
        return await self.intake.read_new(self.free_slots, block_ms=self.settings.block_ms)

    async def _wait_for_slot(self, stop: asyncio.Event) -> None:
        self._slot_freed.clear()
        waiters = [asyncio.ensure_future(self._slot_freed.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _pause(self, stop: asyncio.Event, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=seconds)

    async def _start(self, entry: JobEntry) -> None:
        entry_id, raw = entry
        job, problem = decode_entry(raw)
        if job is None:
            log.error("event=job_undecodable entry_id=%s error=%s action=ack", entry_id, problem)
            await self.ctx.leases.ack(entry_id)
            return
        if problem is not None:
            log.error("event=job_invalid entry_id=%s stream_id=%s error=%s action=fail_stream", entry_id,
                      job.stream_id, problem)
        run = JobRun(self.ctx, entry_id, job, problem=problem)
        self.runs[entry_id] = run
        task = asyncio.create_task(self._run_job(run), name=f"job-{job.stream_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_job(self, run: JobRun) -> None:
        outcome = "abandoned"
        try:
            outcome = await run.run()
        except redis.exceptions.RedisError as exc:
            log.error("event=job_redis_error stream_id=%s error=%s", run.job.stream_id, type(exc).__name__)
        except Exception:
            log.exception("event=job_failed stream_id=%s", run.job.stream_id)
        finally:
            self.runs.pop(run.entry_id, None)
            self._slot_freed.set()
        if outcome == "abandoned" and run.stopper.reason == "shutdown":
            with contextlib.suppress(redis.exceptions.RedisError):
                await self.ctx.leases.release(entry_id=run.entry_id, stream_id=run.job.stream_id, token=run.token)

    async def _release_unstarted(self, entry: JobEntry) -> None:
        with contextlib.suppress(redis.exceptions.RedisError):
            await self.ctx.leases.release(entry_id=entry[0])

    def _on_cancel(self, stream_id: str) -> None:
        for run in list(self.runs.values()):
            if run.job.stream_id == stream_id:
                log.info("event=cancel_requested stream_id=%s", stream_id)
                run.stop("cancel")

    async def _drain(self) -> None:
        tasks = set(self._tasks)
        if not tasks:
            return
        log.info("event=drain_start running=%d drain_s=%.1f", len(tasks), self.settings.drain_s)
        _done, pending = await asyncio.wait(tasks, timeout=self.settings.drain_s)
        if not pending:
            return
        log.warning("event=drain_expired stopping=%d action=leave_pending", len(pending))
        for run in list(self.runs.values()):
            run.stop("shutdown")
        _done, pending = await asyncio.wait(pending, timeout=STOP_GRACE_S)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
