"""The worker process's run loop: take as many jobs as there are free slots, run them, drain.

Intake: one reader task per jobs stream in use (the shards and the legacy stream,
:meth:`worker.intake.Intake.streams`, re-read every ``SHARD_REFRESH_S``), each on its own
connection while it blocks. While slots are free a reader first takes over jobs of dead
workers (``XAUTOCLAIM``, min-idle = the lease), else waits for new ones (``XREADGROUP COUNT
<free> BLOCK <block_ms>``). Several readers may return at once: entries beyond the free
slots are released at once (``XCLAIM ... IDLE <lease>``), so the next ``XAUTOCLAIM`` of any
worker takes them and ``concurrency`` is never exceeded. An entry of a job already running
here (handed back by ``XAUTOCLAIM``, or delivered again by a group recreated at id 0) is not
started a second time. An idle worker thus sends two
commands per stream per ``block_ms`` (docs/architecture.md, "Sharded jobs"). Each job runs as its own
task (:class:`~worker.job_run.JobRun`). One
Pub/Sub subscription stops cancelled jobs (:mod:`worker.cancel`). An entry whose job
cannot run is acked, after ending its stream ``failed`` when it names one
(:mod:`worker.jobentry`).

Shutdown (SIGTERM, :meth:`Worker.run`'s ``stop`` event): take no new jobs; give background
streams with stored content back at once (stopped and released as below, so a successor
re-attaches, :mod:`worker.reattach`); let other running streams finish for up to ``drain_s``;
then stop the rest WITHOUT writing a terminal event
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
import redis.exceptions

from infra.redis_client import REDIS_ERRORS, RedisClient
from infra.redis_faults import fault_fields, fault_kind, redis_error_fields
from infra.storage import RetryPolicy
from schema.keys import Keys
from schema.upstreams import Upstreams
from worker.appender import Appender
from worker.background import drain_handing_over
from worker.cancel import CancelListener
from worker.compactor import Compactor
from worker.intake import SHARD_REFRESH_S, Intake, JobEntry, consumer_name
from worker.job_run import JobContext, JobRun
from worker.jobentry import decode_entry
from worker.lease import Leases
from worker.router import Router, cooldown_policy
from worker.settings import WorkerSettings
from worker.targets import slot_limits
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

    def __init__(self, redis: RedisClient, keys: Keys, ctx: JobContext) -> None:
        self.redis, self.keys, self.ctx = redis, keys, ctx
        self.consumer = ctx.leases.consumer
        self.settings = ctx.settings
        self.intake = Intake(redis, keys, consumer=self.consumer, lease_s=self.settings.lease_s,
                             shards=self.settings.job_shards)
        self.cancels = CancelListener(redis, keys, self._on_cancel)
        self.runs: dict[str, JobRun] = {}
        """Running jobs by entry id."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()
        self.ready = asyncio.Event()
        """Set once the group exists and the cancel subscription is active."""

    @classmethod
    def create(
        cls, redis: RedisClient, keys: Keys, settings: WorkerSettings, *, session: aiohttp.ClientSession,
        credentials: Credentials | None = None, telemetry: Telemetry | None = None, consumer: str | None = None,
        clock_ms: Callable[[], int] | None = None, upstreams: Upstreams | None = None,
    ) -> Worker:
        """Wire a worker from its parts (consumer name default :func:`worker.intake.consumer_name`).

        ``upstreams`` routes jobs over the upstreams file's endpoints, with the slots their
        ``max_concurrency`` gives (default: the endpoints of today's variables).
        """
        name = consumer or consumer_name()
        retry = RetryPolicy(window_s=settings.append_retry_window_s, base_s=settings.append_retry_base_s,
                            max_delay_s=settings.append_retry_max_delay_s)
        telemetry = telemetry or Telemetry()
        telemetry.endpoints(upstreams.endpoints if upstreams else ())
        appender = Appender(redis, keys, stream_ttl_s=settings.stream_ttl_s, tombstone_ttl_s=settings.tombstone_ttl_s,
                            done_maxlen=settings.done_maxlen, retry=retry, on_retry=telemetry.append_retry,
                            wait_replicas=settings.terminal_wait_replicas, wait_ms=settings.terminal_wait_ms,
                            live_max_bytes=settings.live_max_bytes, live_pubsub=settings.live_pubsub,
                            compactor=Compactor(redis, keys, grace_s=settings.compact_grace_s,
                                                run_deltas=settings.compact_run_deltas))
        ctx = JobContext(
            settings=settings, appender=appender, leases=Leases(redis, keys, consumer=name, lease_s=settings.lease_s),
            session=session, credentials=credentials or Credentials(), telemetry=telemetry,
            clock_ms=clock_ms, upstreams=upstreams,
            router=Router(cooldown_policy(settings), slot_limits(upstreams) if upstreams else None),
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
            schema.settings.SettingsError: ``FANOUT_LIVE_PUBSUB=sharded`` where Redis cannot do it.
        """
        await self.intake.ensure_groups()
        mode = await self.ctx.appender.live()  # decided once, as the publishers decide it
        listener = asyncio.create_task(self.cancels.run())
        sweeper = asyncio.create_task(self._sweep_loop(stop), name="compaction-sweep")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.cancels.ready.wait(), timeout=5.0)
        self.ready.set()
        log.info("event=worker_start consumer=%s concurrency=%d live_pubsub=%s", self.consumer,
                 self.settings.concurrency, mode)
        try:
            await self._intake_loop(stop)
            await self._drain()
        finally:
            for task in (listener, sweeper):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        log.info("event=worker_stop consumer=%s", self.consumer)

    async def _sweep_loop(self, stop: asyncio.Event) -> None:
        """Compact the finished streams whose grace ended, every ``FANOUT_COMPACT_SWEEP_S``."""
        compactor = self.ctx.appender.compactor
        if compactor is None or compactor.grace_s < 0:
            return
        while not stop.is_set():
            try:
                await compactor.sweep()
            except REDIS_ERRORS as exc:
                log.warning("event=compaction_sweep_failed %s", redis_error_fields(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.compact_sweep_s)

    async def _intake_loop(self, stop: asyncio.Event) -> None:
        """Keep one reader per jobs stream in use (re-read every SHARD_REFRESH_S) until ``stop``."""
        readers: dict[str, asyncio.Task[None]] = {}
        try:
            while not stop.is_set():
                try:
                    streams = await self.intake.streams()
                except redis.exceptions.RedisError as exc:
                    level = logging.ERROR if fault_kind(exc) == "permanent" else logging.WARNING
                    log.log(level, "event=intake_failed %s", fault_fields(exc))
                    streams = list(readers)
                for stream in streams:
                    if stream not in readers or readers[stream].done():
                        readers[stream] = asyncio.create_task(self._read_stream(stream, stop), name=f"intake-{stream}")
                await self._pause(stop, SHARD_REFRESH_S)
        finally:
            await asyncio.gather(*readers.values(), return_exceptions=True)

    async def _read_stream(self, stream: str, stop: asyncio.Event) -> None:
        """Reader of one jobs stream: reclaim, else block for new entries; start what fits, release the rest.

        Ends with ``stop``, or when the stream is no longer served (the legacy ``P:jobs``, once deleted).
        """
        while not stop.is_set() and self.intake.serves(stream):
            if self.free_slots <= 0:
                await self._wait_for_slot(stop)
                continue
            try:
                entries = await self._next_entries(stream)
            except redis.exceptions.RedisError as exc:
                self.ctx.telemetry.redis_error(exc)
                level = logging.ERROR if fault_kind(exc) == "permanent" else logging.WARNING
                log.log(level, "event=intake_failed stream=%s %s", stream, fault_fields(exc))
                await self._pause(stop, REDIS_RETRY_DELAY_S)
                continue
            for entry in entries:
                # Readers of other streams may have filled the slots meanwhile: an entry that no
                # longer fits is released at once (any worker's next XAUTOCLAIM takes it).
                fits = not stop.is_set() and self.free_slots > 0
                await (self._start(entry) if fits else self._release_unstarted(entry))

    async def _next_entries(self, stream: str) -> list[JobEntry]:
        taken = await self.intake.reclaim(stream, self.free_slots)
        fresh = [entry for entry in taken if entry[0] not in self.runs]
        if fresh:
            log.info("event=jobs_reclaimed stream=%s count=%d", stream, len(fresh))
            self.ctx.telemetry.jobs_reclaimed(len(fresh))
            return fresh
        if self.free_slots <= 0:  # readers of other shards filled the slots during the reclaim
            return []
        # "Never delivered" is the group's view: a group recreated at id 0 (NOGROUP) hands out again the
        # entries of jobs running here, which a second run would claim from the first (fencing it out).
        return [entry for entry in await self.intake.read_new(stream, self.free_slots, block_ms=self.settings.block_ms)
                if entry[0] not in self.runs]

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
            self.ctx.telemetry.redis_error(exc)
            log.error("event=job_redis_error stream_id=%s %s", run.job.stream_id, fault_fields(exc))
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
        pending = await drain_handing_over(self.runs, tasks, self.settings.drain_s)
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
