"""The reducer: any prefix of a stream's events → the assembled result of CONTRACT.md.

Serves a finished stream and a running one alike (``status: running`` until a
terminal event). Pure: imports only the contract and msgspec.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import msgspec

from fanout_client.contract import (
    BlockDelta,
    BlockStart,
    BlockStop,
    ErrorInfo,
    Event,
    FinishReason,
    StreamDone,
    StreamError,
    StreamStart,
    Usage,
    Visibility,
)

ResultStatus = Literal["running", "completed", "incomplete", "failed", "interrupted", "cancelled"]


class _AssembledBase(msgspec.Struct, kw_only=True, tag_field="kind"):
    index: int
    """Place in the content array."""
    signature: str | None = None
    """Concatenated ``signature`` deltas, or ``None``."""


class TextBlock(_AssembledBase, kw_only=True, tag="text"):
    """An assembled text block."""

    text: str = ""
    """Concatenated text deltas."""


class RefusalBlock(_AssembledBase, kw_only=True, tag="refusal"):
    """An assembled refusal block."""

    text: str = ""
    """Concatenated refusal text."""


class ReasoningBlock(_AssembledBase, kw_only=True, tag="reasoning"):
    """An assembled reasoning block."""

    text: str = ""
    """Concatenated reasoning text (empty when redacted)."""
    redacted: bool = False
    """The reasoning arrived only as opaque data (kept as ``signature``)."""
    visibility: Visibility = "public"
    """``public`` or ``internal``."""


class ToolCallBlock(_AssembledBase, kw_only=True, tag="tool_call"):
    """An assembled tool call."""

    call_id: str = ""
    """The call id to answer under."""
    name: str = ""
    """The function name."""
    arguments: dict[str, Any] | None = None
    """The parsed arguments object once the block closed and parsed, else ``None``."""
    arguments_text: str = ""
    """The raw concatenated ``json_text``."""
    closed: bool = False
    """Whether ``block.stop`` was seen."""


AssembledBlock = TextBlock | RefusalBlock | ReasoningBlock | ToolCallBlock
"""One block of the assembled result, tagged on ``kind``."""


class AssembledResult(msgspec.Struct, kw_only=True):
    """The assembled message (CONTRACT.md, "Assembled result")."""

    stream_id: str
    """The stream assembled."""
    status: ResultStatus
    """``running`` until a terminal event, then its terminal status."""
    finish_reason: FinishReason | None = None
    """Normalized finish reason from the terminal event."""
    provider_finish_reason: str | None = None
    """The provider's raw finish reason (``stream.done`` only)."""
    error: ErrorInfo | None = None
    """The error of a ``stream.error`` end."""
    blocks: list[AssembledBlock] = msgspec.field(default_factory=list)
    """Blocks ordered by ``index``."""
    usage: Usage | None = None
    """Usage from the terminal event."""
    model: str | None = None
    """The answering model (``stream.done``), else the requested one."""
    response_id: str | None = None
    """The provider's response id (``stream.done`` only)."""
    endpoint: str | None = None
    """The configured upstream endpoint that answered (the terminal event's ``endpoint``,
    contract 1.1); ``None`` while running and without an upstreams file."""


def parse_arguments(text: str) -> dict[str, Any] | None:
    """Parse concatenated tool-argument JSON: ``""`` is ``{}``; non-objects and bad JSON are ``None``."""
    if text.strip() == "":
        return {}
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, dict) else None


