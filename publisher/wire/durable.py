"""The Durable Streams read protocol's wire format: offsets, cursors, headers and bodies. Pure.

fanout serves a stream's stored events to Durable Streams clients in JSON mode: each
contract event (the JSON ``/events`` sends in ``data:``) is one message. A catch-up or
long-poll body is a JSON array of messages; an SSE ``data`` event holds such an array on
one ``data:`` line and is followed by a ``control`` event.

Offsets are opaque to clients but hold fanout's position: the last seq read, zero-padded
to :data:`OFFSET_DIGITS` digits so offsets of one generation sort lexicographically in
stream order, then ``.<epoch>`` when the stream's generation has one (contract 1.1)::

    0000000000000017.k3x9q2m0ab   after seq 17 of generation k3x9q2m0ab
    0000000000000000              the beginning (as the sentinel -1)

They never hold ``,&=?/`` and are never ``-1`` or ``now`` (the protocol's sentinels).
Imports no aiohttp, no redis, no asyncio.

Follows the Durable Streams Protocol (durable-streams/durable-streams ``PROTOCOL.md``),
sections 5.5 to 5.8 (reads), 8 (offsets), 9.1 (JSON mode), 10 (caching) and 12.7
(browser security headers), as checked against ``@durable-streams/client`` 0.2.7.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final, Literal, NamedTuple

import msgspec

from schema.contract import EPOCH_PATTERN
from schema.errors import ClientError

OFFSET_DIGITS: Final = 16
"""Digits of the seq inside an offset: every seq up to 2**53 (JavaScript's safe integers) fits."""
BEGINNING: Final = "-1"
"""The protocol's sentinel for the start of the stream."""
NOW: Final = "now"
"""The protocol's sentinel for the current tail."""
CONTENT_TYPE: Final = "application/json"
"""The content type of every fanout stream read this way (JSON mode, section 9.1)."""
SECURITY_HEADERS: Final = {"X-Content-Type-Options": "nosniff", "Cross-Origin-Resource-Policy": "same-origin"}
"""Section 12.7. ``same-origin`` only concerns no-cors loads (``<script>``, ``<img>``): CORS
``fetch`` reads, which the publisher's ``FANOUT_CORS_ORIGINS`` grant, are unaffected."""
SSE_HEADERS: Final = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                      **SECURITY_HEADERS}
"""Headers of an SSE read (section 5.8: exactly ``text/event-stream``; no proxy buffering)."""
CACHEABLE: Final = "private, max-age=60, stale-while-revalidate=300"
"""``Cache-Control`` of a catch-up chunk read from a minted offset: that range never changes,
and ``private`` because every stream is read with a credential (section 10.1). An offset
without its generation (a bare seq on a stream that has one) is not cached: its range
could be another generation's after a history reset."""
NO_STORE: Final = "no-store"
"""``Cache-Control`` of every other answer: the tail moves, a stream's start can be written again."""
EXPOSE_HEADERS: Final = ("Stream-Next-Offset", "Stream-Cursor", "Stream-Up-To-Date", "Stream-Closed", "ETag")
"""Response headers a browser reader must be able to see (``Access-Control-Expose-Headers``)."""
CURSOR_EPOCH_S: Final = 1_728_432_000
"""Start of cursor intervals: 2024-10-09T00:00:00Z, seconds (section 10.1's default)."""
CURSOR_INTERVAL_S: Final = 20
"""Length of one cursor interval, seconds (section 10.1's default)."""
MAX_CURSOR_DIGITS: Final = 18
"""A client ``cursor`` longer than this (or not decimal digits) is ignored."""
MAX_JITTER_S: Final = 3600
"""Most jitter added to a cursor the client already holds, seconds (section 10.1)."""

_EPOCH: Final = EPOCH_PATTERN.strip("^$")
_OFFSET: Final = re.compile(rf"([0-9]{{{OFFSET_DIGITS}}})(?:\.({_EPOCH}))?")
_CURSOR: Final = re.compile(rf"[0-9]{{1,{MAX_CURSOR_DIGITS}}}")
_encoder: Final = msgspec.json.Encoder()


class OffsetError(ClientError):
    """A client offset is neither a sentinel nor one this server mints: answer 400."""


class Offset(NamedTuple):
    """A position in a stream: the last seq read and the generation it was read in."""

    seq: int
    """Last seq read (0: nothing)."""
    epoch: str | None
    """The generation (contract 1.1); ``None`` when the offset names none (not checked)."""


def format_offset(seq: int, epoch: str | None) -> str:
    """Return the offset after ``seq`` of generation ``epoch`` (``None`` or ``""``: no suffix).

    Raises:
        ValueError: ``seq`` is negative or longer than :data:`OFFSET_DIGITS` digits.
    """
    if seq < 0 or seq >= 10**OFFSET_DIGITS:
        raise ValueError(f"seq {seq} does not fit an offset")
    return f"{seq:0{OFFSET_DIGITS}d}.{epoch}" if epoch else f"{seq:0{OFFSET_DIGITS}d}"


