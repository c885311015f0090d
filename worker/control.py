"""Stopping a running job and bounding its waits: the stop signal and named deadlines.

Every wait on the provider (response headers, each body read, the retry backoff) is raced
against the job's :class:`Stopper` (cancel, fencing, lost lease, shutdown) and against
the soonest of its named deadlines (connect is aiohttp's own; ``idle``, ``progress`` and
``total`` are here). Waits on Redis are never interrupted this way, so a batch is never
half-known: it either returned or raised.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, Literal, TypeVar

from worker.upstream import UpstreamTimeoutError

T = TypeVar("T")

StopReason = Literal["cancel", "fenced", "lost", "shutdown"]
"""Why a job was stopped: a client's cancel (write ``cancelled``), another owner took the
stream (``fenced``/``lost``: write nothing), or the process is shutting down (write nothing)."""

TIMEOUT_MESSAGES: dict[str, str] = {
    "idle": "no bytes from the provider within the idle timeout",
    "progress": "no meaningful event from the provider within the progress timeout",
    "total": "the stream exceeded its total time limit",
}
"""Safe message of each named timeout."""


class Stopped(Exception):  # noqa: N818 - a control signal, not an error
    """Raised out of a wait when the job's :class:`Stopper` fired.

    Attributes:
        reason: The :data:`StopReason`.
    """

    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason)
        self.reason: StopReason = reason


class Deadline:
    """The soonest of several named monotonic deadlines.

    Args:
        limits: ``(name, monotonic time)`` pairs; the earliest one is the deadline.
    """

    __slots__ = ("at", "kind")

    def __init__(self, *limits: tuple[str, float]) -> None:
        self.kind, self.at = min(limits, key=lambda pair: pair[1])

    def error(self) -> UpstreamTimeoutError:
        """Return the timeout error to end the attempt with."""
        return UpstreamTimeoutError(TIMEOUT_MESSAGES.get(self.kind, f"{self.kind} timeout"), kind=self.kind)


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio never warns about it


class Stopper:
    """A one-shot stop signal for one job, and the waits that honour it."""

    def __init__(self) -> None:
        self.reason: StopReason | None = None
        self._fired: asyncio.Future[StopReason] = asyncio.get_running_loop().create_future()

    def stop(self, reason: StopReason) -> None:
        """Fire the signal (the first reason wins; later calls are ignored)."""
        if self.reason is None:
            self.reason = reason
            self._fired.set_result(reason)

    def check(self) -> None:
        """Raise :class:`Stopped` if the signal already fired."""
        if self.reason is not None:
            raise Stopped(self.reason)

    async def race(self, awaitable: Awaitable[T], deadline: Deadline) -> T:
        """Await ``awaitable`` unless the job stops or the deadline passes first.

        A result that arrives together with the stop signal is returned; the stop is
        seen by the next wait. A deadline already passed is raised before ``awaitable``
        starts, so a peer whose bytes are always ready (a flood of pings) cannot outrun
        it. The losing awaitable is cancelled.

        Raises:
            Stopped: The signal fired.
            UpstreamTimeoutError: ``deadline`` passed (``kind`` names which one).
            Exception: Whatever ``awaitable`` raised.
        """
        self.check()
        if time.monotonic() >= deadline.at:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()  # never started: no "never awaited" warning
            raise deadline.error()
        task = asyncio.ensure_future(awaitable)
        try:
            timeout = max(0.0, deadline.at - time.monotonic())
            done, _ = await asyncio.wait((task, self._fired), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
                task.add_done_callback(_consume)
        if task in done:
            return task.result()
        self.check()
        raise deadline.error()

    async def sleep(self, seconds: float) -> None:
        """Sleep unless the job stops first (then raise :class:`Stopped`)."""
        self.check()
        await asyncio.wait((self._fired,), timeout=max(0.0, seconds))
        self.check()
