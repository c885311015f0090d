"""The worker process's routing state: one cooldown table and one slot table, and the waits for a slot.

The rules are :mod:`worker.routing`'s (pure); this module holds their one instance per
worker process (``JobContext.router``), reads the monotonic clock for them, and parks a
job whose planned endpoint has no free slot until one is given back (or its total
deadline passes, or it is stopped). Nothing here is shared between processes: each
worker keeps its own cooldowns and counts its own slots (docs/upstreams.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence

from schema.contract import ErrorCategory
from worker.control import Deadline, Stopper
from worker.routing import CooldownPolicy, CooldownTable, OnFull, SlotTable, Step, pick, plan_route
from worker.settings import WorkerSettings


def cooldown_policy(settings: WorkerSettings) -> CooldownPolicy:
    """Return the cooldown rules the worker's settings give (``FANOUT_COOLDOWN_*``)."""
    return CooldownPolicy(after_failures=settings.cooldown_after_failures,
                          failure_cooldown_s=settings.cooldown_failure_s, max_cooldown_s=settings.cooldown_max_s)


class Router:
    """Cooldowns and endpoint slots of one worker process.

    Args:
        policy: When endpoints cool down.
        limits: Endpoint name → ``max_concurrency`` (``None`` or absent: no limit).
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(self, policy: CooldownPolicy | None = None, limits: Mapping[str, int | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cooldowns = CooldownTable(policy)
        self.slots = SlotTable(limits or {})
        self.clock = clock
        self._freed = asyncio.Event()

    def plan(self, endpoints: Sequence[str], tried: Sequence[str] = ()) -> list[Step]:
        """Return the job's plan now (:func:`worker.routing.plan_route`)."""
        return plan_route(endpoints, self.cooldowns, self.clock(), tried=tried)

    async def take(self, endpoints: Sequence[str], tried: Sequence[str], on_full: OnFull, stopper: Stopper,
                   total_at: float) -> str | None:
        """Take a slot of the endpoint the job tries next, waiting for one when the route says so.

        Args:
            endpoints: The route's endpoints, in order.
            tried: Those the job already tried (left out).
            on_full: The route's rule when the planned endpoint is full (:func:`worker.routing.pick`).
            stopper: The job's stop signal.
            total_at: Monotonic time the whole job must end by.

        Returns:
            The endpoint whose slot is now held (give it back with :meth:`give`), or ``None``
            when every endpoint was tried.

        Raises:
            worker.control.Stopped: The job was stopped while waiting.
            schema.errors.UpstreamTimeoutError: ``kind="total"``: no slot before ``total_at``.
        """
        while True:
            steps = self.plan(endpoints, tried)
            if not steps:
                return None
            name = pick(steps, self.slots, on_full)
            if name is not None:
                self.slots.take(name)
                return name
            await stopper.race(self._freed.wait(), Deadline(("total", total_at)))

    def give(self, name: str) -> None:
        """Give back a slot of ``name`` and wake the jobs waiting for one (they look again)."""
        self.slots.give(name)
        freed, self._freed = self._freed, asyncio.Event()
        freed.set()

    def failed(self, name: str, category: ErrorCategory, retry_after_s: float | None) -> float | None:
        """Record a retryable failure of ``name``; return the end of the cooldown it started, if any."""
        return self.cooldowns.failed(name, now=self.clock(), category=category, retry_after_s=retry_after_s)

    def succeeded(self, name: str) -> None:
        """Record that ``name`` answered with content (clears its failures and cooldown)."""
        self.cooldowns.succeeded(name)
