"""A job's attempts over its route: each endpoint's retry policy, then the next endpoint, before any content.

The job's targets are the endpoints of its route in order (one for a job that names an
endpoint, or without an upstreams file). The process's :class:`~worker.router.Router`
plans them (cooling endpoints last) and holds a slot of the endpoint in use. On an
endpoint, attempts retry as before (tenacity: at most ``max_retries`` more, full-jitter
backoff or the provider's ``Retry-After`` capped at ``retry_after_max_s``) while only
``stream.start`` is stored and the attempt's terminal error is retryable; when they are
spent, or when the endpoint just started cooling down and another one remains, the job
falls back to the next endpoint with a fresh pipeline (the stored ``stream.start`` is not
repeated). After the first content is stored nothing is retried and nothing falls back:
the stream ends as the attempt ends it. When no endpoint is left, the last failure is
stored; its ``stream.error`` names the endpoint that produced it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_random_exponential

from schema.contract import StreamError
from schema.errors import FanoutError, UpstreamTimeoutError
from worker.attempt import Attempt, AttemptHost, AttemptLimits, RetryAttempt
from worker.job_storage import JobStorage
from worker.routing import OnFull
from worker.upstream import UpstreamRequest

log = logging.getLogger("fanout.worker.job")


class RouteTarget:
    """One endpoint a job may be sent to.

    Args:
        name: The endpoint's name (cooldowns, slots, metrics, spans).
        model: The model or deployment name sent to it.
        build: Returns its request for the job. Raises
            :class:`~schema.errors.FanoutError` when it cannot be built (stored as the
            stream's error).
        limits: Its deadlines; default the worker's settings.
        stamped: Whether terminal events name it (``endpoint``, contract 1.1): only with
            an upstreams file.
    """

    __slots__ = ("build", "limits", "model", "name", "stamped")

    def __init__(self, *, name: str, model: str, build: Callable[[], UpstreamRequest],
                 limits: AttemptLimits | None = None, stamped: bool = True) -> None:
        self.name, self.model, self.build, self.limits, self.stamped = name, model, build, limits, stamped

    @property
    def endpoint(self) -> str | None:
        """The name terminal events carry, or ``None``."""
        return self.name if self.stamped else None


class RouteRun(JobStorage):
    """The attempts of one job over its route (the base of :class:`worker.job_run.JobRun`, an :class:`AttemptHost`)."""

    total_at: float
    _attempts: int
    _target: RouteTarget | None = None
    _cooled = False
    _left = 0

    async def _run_route(self, targets: Sequence[RouteTarget], on_full: OnFull = "fallback") -> None:
        """Try the targets as the router plans them until one ends the stream; store the last failure."""
        router, names = self.ctx.router, [target.name for target in targets]
        by_name = {target.name: target for target in targets}
        tried: list[str] = []
        last: RetryAttempt | None = None
        while last is None or time.monotonic() < self.total_at:
            try:
                name = await router.take(names, tried, on_full, self.stopper, self.total_at)
            except UpstreamTimeoutError:
                break  # no slot before the job's total deadline
            if name is None:
                break
            tried.append(name)
            try:
                await self._run_endpoint(by_name[name], left=len(names) - len(tried))
                return
            except RetryAttempt as failure:
                last = failure
                self._fell_back(name, failure, more=len(tried) < len(names))
            finally:
                router.give(name)
        if last is not None:
            await self._append(last.events)
        else:
            await self._write_error(FanoutError(
                f"no free slot (max_concurrency) of endpoint {', '.join(names)} within the total time limit",
                category="timeout", retryable=True))

    def _fell_back(self, name: str, failure: RetryAttempt, *, more: bool) -> None:
        if more:
            self.telemetry.fallback(name, failure.error.category)
            log.info("event=upstream_fallback stream_id=%s endpoint=%s category=%s", self.job.stream_id, name,
                     failure.error.category)

    async def _run_endpoint(self, target: RouteTarget, *, left: int) -> None:
        """Run the endpoint's attempts under its retry policy.

        Raises:
            RetryAttempt: Its retries are spent (or it started cooling and ``left`` > 0), with
                nothing but ``stream.start`` stored.
        """
        try:
            request = target.build()
        except FanoutError as exc:  # the job's request cannot be sent there as is
            await self._write_error(exc)
            return
        self._target, self._cooled, self._left = target, False, left
        retrying = AsyncRetrying(
            stop=self._no_more_retries, wait=self._backoff, retry=retry_if_exception_type(RetryAttempt),
            sleep=self.stopper.sleep, before_sleep=self._before_retry, reraise=True,
        )
        await retrying(self._attempt, request)

    async def _attempt(self, request: UpstreamRequest) -> None:
        target = self._target
        assert target is not None
        self._attempts += 1
        try:
            host: AttemptHost = self  # type: ignore[assignment] # JobRun completes the protocol
            pipeline = await Attempt(host, request, self._attempts, endpoint=target.endpoint,
                                     limits=target.limits).run()
        except RetryAttempt as failure:
            self._attempt_failed(target, failure)
            raise
        terminal = pipeline.terminal
        self.telemetry.attempt_ended(target.name, terminal.error.category if isinstance(terminal, StreamError)
                                     else None)
        if pipeline.adapter.norm.deltas_emitted:
            self.ctx.router.succeeded(target.name)

    def _attempt_failed(self, target: RouteTarget, failure: RetryAttempt) -> None:
        category = failure.error.category
        self.telemetry.attempt_ended(target.name, category)
        until = self.ctx.router.failed(target.name, category, failure.retry_after_s)
        if until is not None:
            self._cooled = True
            self.telemetry.cooldown(target.name)
            log.info("event=endpoint_cooldown endpoint=%s category=%s cooldown_s=%.3f", target.name, category,
                     until - self.ctx.router.clock())

    def _no_more_retries(self, state: RetryCallState) -> bool:
        late = time.monotonic() + (state.upcoming_sleep or 0.0) >= self.total_at
        spent = state.attempt_number > self.settings.max_retries
        return spent or late or self.stopper.reason is not None or (self._cooled and self._left > 0)

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
        log.info("event=upstream_retry stream_id=%s endpoint=%s attempt=%d category=%s delay_s=%.3f",
                 self.job.stream_id, self._target.name if self._target else "-", state.attempt_number, category,
                 state.upcoming_sleep)