def parse_offset(raw: str) -> Offset | Literal["now"]:
    """Return the position a client offset names.

    Args:
        raw: The ``offset`` query parameter, as given (``-1``, ``now`` or a minted offset).

    Returns:
        ``"now"`` for the tail sentinel; else the position (``-1`` is seq 0, no epoch).

    Raises:
        OffsetError: Anything else (empty, other characters, non-ASCII digits, another
            length): the protocol's ``400 Bad Request`` for a malformed offset.
    """
    if raw == NOW:
        return NOW
    if raw == BEGINNING:
        return Offset(0, None)
    match = _OFFSET.fullmatch(raw)
    if match is None:
        raise OffsetError("an offset is -1, now, or a Stream-Next-Offset value this server returned")
    seq = int(match.group(1))
    return Offset(seq, match.group(2) if seq else None)


def response_cursor(client: str | None, now_s: float, jitter_s: int) -> str:
    """Return the ``Stream-Cursor`` of a live answer (section 10.1, "Server-Generated Cursors").

    Args:
        client: The request's ``cursor`` parameter; ignored unless 1 to
            :data:`MAX_CURSOR_DIGITS` decimal digits.
        now_s: Wall-clock time, seconds since the Unix epoch.
        jitter_s: Jitter to add when the client's cursor is not behind the current
            interval, seconds, 1 to :data:`MAX_JITTER_S` (the caller draws it).

    Returns:
        The current interval number, or one strictly greater than the client's cursor
        when that is not behind (so cursors never repeat and CDN cache keys move on).
    """
    current = int((now_s - CURSOR_EPOCH_S) // CURSOR_INTERVAL_S)
    if client is None or _CURSOR.fullmatch(client) is None or int(client) < current:
        return str(current)
    return str(int(client) + max(1, -(-jitter_s // CURSOR_INTERVAL_S)))


def json_array(messages: Sequence[bytes]) -> bytes:
    """Return the JSON-mode body of ``messages`` (each one event's JSON, one line): ``[m1,m2,...]``, maybe ``[]``."""
    return b"[" + b",".join(messages) + b"]"


def data_event(messages: Sequence[bytes]) -> bytes:
    """Return one SSE ``data`` event holding ``messages`` as a JSON array on one ``data:`` line."""
    return b"event: data\ndata: " + json_array(messages) + b"\n\n"


def control_event(next_offset: str, *, cursor: str | None, up_to_date: bool, closed: bool) -> bytes:
    """Return one SSE ``control`` event (section 5.8).

    Args:
        next_offset: The offset after what was sent.
        cursor: The ``streamCursor``; left out once the stream is closed.
        up_to_date: Everything stored was sent.
        closed: The terminal event was sent: ``streamClosed`` (and ``upToDate``) true.
    """
    control: dict[str, str | bool] = {"streamNextOffset": next_offset}
    if closed:
        control.update(upToDate=True, streamClosed=True)
    else:
        if cursor is not None:
            control["streamCursor"] = cursor
        if up_to_date:
            control["upToDate"] = True
    return b"event: control\ndata: " + _encoder.encode(control) + b"\n\n"


class ReadState(NamedTuple):
    """Where a read answer leaves its client."""

    next_offset: str
    """``Stream-Next-Offset``."""
    up_to_date: bool
    """Everything stored at answer time is included (``Stream-Up-To-Date``)."""
    closed: bool
    """The terminal event is included or was the client's position (``Stream-Closed``: EOF)."""


def read_headers(state: ReadState, *, cache_control: str, cursor: str | None = None,
                 etag: str | None = None) -> dict[str, str]:
    """Return the headers of a catch-up, long-poll or ``HEAD`` answer (sections 5.5 to 5.7).

    ``Vary: Authorization`` on every one: a public token's body leaves out internal
    reasoning that an API key's shows, so a cache must not hand one the other's answer.

    Args:
        state: Where the answer leaves the client.
        cache_control: :data:`CACHEABLE` or :data:`NO_STORE`.
        cursor: ``Stream-Cursor`` (live answers); left out once closed.
        etag: The ``ETag`` (catch-up answers, :func:`entity_tag`).
    """
    headers = {"Content-Type": CONTENT_TYPE, "Cache-Control": cache_control, "Stream-Next-Offset": state.next_offset,
               "Vary": "Authorization", **SECURITY_HEADERS}  # the credential decides the projection
    if state.up_to_date or state.closed:
        headers["Stream-Up-To-Date"] = "true"
    if state.closed:
        headers["Stream-Closed"] = "true"
    elif cursor is not None:
        headers["Stream-Cursor"] = cursor
    if etag is not None:
        headers["ETag"] = etag
    return headers


def entity_tag(scope: str, start: str, state: ReadState) -> str:
    """Return the ``ETag`` of a catch-up answer: who reads (scope), from where, to where, closed or not.

    The scope is in it because a public reader's body leaves out internal reasoning; the
    ``:c`` suffix makes the tag change when the stream closes (section 10.1).
    """
    return f'"{scope}:{start}:{state.next_offset}{":c" if state.closed else ""}"'


def none_match(header: str | None, tag: str) -> bool:
    """Return whether an ``If-None-Match`` header names ``tag`` (the answer is then ``304``).

    RFC 9110, section 13.1.2: ``*`` matches any current representation; otherwise the
    header is a comma-separated list of entity tags, compared weakly (a ``W/`` prefix,
    which a proxy adds when it transforms a body, is ignored on both sides).
    """
    if header is None:
        return False
    if header.strip() == "*":
        return True
    return tag.removeprefix("W/") in (part.strip().removeprefix("W/") for part in header.split(","))
