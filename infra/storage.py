"""Which Redis failures a worker waits out and which end a stream, and the bounded retry of its writes.

A Redis error during a write of the worker (the claim, an append, the terminal write, an
ack) is one of three kinds, read from the one table of :mod:`schema.redis_replies` by
:func:`infra.redis_faults.classify`:

==============  ===========================================================  ======================
kind            errors                                                       handling
==============  ===========================================================  ======================
``transient``   connection refused/reset/closed, socket timeout, ``LOADING``,  retried while the
                ``BUSY``, ``NOREPLICAS``, ``MASTERDOWN``, ``READONLY``,       window lasts, then
                ``TRYAGAIN``, ``CLUSTERDOWN`` (a restart, a slow script, a    raised as is
                replica away, a failover, a resharding)
``pressure``    ``OOM`` (``maxmemory`` with ``noeviction``), ``MISCONF``        retried while the
                (a failed RDB save with ``stop-writes-on-bgsave-error``)      window lasts, then
                                                                             :class:`StorageRefusedError`
``permanent``   ``WRONGTYPE`` on one of our keys, an ``XADD`` id at or below   :class:`StorageRefusedError`
                the stream's top (a foreign entry), ``NOPERM``, an            at once
                authentication error, a code the table does not know
==============  ===========================================================  ======================

The window (:class:`RetryPolicy`) is ``FANOUT_APPEND_RETRY_S``, at most ``FANOUT_LEASE_S``:
past the lease another worker may own the stream, and its fencing token decides anyway.
Delays are full-jitter exponential (``FANOUT_APPEND_RETRY_BASE_S`` doubling up to
``FANOUT_APPEND_RETRY_MAX_DELAY_S``, never past the window's end). Retrying a script call
whose first try may have been applied is exact because the caller recognises its own
batch in the refusal (:mod:`worker.appender`); every refusal in the transient and
pressure rows comes before the script's first write (Redis checks ``NOREPLICAS``,
``READONLY``, ``OOM`` ... at the first write command of a script without flags), so a
refused call stored nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import msgspec
import redis.exceptions as rex
from redis.asyncio.cluster import RedisCluster

from infra.redis_client import REDIS_ERRORS, RedisClient
from infra.redis_faults import classify, error_code, fault_fields, fault_kind
from schema.errors import StorageRefusedError
from schema.redis_replies import FaultKind

log = logging.getLogger("fanout.worker.storage")

__all__ = ["FaultKind", "RetryPolicy", "error_code", "fault_kind", "probe_write", "refused", "storage_reason",
           "wait_replicated", "with_retry"]

T = TypeVar("T")
PROBE_TTL_MS: Final = 10_000
"""Lifetime of the readiness probe key, ms."""


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How long and how often a failed write is tried again."""

    window_s: float = 30.0
    """Longest time from a write's first failure to its last try, seconds."""
    base_s: float = 0.05
    """First backoff window; try ``n`` waits uniformly in ``[0, base * 2**(n-1)]``."""
    max_delay_s: float = 1.0
    """Upper bound of one backoff delay, seconds."""

    def delay_s(self, tries: int) -> float:
        """Return the jittered delay before try ``tries + 1`` (``tries`` >= 1 failures so far)."""
        return random.uniform(0.0, min(self.max_delay_s, self.base_s * 2 ** (tries - 1)))  # noqa: S311 - jitter


def storage_reason(exc: rex.RedisError | rex.RedisClusterException) -> str:
    """Return a short, user-safe reason for a refused write: the code, or what a foreign entry did."""
    if "equal or smaller than the target stream top item" in str(exc):
        return "an entry that fanout did not write sits above the stream's events"
    fault = classify(exc)
    if fault.code == "OOM":
        return "Redis is out of memory (maxmemory reached)"
    return f"Redis answered {fault.code}" if fault.code else f"Redis failed ({type(exc).__name__})"


