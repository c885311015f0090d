"""SSE framing: turns the bytes of a ``text/event-stream`` body into frames.

One job: split the body into lines, collect fields into events and dispatch them as
:class:`~worker.frames.SSEFrame` (WHATWG HTML, "Interpreting an event stream"), plus one
provider workaround: a raw JSON object written into the body without ``data:`` prefixes
(Gemini's error object, PROVIDERS.md 5.3) comes out as a :class:`~worker.frames.JSONFrame`.

Lines are split on bytes (CR, LF and CRLF only; UTF-8 never uses those bytes inside a
character) and each complete field value is decoded once with U+FFFD for invalid
bytes, which is what decoding the stream incrementally gives, without ever decoding half
a character and with exact byte counts for the size limits. Pure: imports no I/O (no
asyncio, aiohttp, redis or opentelemetry).

Two departures from WHATWG, both for real upstreams (PROVIDERS.md 1):

* A body that is not an event stream at all is refused (``failed``/``protocol``, never
  retried as a cut): its first non-empty line must be UTF-8 and a comment, a raw JSON
  object or a field line (:func:`worker.sse_lines.not_sse`). Only that line is checked; later lines
  keep WHATWG's rules (unknown fields ignored, invalid UTF-8 replaced).
* At a clean end, a terminated last event without its blank line is dispatched when
  its data decodes whole (:meth:`SSEDecoder.close`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import msgspec

from schema.errors import FrameTooLargeError, UpstreamProtocolError
from worker.frames import Frame, JSONFrame, SSEFrame
from worker.jsonscan import UTF8_BOM, DepthScanner
from worker.sse_lines import LineSplitter, decodes_whole, not_sse

DEFAULT_MAX_FRAME_BYTES: Final = 8 * 1024 * 1024
"""Default limit for one line, one event's data and one raw JSON object, in bytes."""

_MAX_RETRY_DIGITS: Final = 18
"""Longer ``retry`` values are ignored (beyond any sane delay, and int parsing limits)."""


class SSEEnd(msgspec.Struct, frozen=True, kw_only=True):
    """What :meth:`SSEDecoder.close` reports at the end of the body."""

    frames: list[Frame]
    """Frames completed by the end of the body (a raw JSON object closed on the last line)."""
    truncated: bool
    """True when an unfinished line, undispatched event or unclosed raw JSON object was cut."""


def _too_large(what: str, limit: int) -> FrameTooLargeError:
    return FrameTooLargeError(f"SSE {what} exceeds max_frame_bytes={limit} bytes")


