"""The memory budgets of SSE readers whose clients stopped reading: one per reader, one in all.

An SSE response writes in slices (:data:`publisher.live.session.WRITE_SLICE_BYTES`); while one
slice waits for its client, the response holds what it was writing: the history page (its
entries, their frames and the joined frames), the page read ahead, its queued live entries,
and the socket's unsent buffer. Each waiting slice is a :class:`Waiting` that carries an
estimate of those bytes, split into what may be shared with other readers (a page they
replay too: counted once, by the identity of its bytes) and what is the reader's own.

* A reader holding more than ``FANOUT_READER_BUDGET_BYTES`` whose slice has waited
  ``FANOUT_READER_STALL_MS`` is dropped (``reader``).
* When all waiting readers together hold more than ``FANOUT_READERS_BUDGET_BYTES``, the
  ones that have waited longest are dropped until the rest fit (``total``), at once.

Dropping resets the connection (``SO_LINGER`` 0, :func:`reset_on_close`: what the kernel
still held for the client is freed at once, not sent over minutes to a client that does
not read); the client resumes with ``Last-Event-ID`` (the events it
has not received are read again from Redis) and loses nothing. No Redis, no aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from publisher.history.entries import Entry
    from publisher.telemetry import Telemetry

ENTRY_BYTES: Final = 256
"""Estimated memory of one stored entry held by a reader beside its frame (the ``Entry`` and its
strings), bytes; measured with ``tracemalloc`` over a replayed page (bench/fair_share_bench.py)."""


def reset_on_close(transport: asyncio.BaseTransport | None) -> None:
    """Make closing ``transport``'s socket send a reset and free its unsent bytes (``SO_LINGER`` 0).

    Without it, a socket closed with bytes still unsent stays in the kernel, those bytes
    with it, until a client that stopped reading takes them or the kernel gives up. Does
    nothing when the transport has no socket (closed already).
    """
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def page_bytes(entries: Sequence[Entry]) -> int:
    """Return the estimated memory of a page of entries: their frames plus :data:`ENTRY_BYTES` each."""
    return sum([len(entry.frame) for entry in entries]) + ENTRY_BYTES * len(entries)


class Waiting:
    """One slice of a response waiting for its client, and what the response holds meanwhile.

    Args:
        drop: Aborts the response's connection.
        shared: The object shared with other readers (the bytes being written).
        shared_bytes: Estimated memory that comes with ``shared`` (counted once however many
            readers hold it), bytes.
        own_bytes: Estimated memory only this reader holds, bytes.
    """

    __slots__ = ("drop", "own_bytes", "shared", "shared_bytes", "since", "timer")

    def __init__(self, drop: Callable[[], None], shared: object, shared_bytes: int, own_bytes: int) -> None:
        self.drop, self.shared, self.shared_bytes, self.own_bytes = drop, shared, shared_bytes, own_bytes
        self.since = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None

    @property
    def held(self) -> int:
        """Estimated memory this reader holds while it waits, bytes."""
        return self.shared_bytes + self.own_bytes


class ReaderBudget:
    """Tracks the readers waiting on their clients and drops those past a budget.

    Args:
        reader_bytes: ``FANOUT_READER_BUDGET_BYTES``.
        total_bytes: ``FANOUT_READERS_BUDGET_BYTES``.
        stall_s: ``FANOUT_READER_STALL_MS``, in seconds.
        telemetry: Receives ``stalled_bytes`` and counts ``budget_drops``.
    """

    def __init__(self, reader_bytes: int, total_bytes: int, stall_s: float, telemetry: Telemetry) -> None:
        self.reader_bytes, self.total_bytes, self.stall_s = reader_bytes, total_bytes, stall_s
        self._telemetry = telemetry
        self._waiting: dict[Waiting, None] = {}
        """Insertion order: the slice waiting longest first."""
        self._shared: dict[int, list[int]] = {}
        """``id(shared)`` → ``[waiting slices holding it, its bytes]``."""
        self.total = 0
        """Estimated memory of every waiting reader, shared objects once, bytes."""
        self.dropped = {"reader": 0, "total": 0}
        """Readers dropped so far, by the budget they were past."""

    def begin(self, drop: Callable[[], None], shared: object, shared_bytes: int, own_bytes: int) -> Waiting:
        """Register a slice about to wait for its client; call :meth:`end` when the wait ends, however.

        May drop readers at once (the ones waiting longest) to bring the total under its
        budget, this one too when it waits longest; schedules this one's drop after the
        stall time when it alone holds more than its budget.
        """
        waiting = Waiting(drop, shared, shared_bytes, own_bytes)
        self._waiting[waiting] = None
        self._count(waiting, 1)
        if waiting.held > self.reader_bytes:
            waiting.timer = asyncio.get_running_loop().call_later(self.stall_s, self._overdue, waiting)
        while self.total > self.total_bytes and self._waiting:
            self._drop(next(iter(self._waiting)), "total")
        return waiting

    def end(self, waiting: Waiting) -> None:
        """Unregister a slice whose wait ended (written, failed, or dropped); once is enough."""
        if waiting in self._waiting:
            del self._waiting[waiting]
            self._count(waiting, -1)
        if waiting.timer is not None:
            waiting.timer.cancel()
            waiting.timer = None

    def waiting(self) -> int:
        """Return how many slices wait for their clients now."""
        return len(self._waiting)

    def _overdue(self, waiting: Waiting) -> None:
        """Drop a reader over its own budget whose slice still waits after the stall time."""
        waiting.timer = None
        if waiting in self._waiting:
            self._drop(waiting, "reader")

    def _drop(self, waiting: Waiting, budget: str) -> None:
        self.end(waiting)
        self.dropped[budget] += 1
        self._telemetry.budget_drops.add(1, {"budget": budget})
        waiting.drop()

    def _count(self, waiting: Waiting, sign: int) -> None:
        """Add (``sign`` 1) or remove (-1) a slice's bytes, its shared object's only for the first or last holder."""
        key = id(waiting.shared)
        entry = self._shared.get(key)
        if entry is None:
            entry = self._shared[key] = [0, waiting.shared_bytes]
            self.total += waiting.shared_bytes
        entry[0] += sign
        if entry[0] <= 0:
            del self._shared[key]
            self.total -= entry[1]
        self.total += sign * waiting.own_bytes
        self._telemetry.stalled_bytes = self.total
