r"""JSON-array framing: splits a streamed top-level JSON array into its elements.

One job: Gemini ``streamGenerateContent`` without ``alt=sse`` writes one JSON array
incrementally (``[`` + object + ``\n,\r\n`` + object ... + ``\n]``, PROVIDERS.md 5.1);
this module hands each element's text to the adapter as a
:class:`~worker.frames.JSONFrame` as soon as it is complete, whatever the read
boundaries. Elements are found on bytes (every structural byte is ASCII, never part of
a UTF-8 multi-byte sequence) and each complete element is decoded once, with U+FFFD
for invalid bytes. Pure: imports no I/O (no asyncio, aiohttp, redis or opentelemetry).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

import msgspec

from schema.errors import FrameTooLargeError, UpstreamProtocolError
from worker.frames import JSONFrame
from worker.jsonscan import DepthScanner, LeadingBOM

DEFAULT_MAX_ELEMENT_BYTES: Final = 8 * 1024 * 1024
"""Default limit for one array element, in bytes."""

_NON_BLANK: Final = re.compile(rb"[^ \t\r\n]")
_VALUE_START: Final = frozenset(b'[{"-0123456789tfn')

# Where the decoder is in the array's grammar.
_OPEN = "before '['"
_FIRST = "after '['"
_VALUE = "inside an element"
_AFTER = "after an element"
_NEXT = "after ','"
_CLOSED = "after ']'"


class ArrayEnd(msgspec.Struct, frozen=True, kw_only=True):
    """What :meth:`JSONArrayDecoder.close` reports at the end of the body."""

    frames: list[JSONFrame]
    """Elements completed by the end of the body (always empty: ``feed`` emits them)."""
    closed: bool
    """True when the array's closing ``]`` arrived."""
    truncated: bool
    """True when a partial element was cut off, or the body held nothing or only ``[``."""