def refused(exc: rex.RedisError | rex.RedisClusterException, stream_id: str) -> StorageRefusedError:
    """Return the :class:`StorageRefusedError` for a write of ``stream_id`` that cannot succeed."""
    return StorageRefusedError(f"storage refused the writes of stream {stream_id}: {storage_reason(exc)}",
                               reason=storage_reason(exc))


async def with_retry(
    call: Callable[[], Awaitable[T]], *, policy: RetryPolicy, sleep: Callable[[float], Awaitable[None]],
    what: str, stream_id: str, on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """Await ``call()`` until it answers, retrying transient and pressure faults within the window.

    Args:
        call: One try (a fresh coroutine per call); it may have been applied even when it raised.
        policy: Window and delays.
        sleep: Waits between tries (the job's, so a fenced or shut-down job stops waiting).
        what: Names the write in log lines (``append``, ``terminal``, ``ack``).
        stream_id: For log lines and the error message.
        on_retry: Called with the error before each retry (the ``fanout.append.retries`` metric).

    Returns:
        The answer of the first try that did not raise.

    Raises:
        StorageRefusedError: A permanent fault, or a pressure fault past the window.
        redis.exceptions.RedisError: A transient fault past the window (Redis still down).
    """
    tries, deadline = 0, 0.0
    while True:
        try:
            return await call()
        except REDIS_ERRORS as exc:
            fault, now = classify(exc), time.monotonic()
            tries += 1
            deadline = deadline or now + policy.window_s
            fields = f"what={what} stream_id={stream_id} try={tries} {fault_fields(exc)}"
            if fault.kind == "permanent" or (fault.kind == "pressure" and now >= deadline):
                log.error("event=storage_refused %s", fields)
                raise refused(exc, stream_id) from exc
            if now >= deadline:
                log.error("event=storage_retry_exhausted %s", fields)
                raise
            delay = min(policy.delay_s(tries), max(0.0, deadline - now))
            log.warning("event=storage_retry delay_s=%.3f %s", delay, fields)
            if on_retry is not None:
                on_retry(exc)
            await sleep(delay)


async def probe_write(client: RedisClient, key: str, *, timeout_s: float) -> None:
    """Prove Redis takes writes: ``SET <key> 1 PX`` :data:`PROBE_TTL_MS` within ``timeout_s``.

    Used by the publisher's ``/readyz`` and ``fanout health``. A PING passes on a server
    that refuses every write (``OOM`` under ``maxmemory`` with ``noeviction``, ``READONLY``
    on a replica, ``NOREPLICAS`` under ``min-replicas-to-write``, ``MISCONF`` after a
    failed save); this does not.

    Args:
        client: Any asyncio client (single node or cluster: the key has one slot).
        key: The deployment's probe key (:attr:`schema.keys.Keys.probe`).
        timeout_s: Longest wait for the answer, seconds.

    Raises:
        TimeoutError: No answer within ``timeout_s``.
        redis.exceptions.RedisError, OSError: The write was refused or Redis failed; the
            caller says why with :func:`infra.redis_faults.readiness_cause`.
    """
    async with asyncio.timeout(timeout_s):
        await client.set(key, b"1", px=PROBE_TTL_MS)


async def wait_replicated(client: RedisClient, key: str, *, replicas: int, timeout_ms: int) -> int:
    """``WAIT <replicas> <timeout_ms>`` on the primary that holds ``key``; return how many replicas acked.

    Used once per stream, after its terminal event is stored and before its job is acked
    (``FANOUT_TERMINAL_WAIT_REPLICAS``): the terminal and the ack live in different slots,
    so without it a failover could keep the ack and lose the terminal, leaving a stream
    ``running`` that no job will ever end. Follows the Redis page of WAIT (a best effort:
    a replica that acked can still lose the write if another one is promoted).

    Raises:
        redis.exceptions.RedisError: Redis failed (the caller logs it and acks anyway).
    """
    if isinstance(client, RedisCluster):  # WAIT has no key: route it to the key's primary, not to all of them
        node = client.get_node_from_key(key)
        return int(await client.execute_command("WAIT", replicas, timeout_ms, target_nodes=node))
    return int(await client.wait(replicas, timeout_ms))
