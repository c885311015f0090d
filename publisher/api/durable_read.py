"""What every Durable Streams read of a stream shares: its parameters, its start, its messages.

:func:`parse_query` checks the protocol's parameters, :func:`resolve` checks the client's
offset against what Redis holds (the 404 and 410 answers of :mod:`publisher.api.durable`'s
table), :func:`messages` turns stored entries into the JSON messages a reader may see.

Follows the Durable Streams Protocol, sections 5.6 to 5.8 and 8.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from aiohttp import web

from publisher.api.positions import Position, check_epoch
from publisher.api.problems import FieldError, ProblemError
from publisher.api.projected import entry_json
from publisher.history.entries import Entry
from publisher.history.store import StreamInfo
from publisher.history.visibility import Projection
from publisher.live.reader import Reader
from publisher.state import STORE
from publisher.wire.durable import BEGINNING, NOW, Offset, OffsetError, format_offset, parse_offset

Live = Literal["long-poll", "sse"] | None
"""A read's mode: ``long-poll``, ``sse``, or ``None`` for a catch-up read."""


class Query(NamedTuple):
    """A read request's protocol parameters."""

    offset: str
    """``offset`` as given (``-1`` when absent)."""
    live: Live
    """``long-poll``, ``sse`` or ``None`` (catch-up)."""
    cursor: str | None
    """``cursor`` as given."""


class Start(NamedTuple):
    """Where a read starts: the client's position, checked against what is stored."""

    seq: int
    """Last seq the client holds."""
    epoch: str | None
    """The generation of the offsets answered (``None``: none yet, or a stream older than contract 1.1)."""
    closed: bool
    """The stream ended at ``seq``: the answer is EOF."""

    @property
    def offset(self) -> str:
        """The client's position as an offset."""
        return format_offset(self.seq, self.epoch)


def parse_query(request: web.Request) -> Query:
    """Return the read parameters.

    Raises:
        ProblemError: ``invalid-position`` (400) for an ``offset`` given twice, empty or
            malformed, or missing on a live read; ``invalid-field`` (400) for a ``live``
            other than ``long-poll`` or ``sse``, or given more than once.
    """
    offsets = request.query.getall("offset", [])
    if len(request.query.getall("live", [])) > 1:
        raise ProblemError("invalid-field", "the live parameter is given more than once; give it once",
                           errors=[FieldError(field="live", detail="given more than once")])
    live = request.query.get("live")
    if live not in (None, "long-poll", "sse"):
        raise ProblemError("invalid-field", "live must be long-poll or sse (or absent: a catch-up read)",
                           errors=[FieldError(field="live", detail="not long-poll or sse")])
    if len(offsets) > 1:
        raise ProblemError("invalid-position", "the offset parameter is given more than once; give it once")
    if live is not None and not offsets:
        raise ProblemError("invalid-position", f"a live={live} read needs an offset (-1 for the beginning)")
    offset = offsets[0] if offsets else BEGINNING
    try:
        parse_offset(offset)
    except OffsetError as exc:
        raise ProblemError("invalid-position", str(exc)) from None
    return Query(offset, live, request.query.get("cursor"))  # type: ignore[arg-type]  # checked above


def resolve(stream_id: str, info: StreamInfo, offset: str) -> Start:
    """Check the client's offset against the stored stream.

    Raises:
        ProblemError: ``not-found`` (404), ``history-reset``, ``history-expired`` or
            ``position-ahead`` (410), as the module table says.
    """
    if not info.known and not info.tomb:
        raise ProblemError("not-found", f"no stream {stream_id}")
    epoch = info.epoch or None
    position = parse_offset(offset)
    if position == NOW:
        if not info.known:
            return Start(info.tomb_last_seq, epoch, closed=True)
        return Start(info.last_seq, epoch if info.last_seq else None, closed=info.terminal)
    assert isinstance(position, Offset)  # parse_offset returns one or NOW
    check_epoch(info, Position(position.seq, position.epoch))
    if not info.known:
        if position.seq != info.tomb_last_seq:
            raise ProblemError("history-expired", "the stream ended and its events expired",
                               extensions={"last_seq": info.tomb_last_seq, "stream_status": info.tomb.get("status")})
        return Start(position.seq, epoch, closed=True)
    if position.seq > info.last_seq:
        raise ProblemError("position-ahead", f"offset is past the stored top (seq {info.last_seq})",
                           extensions={"last_seq": info.last_seq})
    return Start(position.seq, epoch if position.seq else None, closed=info.terminal and position.seq == info.last_seq)


async def messages(request: web.Request, projection: Projection, stream_id: str, entries: list[Entry]) -> list[bytes]:
    """Return the JSON of the entries this reader may see, in order (a resumed reader looks up block starts)."""
    store, out = request.app[STORE], []
    for entry in entries:
        if not entry.frame:
            continue
        if projection.needs_history(entry) and entry.block_index is not None:
            projection.learn_start(entry.block_index,
                                   await store.find_block_start(stream_id, entry.seq, entry.block_index))
        if projection.visible(entry):
            out.append(entry_json(entry))
    return out


def contiguous(reader: Reader, entries: list[Entry]) -> list[Entry]:
    """Return the entries that follow ``reader.cursor`` without a gap, advancing the cursor over them."""
    for count, entry in enumerate(entries):
        if entry.seq != reader.cursor + 1:
            return entries[:count]
        reader.cursor = entry.seq
    return entries


