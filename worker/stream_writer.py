"""One stream's fenced appends: its batches in seq order, the script's answers, the end after a refusal.

One job: :class:`StreamWriter`, made by :meth:`worker.appender.Appender.writer` for the
worker holding a stream's fencing token. It turns each batch into the append script's
arguments (:mod:`worker.append_script`), runs the script through
:func:`infra.storage.with_retry`, turns its answer into the stream's last seq or a refusal
(:class:`~schema.errors.AppendRefusedError` and its subclasses), and after a stored
terminal event has the appender ``WAIT`` for replicas and write the finished-stream
summary. After a :class:`~schema.errors.StorageRefusedError` it ends the stream through
the last-resort scripts of :mod:`worker.salvage` (:meth:`StreamWriter.end_refused`).
The protocol itself (what the script checks and stores, which pub/sub): :mod:`worker.appender`.

Must not import :mod:`publisher` or :mod:`tools` (as all of :mod:`worker`); the appender
is imported for its type only.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from infra.live_pubsub import LiveMode
from infra.storage import with_retry
from schema.contract import BlockDelta, Event, StreamDone, StreamError, is_terminal
from schema.errors import (
    AppendRefusedError,
    EpochFencedError,
    FencedError,
    InternalError,
    SeqConflictError,
    StorageRefusedError,
    StreamClosedError,
)
from schema.stored import encode_stored
from worker.summary import summary_fields

if TYPE_CHECKING:
    from worker.appender import Appender

log = logging.getLogger("fanout.worker.appender")


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
        self.background: tuple[str, str, str] | None = None
        """A background attempt's ``(response id, cursor, endpoint)``, stored in meta with each batch."""
        self.background_stored: str | None = None
        """The response id meta holds (``bg_id``) as far as this writer stored it."""
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
        return [*head, *self._appender.ttls, str(len(events)), *(encode_stored(e) for e in events),
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
        argv += list(self.background or ())

        async def call() -> tuple[str, str]:
            reply = await self._appender.script(
                keys=[keys.events(sid), keys.meta(sid), keys.tomb(sid), keys.live(sid)], args=argv)
            return _text(reply[0]), _text(reply[1])

        code, detail = await with_retry(call, policy=self._appender.retry, sleep=self.sleep, what="append",
                                           on_retry=self._appender.on_retry,
                                        stream_id=sid)
        self._accept(events, code, detail)
        self.background_stored = self.background[0] if self.background else self.background_stored
        await self._stored(events)
        return self.last_seq

    async def note_background(self) -> None:
        """Store :attr:`background` in meta now, with no event, when meta does not hold its response id yet.

        One script call of no event (:mod:`worker.append_script`), fenced like an append, so a
        successor re-attaches even before the first content is stored.

        Raises:
            As :meth:`append`.
        """
        if self.background is None or self.background[0] == self.background_stored or self.last_seq < 1:
            return
        mode = await self._appender.live()
        keys, sid = self._appender.keys, self.stream_id
        argv = [str(self.token), str(self.last_seq + 1), "", "", *self._appender.ttls, "0", secrets.token_hex(8),
                mode, self.epoch, *self.background]

        async def call() -> tuple[str, str]:
            reply = await self._appender.script(
                keys=[keys.events(sid), keys.meta(sid), keys.tomb(sid), keys.live(sid)], args=argv)
            return _text(reply[0]), _text(reply[1])

        code, detail = await with_retry(call, policy=self._appender.retry, sleep=self.sleep, what="append",
                                        on_retry=self._appender.on_retry, stream_id=sid)
        self._accept([], code, detail)
        self.background_stored = self.background[0]

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
            if self._appender.compactor is not None:
                await self._appender.compactor.schedule(sid)

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
