"""Byte-level pieces of the SSE decoder (:mod:`worker.sse`): lines, the first-line check, the last event.

One job: the parts of reading an event stream that look at raw lines rather than at
events. :class:`LineSplitter` splits a body into lines on CR, LF and CRLF (never on
U+2028 or the other separators ``str.splitlines`` knows); :func:`not_sse` decides
whether a body's first non-empty line can start an event stream at all (PROVIDERS.md 1:
bytes that are not the expected framing are ``failed``/``protocol``, not a cut);
:func:`decodes_whole` decides whether a last event that lacks only its blank line may be
dispatched (PROVIDERS.md 1, "End of body", amended). Pure: imports no I/O (no asyncio,
aiohttp, redis or opentelemetry).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from typing import Final

import msgspec

from schema.errors import FrameTooLargeError, UpstreamProtocolError
from worker.jsonscan import LeadingBOM

SSE_FIELD_NAMES: Final = (b"data", b"event", b"id", b"retry")
"""The field names WHATWG defines; the first line of a body must use one (or be a comment or raw JSON)."""
_FIELD_NAME: Final = re.compile(rb"[A-Za-z0-9_.-]+")
_PROBE_BYTES: Final = 16
"""How many bytes of a refused first line an error message shows."""


def line_too_large(limit: int) -> FrameTooLargeError:
    """Return the error for a line over ``limit`` bytes (the same message wherever the reads end)."""
    # One message whether the line's terminator arrived in the same read or never: a line
    # longer than the limit is always unterminated at its limit-th byte, and the events
    # (this message included) must not depend on where a read ended.
    return FrameTooLargeError(f"SSE line exceeds max_frame_bytes={limit} bytes (still unterminated at the limit)")


def not_sse(line: bytes, *, complete: bool) -> UpstreamProtocolError | None:
    """Return the error for a body whose first non-empty line cannot start an SSE stream, else None.

    The line (BOM stripped) must be valid UTF-8 and a comment (``:``), the start of a raw
    JSON object (``{``), a field line whose name is a token (ASCII letters, digits, ``_``
    ``.`` ``-``) followed by ``:``, or a bare ``data``/``event``/``id``/``retry`` line.
    An incomplete line (the body ended inside it) passes while it can still become such a
    line: a cut is a transport matter, not a framing one.
    """
    try:
        codecs.getincrementaldecoder("utf-8")().decode(line, final=complete)
    except UnicodeDecodeError:
        return UpstreamProtocolError(f"upstream body is not an SSE stream: it is not UTF-8 text "
                                     f"(it starts {line[:_PROBE_BYTES]!r})")
    if line[:1] == b":" or line.lstrip(b" \t")[:1] == b"{":
        return None
    name, colon, _ = line.partition(b":")
    if _FIELD_NAME.fullmatch(name) and (colon or name in SSE_FIELD_NAMES or not complete):
        return None
    if not name and not complete:
        return None
    return UpstreamProtocolError(f"upstream body is not an SSE stream: its first line is not an SSE field "
                                 f"(it starts {line[:_PROBE_BYTES]!r})")


def decodes_whole(data: list[bytes]) -> bool:
    """Whether an event's ``data`` lines, joined with LF, are ``[DONE]`` or one valid JSON value."""
    if not data:
        return False
    joined = b"\n".join(data)
    if joined == b"[DONE]":
        return True
    try:
        msgspec.json.decode(joined)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


class LineSplitter:
    """Splits body bytes into lines on CR, LF or CRLF, a CRLF split across reads counting once."""

    def __init__(self, max_line_bytes: int) -> None:
        """Split lines of at most ``max_line_bytes`` bytes (terminator excluded)."""
        self._max_line_bytes = max_line_bytes
        self._bom = LeadingBOM()
        self._tail = bytearray()
        self._after_cr = False

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        """Yield each line completed by ``chunk``, without its terminator."""
        chunk = self._bom.strip(chunk)
        if self._after_cr and chunk:
            self._after_cr = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
        # bytes.splitlines splits on CR, LF and CRLF only (str.splitlines would also
        # split on U+2028, U+0085, VT, FF, ...).
        parts = chunk.splitlines(keepends=True)
        if parts and parts[-1][-1] == 0x0D:
            self._after_cr = True
        for part in parts:
            line = part.rstrip(b"\r\n")
            if len(line) == len(part):
                self._keep(line)
                return
            if self._tail:
                line = bytes(self._tail) + line
                self._tail.clear()
            if len(line) > self._max_line_bytes:
                raise line_too_large(self._max_line_bytes)
            yield line

    def close(self) -> bytes:
        """Return the bytes of the unfinished last line (empty for a clean end)."""
        return self._bom.pending + bytes(self._tail)

    def _keep(self, partial: bytes) -> None:
        if len(self._tail) + len(partial) > self._max_line_bytes:
            raise line_too_large(self._max_line_bytes)
        self._tail += partial
