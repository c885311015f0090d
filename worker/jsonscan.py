r"""Byte-level scanning shared by the framing decoders (``worker.sse``, ``worker.jsonarray``).

One job: find where things end in a byte stream without parsing it. :class:`DepthScanner`
finds where one JSON value ends, tracking nesting depth and string/escape state so that
braces, brackets and quotes inside strings are not counted; :class:`LeadingBOM` strips a
single UTF-8 byte order mark that may itself arrive split across reads.

Both work on UTF-8 *bytes*: every byte they look for (``{ } [ ] " \``, whitespace,
delimiters) is ASCII, and UTF-8 never uses an ASCII byte inside a multi-byte sequence,
so a read boundary inside a character cannot confuse them and callers decode each
complete value once. Pure: imports no I/O (no asyncio, aiohttp, redis or opentelemetry).
"""

from __future__ import annotations

import re
from typing import Final

UTF8_BOM: Final = b"\xef\xbb\xbf"
"""The UTF-8 encoding of U+FEFF."""

_VALUE_START: Final = re.compile(rb"[^ \t\r\n]")
# The rest of a string: runs of ordinary bytes and escape pairs, then the closing quote
# (group 1) unless the piece ends first (possibly right after a lone backslash).
_STRING_TAIL: Final = rb'[^"\\]*(?:\\.[^"\\]*)*(")?'
_STRING_REST: Final = re.compile(_STRING_TAIL, re.DOTALL)
_NESTED_TOKEN: Final = re.compile(rb'[\[\]{}]|"' + _STRING_TAIL, re.DOTALL)
_SCALAR_STOP: Final = re.compile(rb"[ \t\r\n,\]}]")

_QUOTE: Final = 0x22
_OPENERS: Final = frozenset(b"[{")

_BEFORE, _NESTED, _SCALAR, _DONE = range(4)


class DepthScanner:
    """Finds where one JSON value ends, across any number of pieces of its bytes.

    Feed the pieces of one value in order to :meth:`scan`; it keeps the nesting depth,
    whether it is inside a string and whether the previous byte was an escaping
    backslash, so each byte is looked at once. Runs of ordinary bytes are skipped with a
    regular expression. Leading JSON whitespace before the value is skipped.

    It validates nothing beyond what it needs: mismatched brackets or bad literals pass
    through, and the caller's JSON parser rejects them later. A number, ``true``,
    ``false`` or ``null`` ends at the first JSON whitespace, ``,``, ``]`` or ``}`` after
    it, so a scalar at the very end of the input never reports an end.

    Follows RFC 8259 (JSON) sections 2, 3 and 7 for what a value, a string and an
    escape are.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the current value; the next :meth:`scan` starts a new one."""
        self._mode = _BEFORE
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def scan(self, data: bytes, pos: int = 0) -> int:
        """Consume ``data[pos:]``, the next piece of the current value.

        Args:
            data: UTF-8 bytes; may be empty or end anywhere, even inside an escape.
            pos: Index in ``data`` to start from.

        Returns:
            The index in ``data`` just past the value's last byte (for a scalar: the
            index of the delimiter that ended it, which is not consumed), or ``-1``
            when the value has not ended within ``data`` (scan the next piece).

        Raises:
            RuntimeError: Called again after the value ended without :meth:`reset`
                (the caller's bug).
        """
        if self._mode == _DONE:
            raise RuntimeError("DepthScanner.scan after the value ended; call reset() first")
        if self._mode == _BEFORE:
            pos = self._start(data, pos)
            if pos < 0:
                return -1
        scan = self._scan_scalar if self._mode == _SCALAR else self._scan_nested
        end = scan(data, pos)
        if end >= 0:
            self._mode = _DONE
        return end

    def _start(self, data: bytes, pos: int) -> int:
        match = _VALUE_START.search(data, pos)
        if match is None:
            return -1
        pos = match.start()
        first = data[pos]
        if first in _OPENERS:
            self._mode, self._depth = _NESTED, 1
            return pos + 1
        if first == _QUOTE:
            self._mode, self._in_string = _NESTED, True
            return pos + 1
        self._mode = _SCALAR
        return pos

    @staticmethod
    def _scan_scalar(data: bytes, pos: int) -> int:
        match = _SCALAR_STOP.search(data, pos)
        return -1 if match is None else match.start()

    def _scan_nested(self, data: bytes, pos: int) -> int:
        if self._in_string:
            pos = self._finish_string(data, pos)
            if pos < 0 or self._depth == 0:
                return pos
        while True:
            match = _NESTED_TOKEN.search(data, pos)
            if match is None:
                return -1
            pos = match.end()
            byte = data[match.start()]
            if byte != _QUOTE:
                self._depth += 1 if byte in _OPENERS else -1
                if self._depth == 0:
                    return pos
            elif match.group(1) is None:  # the string goes on in the next piece
                self._in_string = True
                self._escaped = pos < len(data)  # stopped before a lone trailing backslash
                return -1

    def _finish_string(self, data: bytes, pos: int) -> int:
        """Continue an open string; index past its closing quote, or -1."""
        if self._escaped:
            if pos >= len(data):
                return -1
            self._escaped, pos = False, pos + 1
        match = _STRING_REST.match(data, pos)
        assert match is not None  # every part of the pattern may match empty
        if match.group(1) is None:
            self._escaped = match.end() < len(data)
            return -1
        self._in_string = False
        return match.end()


class LeadingBOM:
    """Strips one UTF-8 byte order mark at the start of a body, even when split across reads.

    Bytes that could still be the start of a BOM are held back until three bytes have
    arrived (or the prefix stops matching); they are then dropped if they are the BOM
    and released otherwise. Only the first BOM is stripped.

    Follows WHATWG HTML, "Interpreting an event stream" (one leading U+FEFF is ignored)
    and RFC 8259 section 8.1 (a parser may ignore a leading BOM).
    """

    def __init__(self) -> None:
        self._head = b""
        self._decided = False

    @property
    def pending(self) -> bytes:
        """Bytes held back as a possible partial BOM (at most 2; empty once decided)."""
        return self._head

    def strip(self, chunk: bytes) -> bytes:
        """Return ``chunk`` without the leading BOM, holding back a possible partial one.

        Args:
            chunk: The next read of the body; may be empty.

        Returns:
            The bytes to process now; empty while the BOM is still undecided.
        """
        if self._decided:
            return chunk
        head = self._head + chunk
        if len(head) < len(UTF8_BOM) and UTF8_BOM.startswith(head):
            self._head = head
            return b""
        self._decided, self._head = True, b""
        return head[len(UTF8_BOM) :] if head.startswith(UTF8_BOM) else head
