"""The shared normalizer: turns an adapter's block operations into contract events.

Adapters translate provider events into calls such as :meth:`Normalizer.open_block`,
:meth:`Normalizer.delta` and :meth:`Normalizer.done`; the normalizer assigns ``seq``
and block ids, derives the final ``finish_reason``, checks every event against the
state machine of :mod:`schema.states` (the same table the validator uses) and emits
exactly one terminal event. After the terminal event every call is ignored and counted.

Keys: adapters name blocks by any hashable key of their own (Anthropic ``index``,
Responses ``(output_index, content_index)``, ...); the normalizer maps each key to
the next contract ``index`` in order of public start.

Held blocks (PROVIDERS.md 7.4: a block that never receives content never exists
publicly): a ``text``, ``reasoning`` or ``refusal`` block is opened for the adapter at
once but its ``block.start`` is held until its first non-empty delta (of any kind, a
signature included), which is also when it gets its contract ``index``. Closing a held
block emits nothing, so a never-filled block leaves no trace and the indexes of the
blocks that follow close ranks. A ``tool_call`` block starts at once: its name and call
id are content, and ``""`` arguments mean ``{}``.

Pure: imports no asyncio, aiohttp, redis or opentelemetry; the clock is injected.
"""

from __future__ import annotations

from collections import Counter
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
    ErrorInfo,
    ErrorStatus,
    Event,
    FinishReason,
    StreamDone,
    StreamError,
    StreamStart,
    ToolInfo,
    Usage,
    Visibility,
)
from schema.errors import InternalError
from schema.reducer import parse_arguments
from schema.states import StreamMachine
from worker.error_policy import RETRYABLE, STATUS_OF_CATEGORY, safe_message

_HELD_KINDS: frozenset[BlockKind] = frozenset({"text", "reasoning", "refusal"})
"""Block kinds whose ``block.start`` waits for their first content (PROVIDERS.md 7.4)."""


class _Block:
    __slots__ = ("json_text", "kind", "open", "redacted", "ref", "signature", "text", "tool")

    def __init__(self, kind: BlockKind, tool: ToolInfo | None, redacted: bool) -> None:
        self.ref: BlockRef | None = None
        """Set when ``block.start`` is emitted; ``None`` while held."""
        self.kind: BlockKind = kind
        self.tool, self.redacted = tool, redacted
        self.open = True
        self.text: list[str] = []
        self.json_text: list[str] = []
        self.signature: list[str] = []

    def parts(self, kind: DeltaKind) -> list[str]:
        return {"text": self.text, "json_text": self.json_text, "signature": self.signature}[kind]


