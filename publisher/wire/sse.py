"""Server-sent events wire format: the bytes of one SSE message, heartbeat or hint. Pure.

Every message ends with a blank line; field values never hold CR or LF (WHATWG HTML,
"9.2.6 Interpreting an event stream": a line break ends a field). The stored event JSON
is compact, so it always fits one ``data:`` line; :func:`one_line` guarantees it.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

SSE_HEADERS: Final = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-store, no-transform",
    "X-Accel-Buffering": "no",
}
"""Headers of every event-stream response: not stored (a finished stream's say otherwise:
:mod:`publisher.api.caching`), no proxy transform or buffering."""

PING: Final = b": ping\n\n"
"""Heartbeat comment: never stored, never numbered, ignored by every SSE parser."""
GAP_EVENT: Final = "stream.gap"
"""Event name of the error frame sent when stored history no longer follows the cursor."""


def one_line(data: bytes) -> bytes:
    """Return ``data`` with no CR or LF, re-encoding JSON compactly when needed.

    Args:
        data: The JSON of one event as stored.

    Returns:
        The same JSON on one line (unchanged when it already is).

    Raises:
        msgspec.DecodeError: ``data`` holds a line break and is not JSON.
    """
    if b"\n" not in data and b"\r" not in data:
        return data
    return msgspec.json.encode(msgspec.json.decode(data))


def event_frame(seq: int, event_type: str, data: bytes) -> bytes:
    """Return one SSE message: ``id:`` = seq, ``event:`` = type, one ``data:`` line.

    Args:
        seq: The event's seq; becomes the client's ``Last-Event-ID``.
        event_type: The contract type (``block.delta``, ...), without CR or LF.
        data: One-line JSON of the event (see :func:`one_line`).
    """
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (seq, event_type.encode(), data)


def retry_frame(retry_ms: int) -> bytes:
    """Return the ``retry:`` hint (reconnection delay, milliseconds) sent first."""
    return b"retry: %d\n\n" % retry_ms


def error_frame(event_type: str, data: bytes) -> bytes:
    """Return an SSE message without an ``id:`` line, so ``Last-Event-ID`` stays on a real seq."""
    return b"event: %s\ndata: %s\n\n" % (event_type.encode(), data)


def comment_frame(text: str) -> bytes:
    """Return an SSE comment line (``: text``); ``text`` must hold no CR or LF."""
    return b": %s\n\n" % text.encode()


def busy_body(retry_ms: int, reason: str) -> bytes:
    """Return the whole body of an SSE answer to a request turned away for a transient reason.

    A ``retry:`` hint then one comment naming the reason (a problem slug such as
    ``too-many-connections``); the response then ends. WHATWG HTML "9.2.3 Processing
    model": only a 200 ``text/event-stream`` (or a network error) makes EventSource
    reconnect; any other status fails the connection for good.
    """
    return retry_frame(retry_ms) + comment_frame(f"busy: {reason}; reconnect after the retry delay")


def gap_data(stream_id: str, after_seq: int, next_seq: int | None, *, reset: bool = False) -> dict[str, Any]:
    """Return the data object of a ``stream.gap`` frame (schema/README.md, "SSE projection").

    Args:
        stream_id: The stream.
        after_seq: The last seq the response sent (the client's position).
        next_seq: The seq found instead of ``after_seq + 1``, or ``None``.
        reset: The stream now holds another generation: adds ``reason: history-reset``
            (contract 1.1), so a client knows its history is not the stream's any more.
    """
    data: dict[str, Any] = {"type": GAP_EVENT, "stream_id": stream_id, "after_seq": after_seq, "next_seq": next_seq}
    if reset:
        data["reason"] = "history-reset"
        data["detail"] = "the stream was written again as another generation; reconnect to get the cause"
    else:
        data["detail"] = "stored history no longer follows this position; reconnect to get the cause"
    return data
