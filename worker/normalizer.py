"""The shared normalizer: turns an adapter's block operations into contract events.

Adapters translate provider events into calls such as :meth:`Normalizer.open_block`,
:meth:`Normalizer.delta` and :meth:`Normalizer.done`; the normalizer assigns ``seq``
and block ids, derives the final ``finish_reason``, checks every event against the
state machine of :mod:`schema.states` (the same table the validator uses) and emits
exactly one terminal event. After the terminal event every call is ignored and counted.

Around it: :mod:`worker.outbox` numbers, checks and holds the events (the base class);
:mod:`worker.blocks` keeps the books of the blocks (adapter keys, held blocks, contract
indexes, streamed text); :mod:`worker.terminal` holds the rules of the end (finish
derivation, whether an end stands, a failure's status). This module decides each event.

Pure: imports no asyncio, aiohttp, redis or opentelemetry, and nothing of the worker's I/O
shell; the clock is injected.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import msgspec

from schema.contract import (
    BlockDelta,
    BlockKind,
    BlockRef,
    BlockStart,
    BlockStop,
    Delta,
    DeltaKind,
    DoneStatus,
    ErrorCategory,
    ErrorStatus,
    FinishReason,
    StreamDone,
    StreamError,
    StreamStart,
    Usage,
    Visibility,
)
from worker.blocks import Block, BlockTable
from worker.outbox import EventOutbox
from worker.terminal import derive_finish, end_problem, failure


class Normalizer(EventOutbox):
    """Per-stream state that turns block operations into ordered contract events (:class:`EventOutbox`).

    Args:
        stream_id: The stream's id, stamped on every event.
        provider: Provider API name for ``stream.start``.
        model: Requested model for ``stream.start``.
        clock: Returns the current time in milliseconds since the Unix epoch.
        metadata: The job's metadata, copied onto ``stream.start``.
        reasoning_visibility: Visibility given to reasoning blocks.
        stored_seq: Events of this stream already stored (1 when a retry follows a
            stored ``stream.start``, which is then not emitted again).
        epoch: The generation's epoch, carried on ``stream.start`` (contract 1.1); ``None``
            leaves it out (offline replays, goldens).
        endpoint: The upstreams-file endpoint this attempt calls, stamped on the terminal
            event (contract 1.1 ``endpoint``); ``None`` leaves it out (no upstreams file).
        upstream_model: The model or deployment sent to that endpoint; ``stream.done``'s
            ``model`` when the provider names none.
    """

    def __init__(
        self,
        *,
        stream_id: str,
        provider: str,
        model: str,
        clock: Callable[[], int],
        metadata: dict[str, Any] | None = None,
        reasoning_visibility: Visibility = "public",
        stored_seq: int = 0,
        epoch: str | None = None,
        endpoint: str | None = None,
        upstream_model: str | None = None,
    ) -> None:
        super().__init__(clock=clock, stored_seq=stored_seq)
        self.stream_id, self.provider, self.model = stream_id, provider, model
        self.epoch = epoch
        self.endpoint: str | msgspec.UnsetType = endpoint if endpoint is not None else msgspec.UNSET
        self.upstream_model = upstream_model
        self.metadata = metadata or {}
        self.visibility: Visibility = reasoning_visibility
        self.usage: Usage | None = None
        """The last usage report received; adapters overwrite it as reports arrive."""
        self._blocks = BlockTable()
        self.deltas_emitted = 0
        """How many ``block.delta`` events were emitted (retries stop once this is > 0)."""

    # -- stream -------------------------------------------------------------

    def start(self) -> None:
        """Emit ``stream.start`` unless it is already stored (``stored_seq`` > 0)."""
        if self._seq == 0:
            self._emit(
                lambda seq, ts: StreamStart(
                    stream_id=self.stream_id, seq=seq, ts=ts, provider=self.provider,
                    model=self.model, metadata=self.metadata, epoch=self.epoch or msgspec.UNSET,
                )
            )

    # -- blocks -------------------------------------------------------------

    def is_open(self, key: Hashable) -> bool:
        """Whether the block keyed ``key`` is open."""
        return self._blocks.is_open(key)

    def knows(self, key: Hashable) -> bool:
        """Whether a block keyed ``key`` was ever opened."""
        return self._blocks.knows(key)

    def kind_of(self, key: Hashable) -> BlockKind | None:
        """Return the kind of the block keyed ``key``, or ``None`` if unknown."""
        return self._blocks.kind_of(key)

    @property
    def open_keys(self) -> list[Hashable]:
        """Keys of open blocks (held ones included), in order of opening."""
        return self._blocks.open_keys

    @property
    def block_count(self) -> int:
        """How many blocks started publicly (held blocks not yet filled are not counted)."""
        return len(self._blocks.started)

    def open_block(
        self,
        key: Hashable,
        kind: BlockKind,
        *,
        call_id: str | None = None,
        name: str | None = None,
        redacted: bool = False,
    ) -> None:
        """Open a block; a ``tool_call`` starts at the next index now, other kinds at their first content.

        A key opened twice (the upstream started the same block again) ends the stream
        ``failed``/``protocol``.
        """
        if self._ignored_after_end():
            return
        if self._blocks.knows(key):
            self.fail(category="protocol", message="upstream started the same block twice")
            return
        block = self._blocks.add(key, kind, call_id=call_id, name=name, redacted=redacted)
        if not block.held:
            self._start(block)

    def _start(self, block: Block) -> BlockRef:
        ref = self._blocks.next_ref(block)
        is_reasoning = block.kind == "reasoning"
        self._emit(
            lambda seq, ts: BlockStart(
                stream_id=self.stream_id, seq=seq, ts=ts, block=ref, tool=block.tool,
                visibility=self.visibility if is_reasoning else None,
                redacted=block.redacted if is_reasoning else None,
            )
        )
        self._blocks.mark_started(block, ref)
        return ref

    def delta(self, key: Hashable, kind: DeltaKind, text: str) -> None:
        """Append a fragment to the open block ``key``; an empty fragment adds nothing.

        A fragment for a block that is unknown or closed ends the stream
        ``failed``/``protocol`` (CONTRACT.md, terminal states).
        """
        if self._ignored_after_end() or text == "":
            return
        block = self._blocks.get(key)
        if block is None or not block.open:
            state = "a closed" if block else "an unknown"
            self.fail(category="protocol", message=f"upstream sent a delta for {state} block")
            return
        ref = block.ref or self._start(block)
        self._emit(
            lambda seq, ts: BlockDelta(
                stream_id=self.stream_id, seq=seq, ts=ts, block=ref,
                delta=Delta(kind=kind, text=text),
            )
        )
        block.parts(kind).append(text)
        self.deltas_emitted += 1

    def text_of(self, key: Hashable, kind: DeltaKind) -> str:
        """Return the concatenated fragments of ``kind`` sent so far for block ``key``."""
        return self._blocks.text_of(key, kind)

    def settle(self, key: Hashable, kind: DeltaKind, final: str) -> bool:
        """Reconcile a provider's final value with what was streamed for block ``key``.

        When the streamed text is a prefix of ``final`` the missing tail is sent as one
        more delta; when they disagree otherwise the stream ends ``failed``/``protocol``
        (a delivered delta cannot be taken back). Returns False on that conflict.
        """
        if self.terminal is not None or not self.is_open(key):
            return self.terminal is None
        sent = self.text_of(key, kind)
        if not final.startswith(sent):
            self.fail(category="protocol", message="upstream's final value contradicts the streamed deltas")
            return False
        self.delta(key, kind, final[len(sent):])
        return True

    def close_block(self, key: Hashable) -> None:
        """Close the block ``key`` (silently when it is still held: it never existed publicly).

        Closing an unknown or closed block is a protocol failure.
        """
        if self._ignored_after_end():
            return
        block = self._blocks.get(key)
        if block is None or not block.open:
            self.fail(category="protocol", message="upstream closed a block that is not open")
            return
        self._stop(block)

    def _stop(self, block: Block) -> None:
        ref = block.ref
        if ref is not None:
            self._emit(lambda seq, ts: BlockStop(stream_id=self.stream_id, seq=seq, ts=ts, block=ref))
        block.open = False

    def close_all(self) -> None:
        """Close every open block in order of opening (a token-limit stop, or a clean end)."""
        for block in self._blocks:
            if block.open and self.terminal is None:
                self._stop(block)

    # -- terminal -----------------------------------------------------------

    def derive_finish(self, reason: FinishReason | None) -> FinishReason | None:
        """Apply PROVIDERS.md 7.8 to a provider's ``stop`` (:func:`worker.terminal.derive_finish`)."""
        return derive_finish(reason, (b.kind for b in self._blocks.started))

    def done(
        self,
        *,
        status: DoneStatus,
        finish_reason: FinishReason | None,
        provider_finish_reason: str | None,
        response_id: str | None = None,
        model: str | None = None,
    ) -> None:
        """Emit ``stream.done`` when the provider proved an end.

        With a block still open, or a ``completed`` end whose tool arguments do not
        parse, the stream ends ``failed``/``protocol`` instead (CONTRACT.md).
        """
        if self._ignored_after_end():
            return
        final = self.derive_finish(finish_reason)
        problem = end_problem(status, open_blocks=bool(self.open_keys), started=self._blocks.started)
        if problem is not None:
            self.fail(category="protocol", message=problem, finish_reason=final)
            return
        self._emit(
            lambda seq, ts: StreamDone(
                stream_id=self.stream_id, seq=seq, ts=ts, status=status, finish_reason=final,
                provider_finish_reason=provider_finish_reason, usage=self.usage,
                response_id=response_id, model=model if model is not None else self.upstream_model,
                endpoint=self.endpoint,
            )
        )

    def fail(
        self,
        *,
        category: ErrorCategory,
        message: str,
        provider_code: str | None = None,
        retryable: bool | None = None,
        finish_reason: FinishReason | None = None,
        status: ErrorStatus | None = None,
    ) -> None:
        """Emit ``stream.error``; open blocks stay open publicly (no fake ``block.stop``).

        ``status`` and ``retryable`` default from the category (:func:`worker.terminal.failure`).
        """
        if self._ignored_after_end():
            return
        final_status, info = failure(category, message, provider_code=provider_code, retryable=retryable,
                                     status=status)
        self._emit(
            lambda seq, ts: StreamError(
                stream_id=self.stream_id, seq=seq, ts=ts, status=final_status, error=info,
                usage=self.usage, finish_reason=finish_reason, endpoint=self.endpoint,
            )
        )

