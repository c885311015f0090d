"""AWS event-stream header blocks: bytes of one message's headers → a dict of typed values.

One job: parse the header block :class:`~worker.eventstream.EventStreamDecoder` cut out of
a message, checking every length against the block and every name and string for UTF-8,
and remember the few distinct blocks Bedrock repeats. Framing, sizes and CRCs are
:mod:`worker.eventstream`'s job.

Layout of one header (boto/botocore ``botocore/eventstream.py``; UPSTREAMS.md C.2): name
length (uint8), name (UTF-8), value type (uint8), value. Value types: 0 true, 1 false (no
bytes), 2 int8, 3 int16, 4 int32, 5 int64, 6 byte array (uint16 length + bytes), 7
string (uint16 length + UTF-8), 8 timestamp (int64 milliseconds since the epoch), 9 UUID
(16 bytes); integers big-endian.

Pure: imports no asyncio, aiohttp, redis or opentelemetry.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Final

from schema.errors import UpstreamProtocolError

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

_Reader = Callable[[bytes, int, int], tuple[HeaderValue, int]]


def malformed(offset: int, what: str) -> UpstreamProtocolError:
    """Return the error for a malformed message starting at body byte ``offset``."""
    return UpstreamProtocolError(f"malformed event-stream message at byte {offset}: {what}")


class HeaderParser:
    """Parses the header blocks of one body's messages; remembers repeated blocks."""

    def __init__(self) -> None:
        self._offset = 0
        """Body offset of the message whose headers are being parsed (for error messages)."""
        self._seen: dict[bytes, dict[str, HeaderValue]] = {}
        """Header block bytes → parsed headers (:data:`HEADER_CACHE_ENTRIES`)."""
        self._values: dict[int, _Reader] = {
            0: lambda data, pos, base: (True, pos),
            1: lambda data, pos, base: (False, pos),
            **{kind: self._int_reader(kind) for kind in _INTS},
            6: self._read_bytes,
            7: self._read_string,
            8: self._read_timestamp,
            9: self._read_uuid,
        }

    def parse(self, data: bytes, *, message_at: int, block_at: int) -> dict[str, HeaderValue]:
        """Parse a header block, or copy the result of an identical earlier one.

        Args:
            data: The whole header block of one message (``headers_length`` bytes).
            message_at: Body offset of that message, named in errors.
            block_at: Body offset of the header block (where a cut header is reported).

        Returns:
            Headers by name, in wire order (a new dict each call).

        Raises:
            UpstreamProtocolError: A header cut short, duplicated, with an empty name, of
                an unknown value type, not UTF-8, or a timestamp out of range.
        """
        known = self._seen.get(data)
        if known is not None:
            return dict(known)
        self._offset = message_at
        headers = self._headers(data, block_at)
        if len(data) <= HEADER_CACHE_MAX_BYTES and len(self._seen) < HEADER_CACHE_ENTRIES:
            self._seen[data] = dict(headers)
        return headers

    def _headers(self, data: bytes, base: int) -> dict[str, HeaderValue]:
        headers: dict[str, HeaderValue] = {}
        pos = 0
        while pos < len(data):
            name, pos = self._name(data, pos, base)
            if name in headers:
                raise malformed(self._offset, f"duplicate header {name!r}")
            self._need(data, pos, 1, base)
            reader = self._values.get(data[pos])
            if reader is None:
                raise malformed(self._offset, f"header {name!r} has unknown value type {data[pos]}")
            headers[name], pos = reader(data, pos + 1, base)
        return headers

    def _need(self, data: bytes, pos: int, size: int, base: int) -> None:
        if pos + size > len(data):
            raise malformed(self._offset, f"header cut at byte {base + pos}")

    def _name(self, data: bytes, pos: int, base: int) -> tuple[str, int]:
        size = data[pos]
        self._need(data, pos + 1, size, base)
        if size == 0:
            raise malformed(self._offset, "empty header name")
        return self._utf8(data[pos + 1 : pos + 1 + size], "header name"), pos + 1 + size

    def _utf8(self, raw: bytes, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise malformed(self._offset, f"{what} is not UTF-8") from exc

    def _int_reader(self, kind: int) -> _Reader:
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
            raise malformed(self._offset, "timestamp header out of range") from exc

    def _read_uuid(self, data: bytes, pos: int, base: int) -> tuple[HeaderValue, int]:
        self._need(data, pos, 16, base)
        return uuid.UUID(bytes=data[pos : pos + 16]), pos + 16
