"""AWS event-stream framing: turns an ``application/vnd.amazon.eventstream`` body into messages.

One job: cut the binary body Bedrock's streaming operations answer with
(InvokeModelWithResponseStream, ConverseStream) into :class:`EventStreamMessage`
objects, whatever the read boundaries, checking both CRCs and the size limits before
buffering a message. What the messages mean is :mod:`worker.bedrock_frames`' job.

Layout of one message, integers big-endian (boto/botocore ``botocore/eventstream.py``;
awslabs/aws-c-event-stream ``include/aws/event-stream/event_stream.h``; UPSTREAMS.md C.2)::

    offset        size           field
    0             4              total_length: the whole message, prelude and trailing CRC included
    4             4              headers_length
    8             4              prelude_crc: CRC32 (zlib/IEEE) of bytes 0-7
    12            headers_length headers: name length (uint8), name (UTF-8), value type (uint8), value
    12+h          total-h-16     payload
    total-4       4              message_crc: CRC32 of bytes 0 .. total-5

Header value types: 0 true, 1 false (no bytes), 2 int8, 3 int16, 4 int32, 5 int64,
6 byte array (uint16 length + bytes), 7 string (uint16 length + UTF-8), 8 timestamp
(int64 milliseconds since the epoch), 9 UUID (16 bytes).

Pure: imports no asyncio, aiohttp, redis or opentelemetry.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Final

import msgspec

from schema.errors import FrameTooLargeError, UpstreamProtocolError

PRELUDE_BYTES: Final = 12
"""Bytes of the prelude: total length, headers length, prelude CRC."""
CRC_BYTES: Final = 4
"""Bytes of the trailing message CRC."""
MAX_HEADERS_BYTES: Final = 128 * 1024
"""Largest ``headers_length`` the format allows (botocore ``_MAX_HEADERS_LENGTH``)."""
MAX_PAYLOAD_BYTES: Final = 16 * 1024 * 1024
"""Largest payload the format allows (botocore ``_MAX_PAYLOAD_LENGTH``)."""
DEFAULT_MAX_MESSAGE_BYTES: Final = 8 * 1024 * 1024
"""Default limit of one whole message (``FANOUT_MAX_FRAME_BYTES``)."""
HEADER_CACHE_ENTRIES: Final = 32
"""Distinct header blocks remembered per decoder: Bedrock repeats the same few blocks
(``:event-type``, ``:content-type``, ``:message-type``) on every message, so each is
parsed once (decode_bench: about 3x the messages per second)."""
HEADER_CACHE_MAX_BYTES: Final = 512
"""Longest header block that is remembered."""

HeaderValue = bool | int | bytes | str | datetime | uuid.UUID
"""A decoded header value: bool (types 0, 1), int (2-5), bytes (6), str (7),
datetime in UTC (8), UUID (9)."""

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_INTS: Final[dict[int, struct.Struct]] = {2: struct.Struct(">b"), 3: struct.Struct(">h"),
                                           4: struct.Struct(">i"), 5: struct.Struct(">q")}
_LENGTH: Final = struct.Struct(">H")
_PRELUDE: Final = struct.Struct(">III")
_CRC: Final = struct.Struct(">I")


class EventStreamMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One decoded event-stream message."""

    headers: dict[str, HeaderValue]
    """Headers by name, in wire order."""
    payload: bytes
    """The payload bytes (Bedrock: JSON), possibly empty."""

    def _text(self, name: str) -> str | None:
        value = self.headers.get(name)
        return value if isinstance(value, str) else None

    @property
    def message_type(self) -> str:
        """``:message-type``: ``event``, ``exception`` or ``error`` (``event`` when absent)."""
        return self._text(":message-type") or "event"

    @property
    def event_type(self) -> str | None:
        """``:event-type`` of an ``event`` message (``chunk``, ``contentBlockDelta``, ...)."""
        return self._text(":event-type")

    @property
    def exception_type(self) -> str | None:
        """``:exception-type`` of an ``exception`` message (``throttlingException``, ...)."""
        return self._text(":exception-type")

    @property
    def content_type(self) -> str | None:
        """``:content-type`` of the payload (``application/json``)."""
        return self._text(":content-type")

    @property
    def error_code(self) -> str | None:
        """``:error-code`` of an ``error`` message (unmodeled errors)."""
        return self._text(":error-code")

    @property
    def error_message(self) -> str | None:
        """``:error-message`` of an ``error`` message."""
        return self._text(":error-message")


class EventStreamEnd(msgspec.Struct, frozen=True, kw_only=True):
    """What :meth:`EventStreamDecoder.close` reports at the end of the body."""

    truncated: bool
    """True when the body ended inside a message (its bytes were discarded)."""