class SSEDecoder:
    r"""Sans-I/O decoder of one SSE response body: feed it bytes, get frames.

    Args:
        max_frame_bytes: Limit, in bytes, for one line (terminator excluded), for one
            event's data (its ``data`` values joined with ``\n``) and for one raw JSON
            object. Reaching it exactly is allowed.

    Per event, fields accumulate until a blank line dispatches them: ``data`` values are
    joined with ``\n``, ``event`` names the frame (``message`` when absent, reset after
    each blank line), ``id`` sets the last event ID buffer, which persists across events
    (ignored when it contains NUL; an empty ``id`` resets it to ``None``), ``retry``
    (ASCII digits only) is reported on the frame of its own block. Comments (``:``) and
    unknown fields are ignored. A block without any ``data`` line dispatches nothing.

    At the start of an event (no field line since the last blank line), a line whose
    first non-blank byte is ``{`` starts a raw JSON object: lines are collected (joined
    with ``\n``) until the object closes, then emitted as one ``JSONFrame``.

    Follows WHATWG HTML, "Interpreting an event stream".
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._max_frame_bytes = max_frame_bytes
        self._lines = LineSplitter(max_frame_bytes)
        self._fields: dict[bytes, Callable[[bytes], None]] = {
            b"data": self._on_data,
            b"event": self._on_event,
            b"id": self._on_id,
            b"retry": self._on_retry,
        }
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._event = b""
        self._last_id: str | None = None
        self._retry_ms: int | None = None
        self._pending = False
        self._raw: list[bytes] | None = None
        self._raw_bytes = 0
        self._scanner = DepthScanner()
        self._failure: UpstreamProtocolError | None = None
        self._sniffed = False
        """Whether the first non-empty line was checked (:func:`worker.sse_lines.not_sse`)."""

    def feed(self, chunk: bytes) -> list[Frame]:
        """Consume one network read and return the frames it completed.

        When an error comes after frames completed earlier in the same chunk, those
        frames are returned first and the error is raised by the next call; once an
        error has been raised or deferred, every later call raises it again.

        Args:
            chunk: Any slice of the response body, possibly empty, possibly ending
                inside a UTF-8 sequence or between CR and LF.

        Returns:
            ``SSEFrame`` and ``JSONFrame`` objects in arrival order; often empty.

        Raises:
            FrameTooLargeError: A line, an event's data or a raw JSON object exceeds
                ``max_frame_bytes``. The stream cannot continue; the adapter ends it as
                ``failed``/``protocol``.
            UpstreamProtocolError: Bytes other than blanks follow a raw JSON object on
                its closing line (same handling).

        Follows WHATWG HTML, "Interpreting an event stream".
        """
        self._raise_failure()
        frames: list[Frame] = []
        try:
            for line in self._lines.feed(chunk):
                frame = self._take_line(line)
                if frame is not None:
                    frames.append(frame)
        except UpstreamProtocolError as exc:
            self._failure = exc
            if not frames:
                raise
        return frames

    def close(self) -> SSEEnd:
        """End the body: report the frame its last lines complete, and truncation.

        Call once, after the last :meth:`feed`. A half line at the end (no CR or LF after
        it) is a transport cut: discarded, never parsed, and the body counts as cut. A
        pending event whose lines were all terminated but which lacks only its
        dispatching blank line (a gateway dropped it) is dispatched when its data decodes
        whole: valid JSON, or ``[DONE]``; otherwise the body counts as cut
        (PROVIDERS.md 1, "End of body", amended; openai-node dispatches such an event,
        WHATWG discards it). A raw JSON object may close on a last line without a
        terminator; that frame is returned.

        Returns:
            ``SSEEnd``: ``frames`` (zero or one frame) and ``truncated``, True when bytes
            of an unfinished line, an undispatched event (whose data does not decode
            whole, or that has no data) or an unclosed raw JSON object were pending. A
            lone CR at the end ends a line.

        Raises:
            FrameTooLargeError: As in :meth:`feed`, for the last line or raw object.
            UpstreamProtocolError: As in :meth:`feed`, or an error deferred by it.

        Follows WHATWG HTML, "Interpreting an event stream" (end of file), amended as above.
        """
        self._raise_failure()
        tail = self._lines.close()
        refused = None if self._sniffed or UTF8_BOM.startswith(tail) else not_sse(tail, complete=False)
        if refused is not None:
            raise refused
        if tail and (self._raw is not None or self._begin_raw(tail)):
            frame = self._raw_line(tail)
            if frame is not None:
                return SSEEnd(frames=[frame], truncated=False)
        if not tail and self._raw is None and self._pending and decodes_whole(self._data):
            last = self._dispatch()
            return SSEEnd(frames=[last] if last is not None else [], truncated=False)
        truncated = bool(tail) or self._pending or self._raw is not None
        return SSEEnd(frames=[], truncated=truncated)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _take_line(self, line: bytes) -> Frame | None:
        if self._raw is not None:
            return self._raw_line(line)
        if not line:
            return self._dispatch()
        if not self._sniffed:
            self._sniffed = True
            if (refused := not_sse(line, complete=True)) is not None:
                raise refused
        if line[0] == 0x3A:  # ":" starts a comment
            return None
        if self._begin_raw(line):
            return self._raw_line(line)
        self._field(line)
        return None

    def _field(self, line: bytes) -> None:
        self._pending = True
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        handler = self._fields.get(name)
        if handler is not None:
            handler(value)

    def _on_data(self, value: bytes) -> None:
        size = self._data_bytes + len(value) + (1 if self._data else 0)
        if size > self._max_frame_bytes:
            raise _too_large("event data", self._max_frame_bytes)
        self._data.append(value)
        self._data_bytes = size

    def _on_event(self, value: bytes) -> None:
        self._event = value

    def _on_id(self, value: bytes) -> None:
        if b"\x00" not in value:
            self._last_id = value.decode("utf-8", "replace") or None

    def _on_retry(self, value: bytes) -> None:
        if value.isdigit() and len(value) <= _MAX_RETRY_DIGITS:
            self._retry_ms = int(value)

    def _dispatch(self) -> SSEFrame | None:
        data, event, retry_ms = self._data, self._event, self._retry_ms
        self._data, self._data_bytes, self._event, self._retry_ms = [], 0, b"", None
        self._pending = False
        if not data:
            return None
        return SSEFrame(
            event=event.decode("utf-8", "replace") or "message",
            data=b"\n".join(data).decode("utf-8", "replace"),
            id=self._last_id,
            retry_ms=retry_ms,
        )

    def _begin_raw(self, line: bytes) -> bool:
        """Enter raw-JSON mode if ``line`` opens an object at the start of an event."""
        if self._pending or not line.lstrip(b" \t").startswith(b"{"):
            return False
        self._raw, self._raw_bytes = [], 0
        self._scanner.reset()
        return True

    def _raw_line(self, line: bytes) -> JSONFrame | None:
        raw = self._raw
        assert raw is not None
        end = self._scanner.scan(line)
        piece = line if end < 0 else line[:end]
        self._raw_bytes += len(piece) + (1 if raw else 0)
        if self._raw_bytes > self._max_frame_bytes:
            raise _too_large("raw JSON object", self._max_frame_bytes)
        raw.append(piece)
        if end < 0:
            return None
        if line[end:].strip(b" \t"):
            raise UpstreamProtocolError(
                f"unexpected bytes after a raw JSON object in the SSE body: {line[end:][:40]!r}"
            )
        self._raw = None
        return JSONFrame(text=b"\n".join(raw).decode("utf-8", "replace"))
