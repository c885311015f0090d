"""The client's SSE parser: the publisher's response bytes in, SSE messages out. Pure.

Small on purpose: it reads what a fanout publisher sends (``retry:`` hints, ``id``/
``event``/``data`` messages, ``: ping`` comments), following the WHATWG rules so any
conforming server works: lines end at CR, LF or CRLF (a CR at the end of one read may
be the first half of a CRLF), a leading BOM is dropped, one space after the colon is
removed, a line without a colon is a field with an empty value, ``data`` lines join
with LF, a blank line dispatches. A message that set only ``retry`` is returned too, so
the caller learns the reconnection delay. The worker's hardened decoder for provider
bodies is another job (byte limits per frame, JSON framing) and stays in the server.

Follows WHATWG HTML, "9.2.6 Interpreting an event stream".
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

from fanout_client.errors import SSEProtocolError

MAX_LINE_BYTES: Final = 16 * 1024 * 1024
"""Default longest line accepted; the publisher's lines are one event's JSON each."""
_EOL: Final = re.compile(rb"\r\n|\r|\n")


class SSEMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One dispatched SSE message."""

    event: str = "message"
    """The ``event`` field, ``message`` when absent."""
    data: str | None = None
    """The ``data`` lines joined with LF; ``None`` when the message had no ``data`` line."""
    id: str | None = None
    """The ``id`` field of this message, or ``None``."""
    retry_ms: int | None = None
    """The ``retry`` field (milliseconds) of this message, or ``None``."""


class SSEParser:
    """Feed response bytes, get messages.

    Args:
        max_line_bytes: Longest line accepted, bytes; past it :meth:`feed` raises.
    """

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self._buffer = b""
        self._skip_lf = False
        self._started = False
        self._data: list[str] = []
        self._fields: dict[str, str] = {}

    def feed(self, chunk: bytes) -> list[SSEMessage]:
        """Consume one read of the body and return the messages it completed.

        Args:
            chunk: Any slice of the body, possibly empty or ending inside a line.

        Returns:
            Complete messages in order; often empty.

        Raises:
            SSEProtocolError: A line grew past ``max_line_bytes``; the body cannot be read on.
        """
        if not chunk:
            return []
        if self._skip_lf and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._skip_lf = False
        data = self._buffer + chunk
        out: list[SSEMessage] = []
        start = 0
        for match in _EOL.finditer(data):
            if match.group() == b"\r" and match.end() == len(data):
                self._skip_lf = True  # maybe the first half of a CRLF split across reads
            message = self._line(data[start:match.start()])
            if message is not None:
                out.append(message)
            start = match.end()
        self._buffer = data[start:]
        if len(self._buffer) > self.max_line_bytes:
            raise SSEProtocolError(f"an SSE line is longer than {self.max_line_bytes} bytes")
        return out

    def _line(self, raw: bytes) -> SSEMessage | None:
        if not self._started:
            self._started = True
            raw = raw.removeprefix(b"\xef\xbb\xbf")
        if len(raw) > self.max_line_bytes:
            raise SSEProtocolError(f"an SSE line is longer than {self.max_line_bytes} bytes")
        line = raw.decode("utf-8", errors="replace")
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name in ("event", "retry") or (name == "id" and "\0" not in value):
            self._fields[name] = value
        return None

    def _dispatch(self) -> SSEMessage | None:
        fields, data = self._fields, self._data
        self._fields, self._data = {}, []
        retry = fields.get("retry", "")
        retry_ms = int(retry) if retry.isascii() and retry.isdigit() else None
        if not data and retry_ms is None:
            return None
        return SSEMessage(event=fields.get("event") or "message", data="\n".join(data) if data else None,
                          id=fields.get("id"), retry_ms=retry_ms)