def _bad(offset: int, what: str) -> UpstreamProtocolError:
    return UpstreamProtocolError(f"malformed event-stream message at byte {offset}: {what}")


class EventStreamDecoder:
    """Sans-I/O decoder of one ``application/vnd.amazon.eventstream`` body: feed bytes, get messages.

    Args:
        max_message_bytes: Limit of one whole message (``total_length``), checked from
            the prelude before the rest of the message is buffered. Reaching it exactly
            is allowed.

    Follows the AWS event-stream encoding as implemented by boto/botocore
    ``botocore/eventstream.py`` and awslabs/aws-c-event-stream.
    """

    def __init__(self, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self._max_message_bytes = max_message_bytes
        self._buf = bytearray()
        self._total: int | None = None
        """``total_length`` of the message being buffered, once its prelude checked out."""
        self._offset = 0
        """Body offset of the message being read (for error messages)."""
        self._failure: UpstreamProtocolError | None = None
        self._seen_headers: dict[bytes, dict[str, HeaderValue]] = {}
        """Header block bytes → parsed headers (:data:`HEADER_CACHE_ENTRIES`)."""
        self._values: dict[int, Callable[[bytes, int, int], tuple[HeaderValue, int]]] = {
            0: lambda data, pos, base: (True, pos),
            1: lambda data, pos, base: (False, pos),
            **{kind: self._int_reader(kind) for kind in _INTS},
            6: self._read_bytes,
            7: self._read_string,
            8: self._read_timestamp,
            9: self._read_uuid,
        }

    def feed(self, chunk: bytes) -> list[EventStreamMessage]:
        """Consume one network read and return the messages it completed.

        When an error comes after messages completed earlier in the same chunk, those
        messages are returned first and the error is raised by the next call; once an
        error has been raised or deferred, every later call raises it again.

        Args:
            chunk: Any slice of the body, possibly empty, possibly ending inside a prelude,
                a header or a CRC.

        Returns:
            Complete messages in arrival order; often empty.

        Raises:
            FrameTooLargeError: A prelude announces a message longer than
                ``max_message_bytes``. The stream cannot continue; the adapter ends it
                as ``failed``/``protocol``.
            UpstreamProtocolError: A prelude or message CRC mismatch, impossible lengths,
                a header that is cut, duplicated, of an unknown value type or not UTF-8
                (same handling).
        """
        if self._failure is not None:
            raise self._failure
        messages: list[EventStreamMessage] = []
        pos = 0
        try:
            while pos < len(chunk):
                pos = self._step(chunk, pos, messages)
        except UpstreamProtocolError as exc:
            self._failure = exc
            if not messages:
                raise
        return messages

    def close(self) -> EventStreamEnd:
        """End the body; report whether it ended inside a message.

        Raises:
            UpstreamProtocolError: An error deferred by :meth:`feed`.
        """
        if self._failure is not None:
            raise self._failure
        return EventStreamEnd(truncated=bool(self._buf))

    # -- framing ------------------------------------------------------------

    def _step(self, data: bytes, pos: int, out: list[EventStreamMessage]) -> int:
        """Consume bytes of ``data`` from ``pos``; return the new position."""
        if not self._buf and len(data) - pos >= PRELUDE_BYTES:
            total = self._check_prelude(data, pos)
            if len(data) - pos >= total:  # the whole message is in this read: no copy
                out.append(self._message(memoryview(data)[pos : pos + total]))
                return pos + total
            self._total = total
        want = self._total or PRELUDE_BYTES
        take = min(want - len(self._buf), len(data) - pos)
        self._buf += data[pos : pos + take]
        pos += take
        if self._total is None and len(self._buf) == PRELUDE_BYTES:
            self._total = self._check_prelude(bytes(self._buf), 0)
        if self._total is not None and len(self._buf) == self._total:
            message = self._message(memoryview(bytes(self._buf)))
            self._buf.clear()
            self._total = None
            out.append(message)
        return pos

    def _check_prelude(self, data: bytes, pos: int) -> int:
        """Validate the prelude at ``pos``; return ``total_length``."""
        total, headers, crc = _PRELUDE.unpack_from(data, pos)
        if zlib.crc32(memoryview(data)[pos : pos + 8]) != crc:
            raise _bad(self._offset, "prelude CRC mismatch")
        if total > self._max_message_bytes:
            raise FrameTooLargeError(
                f"event-stream message at byte {self._offset} of {total} bytes exceeds "
                f"max_message_bytes={self._max_message_bytes} bytes"
            )
        if total < PRELUDE_BYTES + CRC_BYTES or headers > total - PRELUDE_BYTES - CRC_BYTES:
            raise _bad(self._offset, f"total_length {total} cannot hold headers_length {headers}")
        if headers > MAX_HEADERS_BYTES:
            raise _bad(self._offset, f"headers_length {headers} exceeds {MAX_HEADERS_BYTES} bytes")
        if total - headers - PRELUDE_BYTES - CRC_BYTES > MAX_PAYLOAD_BYTES:
            raise _bad(self._offset, f"payload exceeds {MAX_PAYLOAD_BYTES} bytes")
        return int(total)

    def _message(self, view: memoryview) -> EventStreamMessage:
        """Check the message CRC of one whole message and decode it."""
        total = len(view)
        (crc,) = _CRC.unpack_from(view, total - CRC_BYTES)
        if zlib.crc32(view[: total - CRC_BYTES]) != crc:
            raise _bad(self._offset, "message CRC mismatch")
        (headers_length,) = _CRC.unpack_from(view, 4)
        end = PRELUDE_BYTES + headers_length
        message = EventStreamMessage(
            headers=self._cached_headers(bytes(view[PRELUDE_BYTES:end])),
            payload=bytes(view[end : total - CRC_BYTES]),
        )
        self._offset += total
        return message

    # -- headers ------------------------------------------------------------

    def _cached_headers(self, data: bytes) -> dict[str, HeaderValue]:
        """Parse a header block, or copy the result of an identical earlier one."""
        known = self._seen_headers.get(data)
        if known is not None:
            return dict(known)
        headers = self._headers(data)
        if len(data) <= HEADER_CACHE_MAX_BYTES and len(self._seen_headers) < HEADER_CACHE_ENTRIES:
            self._seen_headers[data] = dict(headers)
        return headers

    def _headers(self, data: bytes) -> dict[str, HeaderValue]:
        headers: dict[str, HeaderValue] = {}
        pos = 0
        base = self._offset + PRELUDE_BYTES
        while pos < len(data):
            name, pos = self._name(data, pos, base)
            if name in headers:
                raise _bad(self._offset, f"duplicate header {name!r}")
            self._need(data, pos, 1, base)
            reader = self._values.get(data[pos])
            if reader is None:
                raise _bad(self._offset, f"header {name!r} has unknown value type {data[pos]}")
            headers[name], pos = reader(data, pos + 1, base)
        return headers

    def _need(self, data: bytes, pos: int, size: int, base: int) -> None:
        if pos + size > len(data):
            raise _bad(self._offset, f"header cut at byte {base + pos}")

    def _name(self, data: bytes, pos: int, base: int) -> tuple[str, int]:
        size = data[pos]
        self._need(data, pos + 1, size, base)
        if size == 0:
            raise _bad(self._offset, "empty header name")
        return self._utf8(data[pos + 1 : pos + 1 + size], "header name"), pos + 1 + size

    def _utf8(self, raw: bytes, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _bad(self._offset, f"{what} is not UTF-8") from exc

    def _int_reader(self, kind: int) -> Callable[[bytes, int, int], tuple[HeaderValue, int]]:
        layout = _INTS[kind]

        def read(data: bytes, pos: int, base: int) -> tuple[HeaderValue, int]:
            self._need(data, pos, layout.size, base)
            return layout.unpack_from(data, pos)[0], pos + layout.size

        return read

    def _sized(self, data: bytes, pos: int, base: int) -> tuple[bytes, int]:
        self._need(data, pos, 2, base)
        (size,) = _LENGTH.unpack_from(data, pos)
        self._need(data, pos + 2, size, base)
        return data[pos + 2 : pos + 2 + size], pos + 2 + size

    def _read_bytes(self, data: bytes, pos: int, base: int) -> tuple[HeaderValue, int]:
        return self._sized(data, pos, base)

    def _read_string(self, data: bytes, pos: int, base: int) -> tuple[HeaderValue, int]:
        raw, pos = self._sized(data, pos, base)
        return self._utf8(raw, "string header value"), pos

    def _read_timestamp(self, data: bytes, pos: int, base: int) -> tuple[HeaderValue, int]:
        layout = _INTS[5]
        self._need(data, pos, layout.size, base)
        (millis,) = layout.unpack_from(data, pos)
        try:
            return _EPOCH + timedelta(milliseconds=millis), pos + layout.size
        except OverflowError as exc:
            raise _bad(self._offset, "timestamp header out of range") from exc

    def _read_uuid(self, data: bytes, pos: int, base: int) -> tuple[HeaderValue, int]:
        self._need(data, pos, 16, base)
        return uuid.UUID(bytes=data[pos : pos + 16]), pos + 16
