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

The header block is parsed by :mod:`worker.eventstream_headers` (value types, cache).

Pure: imports no asyncio, aiohttp, redis or opentelemetry.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

import msgspec

from schema.errors import FrameTooLargeError, UpstreamProtocolError
from worker.eventstream_headers import HeaderParser, HeaderValue, malformed

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
        self._headers = HeaderParser()

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
            raise malformed(self._offset, "prelude CRC mismatch")
        if total > self._max_message_bytes:
            raise FrameTooLargeError(
                f"event-stream message at byte {self._offset} of {total} bytes exceeds "
                f"max_message_bytes={self._max_message_bytes} bytes"
            )
        if total < PRELUDE_BYTES + CRC_BYTES or headers > total - PRELUDE_BYTES - CRC_BYTES:
            raise malformed(self._offset, f"total_length {total} cannot hold headers_length {headers}")
        if headers > MAX_HEADERS_BYTES:
            raise malformed(self._offset, f"headers_length {headers} exceeds {MAX_HEADERS_BYTES} bytes")
        if total - headers - PRELUDE_BYTES - CRC_BYTES > MAX_PAYLOAD_BYTES:
            raise malformed(self._offset, f"payload exceeds {MAX_PAYLOAD_BYTES} bytes")
        return int(total)

    def _message(self, view: memoryview) -> EventStreamMessage:
        """Check the message CRC of one whole message and decode it."""
        total = len(view)
        (crc,) = _CRC.unpack_from(view, total - CRC_BYTES)
        if zlib.crc32(view[: total - CRC_BYTES]) != crc:
            raise malformed(self._offset, "message CRC mismatch")
        (headers_length,) = _CRC.unpack_from(view, 4)
        end = PRELUDE_BYTES + headers_length
        message = EventStreamMessage(
            headers=self._headers.parse(bytes(view[PRELUDE_BYTES:end]), message_at=self._offset,
                                        block_at=self._offset + PRELUDE_BYTES),
            payload=bytes(view[end : total - CRC_BYTES]),
        )
        self._offset += total
        return message
