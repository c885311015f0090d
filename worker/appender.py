"""Fenced, batched appends of contract events to a stream's Redis keys: one script call per batch.

The script (``EVALSHA`` of a script registered with redis-py's ``register_script``; Redis
6.2+, no Functions) runs atomically and, for a batch ``seq = f .. f+n-1``:

1. refuses unless meta ``token`` equals the caller's fencing token (:class:`FencedError`),
   meta ``state`` is not ``done`` (:class:`StreamClosedError`), meta ``epoch`` is the
   writer's for a batch after seq 1 (:class:`EpochFencedError`) and meta ``last_seq + 1 == f``
   (:class:`SeqConflictError`);
2. ``XADD <events> 0-<seq> e <json>`` for each event, in order (explicit ids, so a
   duplicate can never be stored);
3. ``HSET <meta> last_seq`` (and ``epoch`` when ``f`` is 1) and, when the batch ends with a
   terminal event, ``state=done``, ``status``, ``ended_ms``; ``EXPIRE`` events and meta
   (``stream_ttl_s``); the tombstone hash ``{last_seq, status, epoch}`` with ``EXPIRE
   tombstone_ttl_s``;
4. ``PUBLISH <live> <payload>``, or ``SPUBLISH`` on a Redis 7 cluster: the batch's events
   themselves when they fit ``live_max_bytes``, else the seq-only form (format:
   :mod:`publisher.live.notification`).

The script itself, with its arguments: :mod:`worker.append_script`. The epoch of a stream's
generation is chosen by the writer of its ``stream.start`` (:func:`new_epoch`) and carried
on that event; a later owner continues with the epoch its claim read from meta.

Which pub/sub: :func:`infra.live_pubsub.live_mode`, decided once per process (the
worker asks at startup, :meth:`Appender.live`) and passed to every call; publishers
decide the same way and subscribe accordingly. A classic ``PUBLISH`` on a cluster is
broadcast to every node over the cluster bus; ``SPUBLISH`` stays on the shard owning the
channel's slot. The script names ``SPUBLISH`` but only calls it when told, so it still
loads and runs on Redis 6.2 (Lua resolves command names when called).

Redis Cluster: the script touches only the stream's own keys, all hash-tagged
``{<stream_id>}`` and so in one slot, and every one of them is passed in ``KEYS``
(events, meta, tomb, and the live channel: not a key, but declared so the slot check
covers it; Redis Cluster slot-checks ``SPUBLISH``'s channel like a key). No key name is
built inside the Lua.

The analytics summary of a finished stream goes to ``P:done``, which lives in another
slot, so it is NOT written by the script: after the script stored a terminal event,
:meth:`StreamWriter.append` sends one plain ``XADD <done> MAXLEN ~ <done_maxlen> *`` with
the summary (:func:`summary_fields`). A crash (or a Redis error) between the two loses
only that summary line, never an event: the events, meta, tombstone and TTLs are
already stored by the script, and a reclaiming worker finds the stream done and only
acks it. A failed summary ``XADD`` is logged (``event=summary_lost``) and not raised,
because the terminal event is stored and the job must be acked.

Redis faults: each script call is retried by :func:`infra.storage.with_retry` (connection
errors, timeouts, the transient refusals of :mod:`schema.redis_replies` such as ``BUSY``
and ``NOREPLICAS``, and ``OOM``/``MISCONF`` within the window); redis-py itself may also resend a command
after a connection error. A resent call may find its first try applied. The fenced seq
check alone would then answer ``seq`` (``last_seq`` = the batch's last seq), which a
second writer holding the same token would get too; so each batch carries a random id
that the script keeps in meta ``batch``, and a call whose id is already there answers
``landed`` (after the token check): this very batch is stored, which is success. Refusals
that can never succeed raise :class:`~schema.errors.StorageRefusedError`; the job then
ends the stream through :meth:`StreamWriter.end_refused` (:mod:`worker.salvage`).

This module holds the process's :class:`Appender` (the script, TTLs and limits, the live
mode, ``WAIT`` and the summary); one stream's writes are :class:`StreamWriter`
(:mod:`worker.stream_writer`, re-exported here).

Layout and protocol: :mod:`schema.keys`. Redis command pages followed: EVALSHA, XADD, HSET,
EXPIRE, PUBLISH, SPUBLISH. The refusals (:class:`AppendRefusedError` and its subclasses) are defined
in :mod:`schema.errors` and re-exported here.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Final

import redis.exceptions
from redis.commands.core import AsyncScript

from infra.live_pubsub import LiveMode, LivePubSub, live_mode
from infra.redis_client import RedisClient
from infra.redis_faults import redis_error_fields
from infra.storage import RetryPolicy, wait_replicated
from schema.errors import (
    AppendRefusedError,
    EpochFencedError,
    FencedError,
    SeqConflictError,
    StorageRefusedError,
    StreamClosedError,
)
from schema.keys import Keys
from worker.append_script import APPEND_LUA
from worker.compactor import Compactor
from worker.salvage import Salvage
from worker.stream_writer import StreamWriter
from worker.summary import summary_fields

__all__ = [
    "APPEND_LUA",
    "AppendRefusedError",
    "Appender",
    "EpochFencedError",
    "FencedError",
    "SeqConflictError",
    "StorageRefusedError",
    "StreamClosedError",
    "StreamWriter",
    "new_epoch",
    "summary_fields",
]

log = logging.getLogger("fanout.worker.appender")

EPOCH_BYTES: Final = 5
"""Random bytes of a new epoch (10 lowercase hex digits): two generations of one stream collide
with odds of 1 in 2**40."""


def new_epoch() -> str:
    """Return a fresh epoch for a generation about to write its ``stream.start`` (contract 1.1).

    Matches :data:`schema.contract.EPOCH_PATTERN` (lowercase hex, so never a ``.``).
    """
    return secrets.token_hex(EPOCH_BYTES)


LIVE_MAX_BYTES: Final = 64 * 1024
"""Default ``FANOUT_LIVE_MAX_BYTES``: batches up to this size carry their events on the
live channel, so publishers serve them without a read."""

class Appender:
    """The process's append script and limits; makes one :class:`StreamWriter` per claimed stream.

    Args:
        redis: asyncio client (``decode_responses`` off).
        keys: Key layout of the deployment (tests pass a unique prefix).
        stream_ttl_s: TTL of a finished stream's events and meta.
        tombstone_ttl_s: TTL of its tombstone.
        done_maxlen: Approximate cap of the summaries stream.
        retry: Retry of failed script calls (:mod:`infra.storage`).
        on_retry: Called with the Redis error before each retried script call (a metric).
        wait_replicas: Replicas to ``WAIT`` for after a terminal event (0: none).
        wait_ms: Longest such ``WAIT``, ms.
        live_max_bytes: Largest batch (compact stored bytes plus one per event) whose events
            ride on the live notification; a larger batch publishes only its last seq.
        live_pubsub: ``FANOUT_LIVE_PUBSUB``, resolved by :meth:`live` on first use
            (:func:`infra.live_pubsub.live_mode`).
        compactor: Schedules the compaction of each stream this process ends.
    """

    def __init__(
        self, redis: RedisClient, keys: Keys, *, stream_ttl_s: int = 86_400,
        tombstone_ttl_s: int = 7 * 86_400, done_maxlen: int = 100_000, retry: RetryPolicy | None = None,
        on_retry: Callable[[BaseException], None] | None = None,
        wait_replicas: int = 0, wait_ms: int = 1000, live_max_bytes: int = LIVE_MAX_BYTES,
        live_pubsub: LivePubSub = "auto", compactor: Compactor | None = None,
    ) -> None:
        self.redis, self.keys = redis, keys
        self.ttls = (str(stream_ttl_s), str(tombstone_ttl_s), str(live_max_bytes))
        """``stream_ttl_s``, ``tombstone_ttl_s`` and ``live_max_bytes`` as script arguments."""
        self.done_maxlen = done_maxlen
        self.retry = retry or RetryPolicy()
        self.on_retry = on_retry
        """Called with the Redis error before each retried script call (a metric)."""
        self.wait = (wait_replicas, wait_ms)
        """``WAIT`` after a terminal: (replicas, timeout ms)."""
        self.script: AsyncScript = redis.register_script(APPEND_LUA)
        self.salvage = Salvage(redis, keys, self.ttls[:2])
        self.live_pubsub = live_pubsub
        self.live_mode: LiveMode | None = None
        """The resolved live mode once :meth:`live` ran."""
        self.compactor = compactor
        """Schedules each finished stream's compaction (:mod:`worker.compactor`); ``None``: never compact."""

    async def live(self) -> LiveMode:
        """Return the live mode, deciding it on the first call (:func:`infra.live_pubsub.live_mode`).

        The worker calls it at startup, so a deployment that cannot do what
        ``FANOUT_LIVE_PUBSUB`` asks fails then; every append reuses the answer.

        Raises:
            SettingsError: ``sharded`` asked where Redis cannot do it.
            redis.exceptions.RedisError: Redis unreachable (the next call asks again).
        """
        if self.live_mode is None:
            self.live_mode = await live_mode(self.redis, self.live_pubsub)
        return self.live_mode

    async def replicate_terminal(self, stream_id: str) -> None:
        """``WAIT`` for :attr:`wait` replicas of the stream's primary (:func:`infra.storage.wait_replicated`).

        A short count or a Redis error is logged (``event=terminal_unreplicated``), not raised.
        """
        replicas, timeout_ms = self.wait
        if not replicas:
            return
        try:
            acked = await wait_replicated(self.redis, self.keys.meta(stream_id), replicas=replicas,
                                          timeout_ms=timeout_ms)
        except redis.exceptions.RedisError as exc:
            log.warning("event=terminal_unreplicated stream_id=%s %s", stream_id, redis_error_fields(exc))
            return
        if acked < replicas:
            log.warning("event=terminal_unreplicated stream_id=%s replicas=%d wanted=%d", stream_id, acked, replicas)

    async def write_summary(self, stream_id: str, fields: list[str]) -> bool:
        """``XADD <done> MAXLEN ~ <done_maxlen> *`` one finished-stream summary (its own slot).

        Called right after the script stored the stream's terminal event. Returns False,
        after logging ``event=summary_lost``, when Redis failed: only the analytics line is
        lost, every event is already stored.
        """
        try:
            await self.redis.xadd(self.keys.done, dict(zip(fields[::2], fields[1::2], strict=True)),
                                  maxlen=self.done_maxlen, approximate=True)
        except redis.exceptions.RedisError as exc:
            log.warning("event=summary_lost stream_id=%s %s", stream_id, redis_error_fields(exc))
            return False
        return True

    def writer(
        self, stream_id: str, *, token: int, last_seq: int, provider: str = "", model: str = "",
        started_ms: int = 0, epoch: str = "",
    ) -> StreamWriter:
        """Return the writer of ``stream_id`` for the holder of fencing ``token``.

        Args:
            stream_id: The stream.
            token: The fencing token this worker got when it claimed the stream.
            last_seq: Meta ``last_seq`` read at the claim.
            provider: Provider API, for the finished-stream summary.
            model: Requested model, for the summary.
            started_ms: The stream's first claim time (meta ``started_ms``), for the summary.
            epoch: The generation written: meta ``epoch`` read at the claim, or a
                :func:`new_epoch` when nothing is stored yet ('' continues a stream
                started before contract 1.1).
        """
        return StreamWriter(self, stream_id, token=token, last_seq=last_seq, provider=provider,
                            model=model, started_ms=started_ms, epoch=epoch)