class Normalizer:
    """Per-stream state that turns block operations into ordered contract events.

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
    ) -> None:
        self.stream_id, self.provider, self.model = stream_id, provider, model
        self.epoch = epoch
        self.metadata = metadata or {}
        self.visibility: Visibility = reasoning_visibility
        self.usage: Usage | None = None
        """The last usage report received; adapters overwrite it as reports arrive."""
        self.ignored: Counter[str] = Counter()
        """Provider events skipped, by name (``after_terminal`` for anything after the end)."""
        self._clock = clock
        self._seq = stored_seq
        self._machine = StreamMachine()
        self._machine.state = "open" if stored_seq else "idle"
        self._machine.last_seq = stored_seq
        self._blocks: dict[Hashable, _Block] = {}
        self._order: list[_Block] = []
        self._outbox: list[Event] = []
        self.terminal: Event | None = None
        """The terminal event, once emitted."""
        self.deltas_emitted = 0
        """How many ``block.delta`` events were emitted (retries stop once this is > 0)."""

    # -- output -------------------------------------------------------------

    def take(self) -> list[Event]:
        """Return and forget the events emitted since the last call, in seq order."""
        out, self._outbox = self._outbox, []
        return out

    def _emit(self, build: Callable[[int, int], Event]) -> None:
        event = build(self._seq + 1, self._clock())
        violation = self._machine.apply(event)
        if violation is not None:
            raise InternalError(f"normalizer would break {violation.rule}: {violation.message}")
        self._seq = event.seq
        self._outbox.append(event)
        if isinstance(event, StreamDone | StreamError):
            self.terminal = event

    def _ignored_after_end(self) -> bool:
        if self.terminal is not None:
            self.ignored["after_terminal"] += 1
            return True
        return False

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

    def ignore(self, name: str) -> None:
        """Count one provider event skipped because this version does not use it."""
        self.ignored[name or "unnamed"] += 1

    # -- blocks -------------------------------------------------------------

    def is_open(self, key: Hashable) -> bool:
        """Whether the block keyed ``key`` is open."""
        block = self._blocks.get(key)
        return block is not None and block.open

    def knows(self, key: Hashable) -> bool:
        """Whether a block keyed ``key`` was ever opened."""
        return key in self._blocks

    def kind_of(self, key: Hashable) -> BlockKind | None:
        """Return the kind of the block keyed ``key``, or ``None`` if unknown."""
        block = self._blocks.get(key)
        return block.kind if block else None

    @property
    def open_keys(self) -> list[Hashable]:
        """Keys of open blocks (held ones included), in order of opening."""
        return [k for k, b in self._blocks.items() if b.open]

    @property
    def block_count(self) -> int:
        """How many blocks started publicly (held blocks not yet filled are not counted)."""
        return len(self._order)

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
        if key in self._blocks:
            self.fail(category="protocol", message="upstream started the same block twice")
            return
        tool = ToolInfo(call_id=call_id or "", name=name or "") if kind == "tool_call" else None
        block = _Block(kind, tool, redacted)
        self._blocks[key] = block
        if kind not in _HELD_KINDS:
            self._start(block)

    def _start(self, block: _Block) -> BlockRef:
        ref = BlockRef(id=f"b{len(self._order)}", index=len(self._order), kind=block.kind)
        is_reasoning = block.kind == "reasoning"
        self._emit(
            lambda seq, ts: BlockStart(
                stream_id=self.stream_id, seq=seq, ts=ts, block=ref, tool=block.tool,
                visibility=self.visibility if is_reasoning else None,
                redacted=block.redacted if is_reasoning else None,
            )
        )
        block.ref = ref
        self._order.append(block)
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
        block = self._blocks.get(key)
        return "".join(block.parts(kind)) if block else ""

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

    def _stop(self, block: _Block) -> None:
        ref = block.ref
        if ref is not None:
            self._emit(lambda seq, ts: BlockStop(stream_id=self.stream_id, seq=seq, ts=ts, block=ref))
        block.open = False

    def close_all(self) -> None:
        """Close every open block in order of opening (a token-limit stop, or a clean end)."""
        for block in self._blocks.values():
            if block.open and self.terminal is None:
                self._stop(block)

    # -- terminal -----------------------------------------------------------

    def derive_finish(self, reason: FinishReason | None) -> FinishReason | None:
        """Apply PROVIDERS.md 7.8 to a provider's ``stop``.

        ``stop`` with tool calls becomes ``tool_calls``; ``stop`` whose only output is a
        refusal (reasoning aside) becomes ``refusal``; any other reason is returned as is.
        """
        if reason != "stop":
            return reason
        kinds = {b.kind for b in self._order}
        if "tool_call" in kinds:
            return "tool_calls"
        if kinds - {"reasoning"} == {"refusal"}:
            return "refusal"
        return reason

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
        if self.open_keys:
            self.fail(
                category="protocol", message="upstream ended the response with a block still open",
                finish_reason=final,
            )
            return
        if status == "completed" and any(
            b.kind == "tool_call" and parse_arguments("".join(b.json_text)) is None for b in self._order
        ):
            self.fail(category="protocol", message="tool call arguments are not a JSON object",
                      finish_reason=final)
            return
        self._emit(
            lambda seq, ts: StreamDone(
                stream_id=self.stream_id, seq=seq, ts=ts, status=status, finish_reason=final,
                provider_finish_reason=provider_finish_reason, usage=self.usage,
                response_id=response_id, model=model,
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

        ``status`` defaults from the category (``transport``/``timeout``/``worker_lost``
        → ``interrupted``, ``cancelled`` → ``cancelled``, else ``failed``) and
        ``retryable`` from :data:`RETRYABLE`.
        """
        if self._ignored_after_end():
            return
        info = ErrorInfo(
            category=category,
            retryable=RETRYABLE[category] if retryable is None else retryable,
            provider_code=provider_code,
            message=safe_message(message),
        )
        final_status = status or STATUS_OF_CATEGORY.get(category, "failed")
        self._emit(
            lambda seq, ts: StreamError(
                stream_id=self.stream_id, seq=seq, ts=ts, status=final_status, error=info,
                usage=self.usage, finish_reason=finish_reason,
            )
        )