class _BlockAcc:
    __slots__ = ("closed", "parts", "signature", "start")

    def __init__(self, start: BlockStart) -> None:
        self.start = start
        self.parts: list[str] = []
        self.signature: list[str] = []
        self.closed = False

    def build(self) -> AssembledBlock:
        index, kind = self.start.block.index, self.start.block.kind
        text = "".join(self.parts)
        sig = "".join(self.signature) if self.signature else None
        if kind == "tool_call":
            tool = self.start.tool
            return ToolCallBlock(
                index=index,
                signature=sig,
                call_id=tool.call_id if tool else "",
                name=tool.name if tool else "",
                arguments=parse_arguments(text) if self.closed else None,
                arguments_text=text,
                closed=self.closed,
            )
        if kind == "reasoning":
            return ReasoningBlock(
                index=index,
                signature=sig,
                text=text,
                redacted=bool(self.start.redacted),
                visibility=self.start.visibility or "public",
            )
        if kind == "refusal":
            return RefusalBlock(index=index, signature=sig, text=text)
        return TextBlock(index=index, signature=sig, text=text)


class Assembler:
    """Incremental reducer: :meth:`apply` events one at a time, read :meth:`result` any time.

    Events are taken as stored; ones that break an invariant (a delta for a block never
    started) are skipped, since the validator reports them.
    """

    def __init__(self, stream_id: str = "") -> None:
        self.stream_id = stream_id
        self._blocks: dict[int, _BlockAcc] = {}
        self._start: StreamStart | None = None
        self._end: StreamDone | StreamError | None = None
        self._model: str | None = None

    def apply(self, event: Event) -> None:
        """Fold one event into the result."""
        self.stream_id = self.stream_id or event.stream_id
        if isinstance(event, StreamStart):
            self._start = event
        elif isinstance(event, BlockStart):
            self._blocks.setdefault(event.block.index, _BlockAcc(event))
        elif isinstance(event, BlockDelta):
            acc = self._blocks.get(event.block.index)
            if acc is not None and not acc.closed:
                target = acc.signature if event.delta.kind == "signature" else acc.parts
                target.append(event.delta.text)
        elif isinstance(event, BlockStop):
            if (acc := self._blocks.get(event.block.index)) is not None:
                acc.closed = True
        elif isinstance(event, StreamDone | StreamError) and self._end is None:
            self._end = event

    def seed_block(self, start: BlockStart, text: str, signature: str | None, *, closed: bool) -> None:
        """Hold a block as if ``start`` and deltas of ``text`` and ``signature`` were applied (a snapshot's block)."""
        acc = self._blocks[start.block.index] = _BlockAcc(start)
        acc.parts += [text] if text else []
        acc.signature += [signature] if signature is not None else []
        acc.closed = closed

    def seed_end(self, end: StreamDone | StreamError | None, model: str | None) -> None:
        """Hold a snapshot's terminal event (``None``: running) and the model it reported without ``stream.start``."""
        self._end, self._model = end, model

    def result(self) -> AssembledResult:
        """Return the assembled result of every event applied so far."""
        blocks = [self._blocks[i].build() for i in sorted(self._blocks)]
        out = AssembledResult(stream_id=self.stream_id, status="running", blocks=blocks)
        end = self._end
        if isinstance(end, StreamDone):
            out.status, out.finish_reason = end.status, end.finish_reason
            out.provider_finish_reason, out.usage = end.provider_finish_reason, end.usage
            out.model, out.response_id = end.model, end.response_id
        elif isinstance(end, StreamError):
            out.status, out.error = end.status, end.error
            out.usage, out.finish_reason = end.usage, end.finish_reason
        if end is not None and isinstance(end.endpoint, str):
            out.endpoint = end.endpoint
        if out.model is None:
            out.model = self._start.model if self._start is not None else self._model
        return out


def reduce(events: Iterable[Event], stream_id: str = "") -> AssembledResult:
    """Assemble the result of a stream (or of any prefix of it).

    Args:
        events: The stream's events in stored order.
        stream_id: Used when ``events`` is empty.

    Returns:
        The assembled result; ``status`` is ``running`` until a terminal event.
    """
    assembler = Assembler(stream_id)
    for event in events:
        assembler.apply(event)
    return assembler.result()


def result_to_builtins(result: AssembledResult) -> dict[str, Any]:
    """Return the result as JSON-ready Python objects, with every top-level field present."""
    out: dict[str, Any] = msgspec.to_builtins(result)
    return out