class JSONArrayDecoder:
    """Sans-I/O decoder of one streamed JSON array body: feed it bytes, get elements.

    Args:
        max_element_bytes: Limit for one element's bytes (surrounding whitespace and
            separators excluded). Reaching it exactly is allowed.

    Accepts a leading UTF-8 BOM and JSON whitespace anywhere between tokens. Elements
    may be any JSON value; braces, brackets and quotes inside strings (escaped quotes
    and backslashes included) are not counted. Element text is passed on exactly as
    received, not validated.

    Follows RFC 8259 (JSON) section 5 (arrays) and PROVIDERS.md 5.1.
    """

    def __init__(self, max_element_bytes: int = DEFAULT_MAX_ELEMENT_BYTES) -> None:
        self._max_element_bytes = max_element_bytes
        self._bom = LeadingBOM()
        self._scanner = DepthScanner()
        self._element = bytearray()
        self._state = _OPEN
        self._failure: UpstreamProtocolError | None = None
        self._offset = 0
        """Bytes of the body (after any BOM) consumed by earlier reads, for error messages."""
        self._steps: dict[str, Callable[[bytes, int, list[JSONFrame]], int]] = {
            _OPEN: self._expect_open,
            _FIRST: self._expect_value_or_close,
            _VALUE: self._continue_value,
            _AFTER: self._expect_comma_or_close,
            _NEXT: self._expect_value,
            _CLOSED: self._expect_nothing,
        }

    def feed(self, chunk: bytes) -> list[JSONFrame]:
        """Consume one network read and return the elements it completed.

        When an error comes after elements completed earlier in the same chunk, those
        elements are returned first and the error is raised by the next call; once an
        error has been raised or deferred, every later call raises it again.

        Args:
            chunk: Any slice of the response body, possibly empty, possibly ending
                inside a UTF-8 sequence, a string or an escape.

        Returns:
            One ``JSONFrame`` per completed element, in order; often empty.

        Raises:
            UpstreamProtocolError: Bytes that cannot belong to a JSON array here (not
                whitespace, ``[``, ``,``, ``]`` or a value start where one is due), or
                anything but whitespace after the closing ``]``. The stream cannot
                continue; the adapter ends it as ``failed``/``protocol``.
            FrameTooLargeError: An element exceeds ``max_element_bytes`` (same handling).

        Follows RFC 8259 (JSON) section 5 and PROVIDERS.md 5.1.
        """
        if self._failure is not None:
            raise self._failure
        data = self._bom.strip(chunk)
        frames: list[JSONFrame] = []
        pos = 0
        try:
            while pos < len(data):
                pos = self._steps[self._state](data, pos, frames)
            self._offset += len(data)
        except UpstreamProtocolError as exc:
            self._failure = exc
            if not frames:
                raise
        return frames

    def close(self) -> ArrayEnd:
        """End the body and report whether the array was complete.

        Returns:
            ``ArrayEnd``: ``frames`` (empty), ``closed`` (the ``]`` arrived) and
            ``truncated`` (a partial element, or nothing but ``[``, was pending).

        Raises:
            UpstreamProtocolError: An error deferred by :meth:`feed`.
        """
        if self._failure is not None:
            raise self._failure
        truncated = self._state in (_OPEN, _FIRST, _VALUE)
        return ArrayEnd(frames=[], closed=self._state == _CLOSED, truncated=truncated)

    def _expect_open(self, data: bytes, pos: int, frames: list[JSONFrame]) -> int:
        pos = self._token(data, pos)
        if pos < len(data):
            if data[pos] != 0x5B:  # "["
                raise self._unexpected(data, pos, "'['")
            self._state = _FIRST
            pos += 1
        return pos

    def _expect_value_or_close(self, data: bytes, pos: int, frames: list[JSONFrame]) -> int:
        pos = self._token(data, pos)
        if pos < len(data) and data[pos] == 0x5D:  # "]": an empty array
            self._state = _CLOSED
            return pos + 1
        return self._expect_value(data, pos, frames)

    def _expect_value(self, data: bytes, pos: int, frames: list[JSONFrame]) -> int:
        pos = self._token(data, pos)
        if pos < len(data):
            if data[pos] not in _VALUE_START:
                raise self._unexpected(data, pos, "a JSON value")
            self._scanner.reset()
            self._state = _VALUE
        return pos

    def _continue_value(self, data: bytes, pos: int, frames: list[JSONFrame]) -> int:
        end = self._scanner.scan(data, pos)
        stop = len(data) if end < 0 else end
        if len(self._element) + stop - pos > self._max_element_bytes:
            limit = self._max_element_bytes
            raise FrameTooLargeError(f"JSON array element exceeds max_element_bytes={limit} bytes")
        self._element += data[pos:stop]
        if end >= 0:
            frames.append(JSONFrame(text=self._element.decode("utf-8", "replace")))
            self._element.clear()
            self._state = _AFTER
        return stop

    def _expect_comma_or_close(self, data: bytes, pos: int, frames: list[JSONFrame]) -> int:
        pos = self._token(data, pos)
        if pos < len(data):
            if data[pos] not in b",]":
                raise self._unexpected(data, pos, "',' or ']'")
            self._state = _NEXT if data[pos] == 0x2C else _CLOSED
            pos += 1
        return pos

    def _expect_nothing(self, data: bytes, pos: int, frames: list[JSONFrame]) -> int:
        pos = self._token(data, pos)
        if pos < len(data):
            raise self._unexpected(data, pos, "nothing but whitespace")
        return pos

    @staticmethod
    def _token(data: bytes, pos: int) -> int:
        """Index of the next non-whitespace byte at or after ``pos``, or ``len(data)``."""
        match = _NON_BLANK.search(data, pos)
        return len(data) if match is None else match.start()

    def _unexpected(self, data: bytes, pos: int, wanted: str) -> UpstreamProtocolError:
        # Only the offending byte and its offset: the bytes after it depend on where the
        # read ended, and the message must not (the same body gives the same events).
        got, offset = data[pos : pos + 1], self._offset + pos
        return UpstreamProtocolError(
            f"malformed JSON array: expected {wanted} {self._state}, got {got!r} at byte {offset}"
        )
