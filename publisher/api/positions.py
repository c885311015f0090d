"""Where an SSE client stands: its position, and the answers owed before any byte of the body.

The position is ``Last-Event-ID``, else the ``last_event_id`` query parameter, else 0:
``<seq>`` or ``<seq>.<epoch>`` (:func:`parse_position`). Checked against the stream's
stored state (:class:`publisher.history.store.StreamInfo`) it gives the 204, 404 and 410
answers tabled in :mod:`publisher.api.events` (:func:`early_answer`), and against the first
history page read the 410s of a trimmed, expired or rewritten history
(:func:`check_first_page`). Used by ``/events`` and the UI message stream
(:mod:`publisher.api.ui_stream`). Follows contract 1.1 ("Generations") and RFC 9457.
"""

from __future__ import annotations

from typing import NamedTuple

from aiohttp import web

from publisher.api.problems import ProblemError
from publisher.history.entries import Page
from publisher.history.store import StreamInfo
from publisher.live.reader import Reader
from publisher.state import STORE
from schema.contract import parse_event_id


class Position(NamedTuple):
    """Where a client is: the last seq it holds and, when its ``id`` named one, that event's epoch."""

    seq: int
    """The last seq held (0: nothing)."""
    epoch: str | None
    """The generation of that seq; ``None`` for a bare seq (not checked)."""


def parse_position(request: web.Request) -> Position:
    """Return the client's position: ``Last-Event-ID``, else ``last_event_id``, else seq 0.

    Raises:
        ProblemError: ``invalid-position`` (400) for anything but ``<seq>`` or
            ``<seq>.<epoch>`` (:func:`schema.contract.parse_event_id`), or a
            ``last_event_id`` parameter given more than once (as a repeated header is).
    """
    if len(request.query.getall("last_event_id", ())) > 1:
        raise ProblemError("invalid-position", "the last_event_id parameter is given more than once; give it once")
    raw = request.headers.get("Last-Event-ID", "").strip() or request.query.get("last_event_id", "").strip()
    if not raw:
        return Position(0, None)
    try:
        seq, epoch = parse_event_id(raw)
    except ValueError:
        raise ProblemError("invalid-position", "Last-Event-ID / last_event_id must be the id of an event held: "
                                               "<seq> or <seq>.<epoch>") from None
    return Position(seq, epoch if seq else None)


def check_epoch(info: StreamInfo, position: Position) -> None:
    """Refuse a position in another generation than the stream's current one (contract 1.1).

    Raises:
        ProblemError: ``history-reset`` (410), with the stream's ``epoch`` (null when it has
            none yet) and ``last_seq``: the events the client holds are not this stream's
            history any more; it must start again from the beginning (no ``Last-Event-ID``).
    """
    current = info.epoch
    if position.epoch is not None and position.epoch != current:
        raise ProblemError("history-reset", "the stream was written again as another generation; the events "
                                            "held are not its history any more: read it again from the start",
                           extensions={"epoch": current or None,
                                       "last_seq": info.last_seq if info.known else info.tomb_last_seq})


def early_answer(stream_id: str, info: StreamInfo, position: Position) -> web.Response | None:
    """Return the 204 owed before any read, or ``None`` to go on; raise the 404/410 owed.

    Raises:
        ProblemError: ``not-found``, ``history-reset``, ``history-expired`` or ``position-ahead``.
    """
    if not info.known and not info.tomb:
        raise ProblemError("not-found", f"no stream {stream_id}")
    check_epoch(info, position)
    return _early_by_seq(info, position.seq)


def _early_by_seq(info: StreamInfo, position: int) -> web.Response | None:
    if not info.known:
        last_seq = info.tomb_last_seq
        if position == last_seq:
            return web.Response(status=204)
        raise ProblemError("history-expired", "the stream ended and its events expired",
                           extensions={"last_seq": last_seq, "stream_status": info.tomb.get("status")})
    if position > info.last_seq:
        raise ProblemError("position-ahead", f"position {position} is past the stored top {info.last_seq}",
                           extensions={"last_seq": info.last_seq})
    if info.terminal and position == info.last_seq:
        return web.Response(status=204)
    return None


async def check_first_page(request: web.Request, info: StreamInfo, page: Page, reader: Reader) -> None:
    """Refuse a reader's position that stored history no longer follows (B20), or a page of another generation.

    ``reader.cursor`` is the position (nothing was sent yet).

    Raises:
        ProblemError: ``history-reset`` (the page was read in another generation than
            the one the reader holds: the stream was written again since ``info``),
            ``history-trimmed`` (entries remain, but not ``position + 1``; carries
            ``first_seq``) or ``history-expired`` (the events are gone).
    """
    if not reader.adopt(page, page.epoch):
        raise ProblemError("history-reset", "the stream was written again as another generation while it was read",
                           extensions={"epoch": page.epoch.decode() or None, "last_seq": None})
    stream_id, position = reader.stream_id, reader.cursor
    if page and page[0].seq != position + 1:
        raise ProblemError("history-trimmed", f"seq {position + 1} is no longer stored",
                           extensions={"first_seq": page[0].seq, "last_seq": info.last_seq})
    if not page and info.last_seq > position:
        if await request.app[STORE].events_exist(stream_id):
            raise ProblemError("history-trimmed", f"seq {position + 1} is no longer stored",
                               extensions={"first_seq": None, "last_seq": info.last_seq})
        raise ProblemError("history-expired", "the stream's events expired", extensions={"last_seq": info.last_seq})


def reader_epoch(info: StreamInfo) -> bytes | None:
    """Return the generation a new reader starts in.

    Meta ``epoch`` (``b""``: none, a stream older than contract 1.1), or ``None`` while
    nothing is stored (the first page read tells).
    """
    return info.epoch.encode() if info.last_seq > 0 else None
