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

Layout and protocol: :mod:`schema.keys`. Redis command pages followed: EVALSHA, XADD, HSET,
EXPIRE, PUBLISH, SPUBLISH. The refusals (:class:`AppendRefusedError` and its subclasses) are defined
in :mod:`schema.errors` and re-exported here.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Final

import redis.exceptions
from redis.commands.core import AsyncScript

from infra.live_pubsub import LiveMode, LivePubSub, live_mode
from infra.redis_client import RedisClient
from infra.redis_faults import redis_error_fields
from infra.storage import RetryPolicy, wait_replicated, with_retry
from schema.contract import BlockDelta, Event, StreamDone, StreamError, encode_event, is_terminal
from schema.errors import (
    AppendRefusedError,
    EpochFencedError,
    FencedError,
    InternalError,
    SeqConflictError,
    StorageRefusedError,
    StreamClosedError,
)
from schema.keys import Keys
from worker.append_script import APPEND_LUA
from worker.salvage import Salvage
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
        live_max_bytes: Largest batch (event JSON bytes plus one per event) whose events
            ride on the live notification; a larger batch publishes only its last seq.
        live_pubsub: ``FANOUT_LIVE_PUBSUB``, resolved by :meth:`live` on first use
            (:func:`infra.live_pubsub.live_mode`).
    """

    def __init__(
        self, redis: RedisClient, keys: Keys, *, stream_ttl_s: int = 86_400,
        tombstone_ttl_s: int = 7 * 86_400, done_maxlen: int = 100_000, retry: RetryPolicy | None = None,
        on_retry: Callable[[BaseException], None] | None = None,
        wait_replicas: int = 0, wait_ms: int = 1000, live_max_bytes: int = LIVE_MAX_BYTES,
        live_pubsub: LivePubSub = "auto",
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


class StreamWriter:
    """Appends one stream's batches in seq order; created by :meth:`Appender.writer`."""

    def __init__(
        self, appender: Appender, stream_id: str, *, token: int, last_seq: int, provider: str,
        model: str, started_ms: int, epoch: str = "",
    ) -> None:
        self._appender = appender
        self.stream_id, self.token, self.last_seq = stream_id, token, last_seq
        self.epoch = epoch
        """The generation this writer extends (meta ``epoch``; '' before contract 1.1)."""
        self.provider, self.model, self.started_ms = provider, model, started_ms
        self.first_delta_ms: int | None = None
        """``ts`` of the first ``block.delta`` this writer stored."""
        self.terminal: StreamDone | StreamError | None = None
        """The terminal event once this writer stored it."""
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        """Waits between retries; the job sets one that stops when it is fenced or shut down."""

    def _argv(self, events: list[Event], mode: LiveMode) -> list[Any]:
        terminal = events[-1] if is_terminal(events[-1]) else None
        if any(is_terminal(e) for e in events[:-1]):
            raise InternalError("a terminal event must be the last of its batch")
        head = [str(self.token), str(events[0].seq)]
        if isinstance(terminal, StreamDone | StreamError):
            head += [terminal.status, str(terminal.ts)]
        else:
            head += ["", ""]
        return [*head, *self._appender.ttls, str(len(events)), *(encode_event(e) for e in events),
                secrets.token_hex(8), mode, self.epoch]

    async def append(self, events: list[Event]) -> int:
        """Store ``events`` (one batch, seq order, consecutive) with one script call.

        When the batch ends the stream, the finished-stream summary follows as a separate
        ``XADD`` to ``P:done`` (:meth:`Appender.write_summary`); its failure is logged, not
        raised.

        Args:
            events: Possibly empty (then nothing is sent); seqs must continue
                :attr:`last_seq`; only the last may be terminal.

        Returns:
            The stream's last stored seq afterwards.

        Raises:
            FencedError: The meta token is no longer ours, or (:class:`EpochFencedError`)
                meta no longer holds this writer's epoch. Abort the upstream request,
                leave the job pending for its new owner.
            StreamClosedError: The stream already ended. Stop; ack the job.
            SeqConflictError: Redis holds another ``last_seq``. Stop writing this stream.
            InternalError: A terminal event not last in the batch.
            StorageRefusedError: Redis refused the batch for good (module docstring).
            redis.exceptions.RedisError: Redis still unreachable at the end of the retry
                window; the batch may or may not be stored.
        """
        if not events:
            return self.last_seq
        keys, sid, argv = self._appender.keys, self.stream_id, self._argv(events, await self._appender.live())

        async def call() -> tuple[str, str]:
            reply = await self._appender.script(
                keys=[keys.events(sid), keys.meta(sid), keys.tomb(sid), keys.live(sid)], args=argv)
            return _text(reply[0]), _text(reply[1])

        code, detail = await with_retry(call, policy=self._appender.retry, sleep=self.sleep, what="append",
                                           on_retry=self._appender.on_retry,
                                        stream_id=sid)
        self._accept(events, code, detail)
        await self._stored(events)
        return self.last_seq

    def _accept(self, events: list[Event], code: str, detail: str) -> None:
        """Take the script's answer: ``ok``, or ``landed`` (a retry found this very batch stored)."""
        if code == "landed":
            log.info("event=append_already_stored stream_id=%s last_seq=%s", self.stream_id, detail)
        elif code != "ok":
            raise _refusal(code, detail, self.stream_id)
        self.last_seq = int(detail)

    async def _stored(self, events: list[Event]) -> None:
        sid = self.stream_id
        if self.first_delta_ms is None:
            self.first_delta_ms = _first_delta_ts(events)
        last = events[-1]
        if isinstance(last, StreamDone | StreamError):
            self.terminal = last
            await self._appender.replicate_terminal(sid)
            await self._appender.write_summary(sid, summary_fields(
                last, provider=self.provider, model=self.model, started_ms=self.started_ms,
                first_delta_ms=self.first_delta_ms, epoch=self.epoch))

    async def end_refused(self, events: list[StreamError | Event], *, jump: bool = False) -> str:
        """End the stream after a :class:`StorageRefusedError`: store ``events``, else mark meta.

        Args:
            events: The terminal batch: one ``stream.error`` continuing :attr:`last_seq`
                (after a ``stream.start`` when nothing is stored).
            jump: Redis lost events this writer stored (meta ``last_seq`` is below
                :attr:`last_seq`): store the terminal after :attr:`last_seq` anyway
                (:data:`worker.salvage.TERMINAL_LUA`).

        Returns:
            ``event`` (the terminal event is stored), ``marked`` (meta and tombstone carry
            the terminal status; no event) or ``none`` (nothing could be stored).

        Raises:
            FencedError, StreamClosedError: Another owner, or already ended.
            redis.exceptions.RedisError: Redis unreachable past the retry window.
        """
        mode = await self._appender.live()
        salvage, sid, argv = self._appender.salvage, self.stream_id, [*self._argv(events, mode), "jump" if jump else ""]
        code, detail = await self._salvage_call(lambda: salvage.terminal(sid, argv))
        if code is not None:
            self._accept(events, code, detail)
            await self._stored(events)
            return "event"
        terminal = events[-1]
        assert isinstance(terminal, StreamError)
        code, detail = await self._salvage_call(lambda: salvage.mark(
            sid, token=self.token, status=terminal.status, ended_ms=terminal.ts, category=terminal.error.category,
            message=terminal.error.message, mode=mode, epoch=self.epoch, last_seq=self.last_seq))
        if code is None:
            return "none"
        if code != "ok":
            raise _refusal(code, detail, sid)
        return "marked"

    async def _salvage_call(self, call: Callable[[], Awaitable[tuple[str, str]]]) -> tuple[str | None, str]:
        """Run one salvage script with retries; ``(None, '')`` when Redis refuses it for good."""
        try:
            return await with_retry(call, policy=self._appender.retry, sleep=self.sleep, what="terminal",
                                    on_retry=self._appender.on_retry,
                                    stream_id=self.stream_id)
        except StorageRefusedError:
            return None, ""


def _text(part: Any) -> str:
    return part.decode() if isinstance(part, bytes) else str(part)


def _first_delta_ts(events: list[Event]) -> int | None:
    return next((e.ts for e in events if isinstance(e, BlockDelta)), None)


def _refusal(code: str, detail: str, stream_id: str) -> AppendRefusedError:
    if code == "fenced":
        return FencedError(f"stream {stream_id} is owned by another worker (token {detail or 'none'})")
    if code == "closed":
        return StreamClosedError(f"stream {stream_id} already ended at seq {detail}")
    if code == "reset":
        return EpochFencedError(f"stream {stream_id} holds another generation (epoch {detail or 'none'})")
    return SeqConflictError(f"stream {stream_id} holds last_seq {detail}", stored_seq=int(detail))
