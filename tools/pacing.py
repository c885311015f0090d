"""Where a recorded provider body splits into provider events: the fake upstream's pacing unit.

``fanout upstream`` streams ``slow-<case>`` one provider event at a time, a pause between
events, so a slow stream shows every event arriving at a readable pace (a 10 KB answer is
no longer a hundred 96-byte chunks, most of them inside one event). Pure: bytes in, bytes
out; imports no asyncio, aiohttp or Redis.
"""

from __future__ import annotations

import itertools
import re
from typing import Final

_SSE_EVENT_END: Final = re.compile(rb"\r\n\r\n|\n\n|\r\r")
"""A blank line: the end of one SSE event (WHATWG HTML, "Interpreting an event stream")."""


def provider_events(body: bytes, *, json_array: bool) -> list[bytes]:
    """Split a recorded response body into one piece per provider event.

    Args:
        body: A whole recorded body: SSE (``text/event-stream``) or, with ``json_array``,
            a JSON array of objects (Gemini without ``alt=sse``).
        json_array: Whether ``body`` is a JSON array, split after each top-level element.

    Returns:
        Non-empty pieces whose concatenation is ``body`` exactly; an SSE piece ends with
        its event's blank line, a JSON array piece with its element's closing bracket
        (the separator and the final ``]`` start or end the next piece). A body with no
        boundary is one piece; an empty body is no piece.

    Follows WHATWG HTML, "9.2 Server-sent events" (an event ends at a blank line) and
    RFC 8259 (strings may hold brackets and escaped quotes).
    """
    cuts = _array_cuts(body) if json_array else [match.end() for match in _SSE_EVENT_END.finditer(body)]
    edges = [0, *(cut for cut in cuts if 0 < cut < len(body)), len(body)]
    return [body[start:end] for start, end in itertools.pairwise(edges) if end > start]


def _array_cuts(body: bytes) -> list[int]:
    """Return the offsets just after each element of the top-level JSON array closes."""
    cuts: list[int] = []
    depth, in_string, escaped = 0, False, False
    for offset, byte in enumerate(body):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash: the next byte is escaped
                escaped = True
            elif byte == 0x22:  # an unescaped quote ends the string
                in_string = False
            continue
        if byte == 0x22:
            in_string = True
        elif byte in b"[{":
            depth += 1
        elif byte in b"]}":
            depth -= 1
            if depth == 1:
                cuts.append(offset + 1)
    return cuts
