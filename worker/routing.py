"""Routing of one job over its route's endpoints: the cooldown table, the route plan, the slot counts.

The rules (docs/upstreams.md, "Fallback, cooldown and concurrency"):

* **Cooldown.** An endpoint that refused with ``Retry-After`` (a ``rate_limited`` or
  ``upstream_overloaded`` failure: HTTP 429, 503, 529) cools down for that long, at most
  ``max_cooldown_s``; one that failed retryably ``after_failures`` times in a row cools
  down for ``failure_cooldown_s``. A success (an attempt that stored content) clears its
  count and its cooldown. Cooling again never shortens a cooldown already running.
* **Plan.** The endpoints not yet tried by this job, in route order, those not cooling
  first; cooling ones follow, soonest-ready first. So a cooling endpoint is skipped while
  others remain, and is still the last resort (tried at once, never waited for).
* **Slots.** An endpoint's ``max_concurrency`` attempts at once at most; :func:`pick`
  says which planned endpoint may start now.

All of it is per worker process (nothing is shared through Redis). Pure: times are
monotonic seconds passed in by the caller; imports no asyncio, aiohttp, redis or
opentelemetry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Literal

import msgspec

from schema.contract import ErrorCategory

OnFull = Literal["fallback", "wait"]
"""What a job does when its planned endpoint has no free slot: take the next planned one
that has one (``fallback``), or wait for a slot of the planned one (``wait``)."""

REFUSAL_CATEGORIES: Final[frozenset[ErrorCategory]] = frozenset({"rate_limited", "upstream_overloaded"})
"""Failures whose ``Retry-After`` cools the endpoint down (HTTP 429, 503, 529)."""


class CooldownPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """When an endpoint cools down, and for how long (from the worker's settings)."""

    after_failures: int = 3
    """Retryable failures in a row that cool an endpoint down (0: never for that reason)."""
    failure_cooldown_s: float = 30.0
    """Cooldown after ``after_failures`` failures in a row, seconds."""
    max_cooldown_s: float = 300.0
    """Longest cooldown a ``Retry-After`` sets, seconds."""


class CooldownTable:
    """Which endpoints are cooling down, until when (monotonic seconds), and their failures in a row.

    Args:
        policy: The cooldown rules.
    """

    __slots__ = ("_failures", "_until", "policy")

    def __init__(self, policy: CooldownPolicy | None = None) -> None:
        self.policy = policy or CooldownPolicy()
        self._until: dict[str, float] = {}
        self._failures: dict[str, int] = {}

    def failed(self, name: str, *, now: float, category: ErrorCategory, retry_after_s: float | None) -> float | None:
        """Record one retryable failure of endpoint ``name``; return the end of its cooldown, if one starts.

        Args:
            name: The endpoint.
            now: Monotonic seconds.
            category: The failure's contract category.
            retry_after_s: The provider's ``Retry-After`` (seconds), when it sent one.

        Returns:
            The monotonic time the endpoint cools down until, or ``None`` (no cooldown).
        """
        policy = self.policy
        count = self._failures.get(name, 0) + 1
        self._failures[name] = count
        if retry_after_s is not None and retry_after_s > 0 and category in REFUSAL_CATEGORIES:
            until = now + min(retry_after_s, policy.max_cooldown_s)
        elif policy.after_failures and count >= policy.after_failures:
            until = now + policy.failure_cooldown_s
        else:
            return None
        self._failures[name] = 0
        until = max(until, self._until.get(name, until))  # a second cooldown never shortens the first
        self._until[name] = until
        return until

    def succeeded(self, name: str) -> None:
        """Record that endpoint ``name`` answered with content: no failures in a row, no cooldown."""
        self._failures.pop(name, None)
        self._until.pop(name, None)

    def cooling_until(self, name: str, now: float) -> float | None:
        """Return when endpoint ``name``'s cooldown ends, or ``None`` when it is not cooling at ``now``."""
        until = self._until.get(name)
        if until is None:
            return None
        if until <= now:
            del self._until[name]
            return None
        return until

    def failures(self, name: str) -> int:
        """Return endpoint ``name``'s retryable failures in a row (since its last cooldown or success)."""
        return self._failures.get(name, 0)


class Step(msgspec.Struct, frozen=True, gc=False):
    """One endpoint of a job's plan."""

    endpoint: str
    """The endpoint's name."""
    cooling_until: float | None = None
    """Monotonic seconds its cooldown ends at, when it is cooling; ``None`` when it is not."""


def plan_route(endpoints: Sequence[str], cooldowns: CooldownTable, now: float, *,
               tried: Sequence[str] = ()) -> list[Step]:
    """Return the order in which the route's untried endpoints are to be tried.

    Args:
        endpoints: The route's endpoint names, in the route's order (no duplicates).
        cooldowns: The process's cooldown table.
        now: Monotonic seconds.
        tried: Endpoints this job already tried; left out.

    Returns:
        Endpoints not cooling (route order), then cooling ones by the end of their
        cooldown (ties in route order); empty when every endpoint was tried. A cooling
        endpoint is not waited for: when it is planned first, the job tries it at once
        and its retry policy honours the provider's ``Retry-After``.
    """
    ready: list[Step] = []
    cooling: list[tuple[float, int, str]] = []
    for order, name in enumerate(endpoints):
        if name in tried:
            continue
        until = cooldowns.cooling_until(name, now)
        if until is None:
            ready.append(Step(name))
        else:
            cooling.append((until, order, name))
    return ready + [Step(name, until) for until, _order, name in sorted(cooling)]


class SlotTable:
    """Attempts running per endpoint against its ``max_concurrency``.

    Args:
        limits: Endpoint name → its ``max_concurrency``; a name not listed (or ``None``)
            has no limit.
    """

    __slots__ = ("_in_use", "limits")

    def __init__(self, limits: Mapping[str, int | None]) -> None:
        self.limits = {name: limit for name, limit in limits.items() if limit is not None}
        self._in_use: dict[str, int] = {}

    def free(self, name: str) -> bool:
        """Whether endpoint ``name`` has a free slot."""
        limit = self.limits.get(name)
        return limit is None or self._in_use.get(name, 0) < limit

    def take(self, name: str) -> None:
        """Hold one slot of ``name`` (the caller checked :meth:`free`)."""
        self._in_use[name] = self._in_use.get(name, 0) + 1

    def give(self, name: str) -> None:
        """Give back one slot of ``name``."""
        left = self._in_use.get(name, 0) - 1
        if left > 0:
            self._in_use[name] = left
        else:
            self._in_use.pop(name, None)

    def in_use(self, name: str) -> int:
        """Slots of ``name`` held now."""
        return self._in_use.get(name, 0)


def pick(steps: Sequence[Step], slots: SlotTable, on_full: OnFull) -> str | None:
    """Return the endpoint a job may start on now (its slot still to take), or ``None`` to wait.

    Args:
        steps: The job's plan (:func:`plan_route`), non-empty.
        slots: The process's slot table.
        on_full: The route's rule when the first step has no free slot.

    Returns:
        The first step's endpoint when it has a free slot; else, with ``fallback``, the
        next step with a free slot (one that is not cooling, unless the first one is
        cooling too); ``None`` when the job must wait for a slot of the first step.
    """
    first = steps[0]
    if slots.free(first.endpoint):
        return first.endpoint
    if on_full == "fallback":
        for step in steps[1:]:
            if (step.cooling_until is None or first.cooling_until is not None) and slots.free(step.endpoint):
                return step.endpoint
    return None
