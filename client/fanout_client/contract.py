"""The event contract v1 as msgspec Structs: the one shape workers write and readers read.

Every event is a frozen, keyword-only Struct tagged on ``type`` (``stream.start``,
``block.start``, ``block.delta``, ``block.stop``, ``stream.done``, ``stream.error``).
Encoders and decoders are built once at import. This module imports nothing but
msgspec and the standard library.

Decisions where CONTRACT.md is silent (the contract's docs, kept here):

* ``block.id`` is ``b<index>``: unique within a stream, stable across replays.
* ``block.start`` omits ``tool`` unless the kind is ``tool_call`` and omits
  ``visibility``/``redacted`` unless the kind is ``reasoning``.
* A provider's final value that disagrees with what was streamed (Responses
  ``*.done`` events, the terminal ``response.output``): when the streamed text is a
  prefix of the final value the missing tail is sent as one more delta; any other
  disagreement ends the stream ``failed``/``protocol``, because a delta already
  delivered cannot be taken back.
* ``arguments`` in the assembled result is the parsed value only when it is a JSON
  object (tool arguments are objects by every provider's definition); ``""`` means
  ``{}``.
* Consumers must ignore unknown types: :func:`decode_event` returns ``None`` for them.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from fanout_client.event_ids import EPOCH_PATTERN as EPOCH_PATTERN
from fanout_client.event_ids import event_id as event_id
from fanout_client.event_ids import parse_event_id as parse_event_id

CONTRACT_VERSION: Final = 1
"""Schema version of this contract; bumped when block kinds or types are added."""
CONTRACT_MINOR: Final = 1
"""Minor revision (contract 1.1): optional additions old readers ignore, such as ``epoch``."""

STREAM_ID_PATTERN: Final = r"^[A-Za-z0-9_-]{1,128}$"
"""Every ``stream_id`` matches this pattern (CONTRACT.md, Envelope)."""

BlockKind = Literal["text", "reasoning", "tool_call", "refusal"]
DeltaKind = Literal["text", "json_text", "signature"]
Visibility = Literal["public", "internal"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "refusal", "pause", "other"]
DoneStatus = Literal["completed", "incomplete"]
ErrorStatus = Literal["failed", "interrupted", "cancelled"]
ErrorCategory = Literal[
    "upstream_overloaded",
    "rate_limited",
    "upstream_error",
    "invalid_request",
    "authentication",
    "permission",
    "not_found",
    "context_length_exceeded",
    "content_filter",
    "timeout",
    "transport",
    "protocol",
    "worker_lost",
    "cancelled",
    "internal",
]
TerminalStatus = Literal["completed", "incomplete", "failed", "interrupted", "cancelled"]

Provider = Literal["openai_chat", "openai_responses", "anthropic", "gemini", "bedrock_converse", "gemini_interactions"]
"""Provider APIs a job may name (``stream.start``'s ``provider``; consumers must accept others too)."""
PROVIDERS: Final[tuple[Provider, ...]] = ("openai_chat", "openai_responses", "anthropic", "gemini", "bedrock_converse",
                                         "gemini_interactions")
"""The values of :data:`Provider`, in order."""

TERMINAL_TYPES: Final = frozenset({"stream.done", "stream.error"})
"""Event types that end a stream (invariant 4)."""


class BlockRef(msgspec.Struct, frozen=True, kw_only=True):
    """The block an event is about."""

    id: str
    """Stream-unique block id, ``b<index>``."""
    index: int
    """0-based place of the block in the final content array, in provider order."""
    kind: BlockKind
    """``text``, ``reasoning``, ``tool_call`` or ``refusal``."""


class ToolInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Identity of a tool call, given on its ``block.start``."""

    call_id: str
    """The provider's call id (or a stable generated one when it sent none)."""
    name: str
    """Function name as the model wrote it."""


class Delta(msgspec.Struct, frozen=True, kw_only=True):
    """One opaque fragment appended to an open block."""

    kind: DeltaKind
    """``text`` (text, reasoning, refusal), ``json_text`` (tool arguments) or ``signature``."""
    text: str
    """The fragment; never empty. No token or JSON boundary is promised."""


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts as the provider reported them; ``None`` where it sent nothing."""

    input_tokens: int | None = None
    """All prompt tokens, cached ones included."""
    output_tokens: int | None = None
    """All generated tokens, reasoning included."""
    cached_input_tokens: int | None = None
    """Prompt tokens served from the provider's cache."""
    reasoning_tokens: int | None = None
    """Generated tokens spent on reasoning."""


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Why a stream ended in ``stream.error``."""

    category: ErrorCategory
    """Normalized cause (CONTRACT.md, Error category)."""
    retryable: bool
    """Whether the same job may succeed if submitted again."""
    provider_code: str | None = None
    """The provider's own error code or type, for diagnostics."""
    message: str
    """Safe to show a user: no secrets, no prompt text, no credentials."""


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Envelope shared by every contract event."""

    stream_id: str
    """The stream this event belongs to (``^[A-Za-z0-9_-]{1,128}$``)."""
    seq: int
    """1 for ``stream.start``, then +1 per stored event; gateway-assigned."""
    ts: int
    """Milliseconds since the Unix epoch when the worker emitted the event."""


class StreamStart(_Event, frozen=True, kw_only=True, tag="stream.start"):
    """The contract started (not that the model produced anything). Always seq 1."""

    provider: str
    """Provider API: ``openai_chat``, ``openai_responses``, ``anthropic``, ``gemini``, ``bedrock_converse``,
    ``gemini_interactions``."""
    model: str
    """The model as requested."""
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    """The job's metadata object, passed through."""
    epoch: str | msgspec.UnsetType = msgspec.UNSET
    """The generation of the stream this event starts (contract 1.1, "Generations"): a short
    opaque token (:data:`EPOCH_PATTERN`) the writing worker chose, also the suffix of every
    SSE ``id`` (``<seq>.<epoch>``) of this generation. Absent on streams written before 1.1
    and in offline replays."""


class BlockStart(_Event, frozen=True, kw_only=True, tag="block.start", omit_defaults=True):
    """Opens a block; its kind decides which optional fields are present."""

    block: BlockRef
    """The block being opened."""
    tool: ToolInfo | None = None
    """Call id and name, for ``tool_call`` blocks only."""
    visibility: Visibility | None = None
    """``public`` or ``internal``, for ``reasoning`` blocks only."""
    redacted: bool | None = None
    """True when the reasoning arrived only as opaque data, for ``reasoning`` blocks only."""


class BlockDelta(_Event, frozen=True, kw_only=True, tag="block.delta"):
    """Appends one fragment to an open block, in upstream order."""

    block: BlockRef
    """The open block the fragment belongs to."""
    delta: Delta
    """The fragment."""


class BlockStop(_Event, frozen=True, kw_only=True, tag="block.stop"):
    """Closes a block; no delta for it afterwards."""

    block: BlockRef
    """The block being closed."""


class StreamDone(_Event, frozen=True, kw_only=True, tag="stream.done"):
    """The provider proved an end and every block is closed."""

    status: DoneStatus
    """``completed`` or ``incomplete`` (truncated or filtered)."""
    finish_reason: FinishReason | None
    """Normalized finish reason."""
    provider_finish_reason: str | None
    """The provider's raw finish or stop reason."""
    usage: Usage | None
    """The last usage report received, or ``None``."""
    response_id: str | None
    """The provider's response or message id."""
    model: str | None
    """The model the provider says answered (with an upstreams file, the upstream model or
    deployment sent when the provider names none)."""
    endpoint: str | msgspec.UnsetType = msgspec.UNSET
    """The configured upstream endpoint whose attempt produced the stream (contract 1.1,
    ``endpoint``); absent without an upstreams file."""


class StreamError(_Event, frozen=True, kw_only=True, tag="stream.error"):
    """Ends the stream without success; open blocks stay open publicly."""

    status: ErrorStatus
    """``failed``, ``interrupted`` or ``cancelled``."""
    error: ErrorInfo
    """Category, retryability, provider code and a safe message."""
    usage: Usage | None
    """The last usage report received, or ``None``."""
    finish_reason: FinishReason | None
    """The finish reason the provider sent before failing, if any."""
    endpoint: str | msgspec.UnsetType = msgspec.UNSET
    """The configured upstream endpoint whose attempt ended the stream (contract 1.1,
    ``endpoint``: the last one tried); absent without an upstreams file or when no attempt ran."""


Event = StreamStart | BlockStart | BlockDelta | BlockStop | StreamDone | StreamError
"""Any contract event (a tagged union on ``type``)."""

EVENT_TYPES: Final[dict[str, type[Event]]] = {
    "stream.start": StreamStart,
    "block.start": BlockStart,
    "block.delta": BlockDelta,
    "block.stop": BlockStop,
    "stream.done": StreamDone,
    "stream.error": StreamError,
}
"""Contract tag → Struct class."""


class _TypeOnly(msgspec.Struct):
    type: str


_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(Event)
_type_decoder: Final = msgspec.json.Decoder(_TypeOnly)


def encode_event(event: Event) -> bytes:
    """Serialize one event to compact JSON bytes (one line, UTF-8)."""
    return _encoder.encode(event)


def decode_event(data: bytes | str) -> Event | None:
    """Parse one event from JSON.

    Args:
        data: The JSON of one event, as stored in Redis or sent in an SSE ``data:`` line.

    Returns:
        The typed event, or ``None`` when its ``type`` is not one this version knows
        (consumers must ignore unknown types, CONTRACT.md "Types").

    Raises:
        msgspec.ValidationError: A known type with missing or ill-typed fields.
        msgspec.DecodeError: Not JSON, or no ``type`` field.
    """
    if _type_decoder.decode(data).type not in EVENT_TYPES:
        return None
    return _decoder.decode(data)


def to_builtins(event: Event) -> dict[str, Any]:
    """Return the event as plain JSON-compatible Python objects."""
    result: dict[str, Any] = msgspec.to_builtins(event)
    return result


def is_terminal(event: Event) -> bool:
    """Return True for ``stream.done`` and ``stream.error``."""
    return isinstance(event, StreamDone | StreamError)


def terminal_status(event: Event) -> TerminalStatus | None:
    """Return the terminal status an event carries, or ``None`` if it is not terminal."""
    if isinstance(event, StreamDone | StreamError):
        return event.status
    return None
