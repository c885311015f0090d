"""Frames: what the framing decoders hand to the provider adapters.

An :class:`SSEFrame` is one dispatched SSE event (WHATWG HTML, "Interpreting an event
stream"). A :class:`JSONFrame` is one complete JSON value that arrived outside SSE
framing: an element of Gemini's streamed JSON array, or a raw, unframed JSON object
(typically an ``{"error": ...}``) written into an SSE body without ``data:`` prefixes
(PROVIDERS.md 5.3). An :class:`ErrorFrame` is an error the body's framing itself
reported inside a 200 response (a Bedrock event-stream ``exception`` or ``error``
message, UPSTREAMS.md C.2), already in contract terms. Pure: no I/O imports.
"""

from __future__ import annotations

import msgspec

from schema.contract import ErrorCategory


class SSEFrame(msgspec.Struct, frozen=True, kw_only=True):
    """One dispatched SSE event."""

    event: str = "message"
    """The ``event`` field, ``message`` when absent."""
    data: str
    """The ``data`` lines joined with ``\\n``; an event with no ``data`` line is never dispatched."""
    id: str | None = None
    """The last event ID buffer at dispatch (upstream's ``id``), or ``None``; never our seq."""
    retry_ms: int | None = None
    """A ``retry`` value seen in this event's block, in milliseconds, or ``None``."""


class JSONFrame(msgspec.Struct, frozen=True, kw_only=True):
    """One complete JSON value received outside SSE ``data:`` framing."""

    text: str
    """The JSON text, exactly as received (not parsed)."""


class ErrorFrame(msgspec.Struct, frozen=True, kw_only=True):
    """An error reported by the body's framing (not by the provider's event vocabulary)."""

    category: ErrorCategory
    """The contract error category."""
    retryable: bool
    """Whether another attempt may succeed."""
    provider_code: str | None
    """The provider's name for the error (``throttlingException``, an ``:error-code``)."""
    message: str
    """The provider's message (the normalizer masks secrets and cuts it)."""


Frame = SSEFrame | JSONFrame
"""A provider event an adapter parses."""

AnyFrame = SSEFrame | JSONFrame | ErrorFrame
"""Anything an adapter's ``feed`` accepts."""
