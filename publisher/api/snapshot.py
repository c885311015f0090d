"""``/events?snapshot=1``: the ``stream.snapshot`` message that replaces the history up to a seq (contract 1.1).

The snapshot is the status route's assembled result (:mod:`publisher.api.status_cache`:
assembled once per stream, projection and generation, shared and advanced incrementally,
with the same visibility rules: a ``public`` reader's has no internal reasoning block) as
of the last seq it read, sent as one SSE message whose ``id`` is that seq's
(``<seq>.<epoch>``; ``0`` while nothing is stored). The reader's cursor is then that seq,
so the events after it follow as on any resume and ``Last-Event-ID`` continues from there.

Only a request without a position gets one: ``snapshot=1`` with ``Last-Event-ID`` (an
EventSource reconnecting to the same URL) resumes after the position, as without it.

==========================================================  ======================
situation (besides the route's own)                         answer
==========================================================  ======================
``snapshot`` other than ``0``/``1``/``true``/``false``,     400 ``invalid-field``
or given twice
the stored events no longer start at seq 1                  410 ``history-trimmed``
events gone although meta says more exist                   410 ``history-expired``
written again as another generation twice while read        410 ``history-reset``
==========================================================  ======================
"""

from __future__ import annotations

from typing import Final, NamedTuple

from aiohttp import web

from publisher.api.problems import FieldError, ProblemError
from publisher.history.store import HistoryChangedError, StreamInfo
from publisher.history.visibility import Scope
from publisher.state import STATUS_CACHE, STORE
from schema.contract import event_id
from schema.snapshot import SNAPSHOT_TYPE, snapshot_json

_VALUES: Final = {"1": True, "true": True, "0": False, "false": False}


class SnapshotFrame(NamedTuple):
    """One ``stream.snapshot`` SSE message and where it leaves the reader."""

    frame: bytes
    """The whole SSE message (``id``, ``event``, ``data``, blank line)."""
    seq: int
    """The seq it reflects: the reader's cursor after it."""
    final: bool
    """The result includes the terminal event: nothing follows."""
    info: StreamInfo
    """The stream's info the snapshot belongs to (read again when its generation changed)."""


def wants_snapshot(request: web.Request, position_seq: int) -> bool:
    """Return True when the request asks for a snapshot (``snapshot=1``) and holds no position.

    Raises:
        ProblemError: ``invalid-field`` (400) for another value, or the parameter given twice.
    """
    values = request.query.getall("snapshot", ())
    if not values:
        return False
    if len(values) > 1 or values[0] not in _VALUES:
        raise ProblemError("invalid-field", "snapshot must be given once, as 1 or 0",
                           errors=[FieldError(field="snapshot", detail="1, true, 0 or false")])
    return _VALUES[values[0]] and position_seq == 0


async def read_snapshot(request: web.Request, stream_id: str, scope: Scope, info: StreamInfo) -> SnapshotFrame:
    """Return the snapshot of ``stream_id`` for ``scope`` at ``info.last_seq`` or later.

    A stream written again as another generation while it was assembled is read once more
    from a fresh ``info`` (a reader without a position holds no generation yet).

    Raises:
        ProblemError: 410 as tabled in the module docstring.
        RedisError: A read failed (nothing was sent yet).
    """
    cache = request.app[STATUS_CACHE]
    try:
        kept = await cache.snapshot(stream_id, scope, info)
    except HistoryChangedError:
        info = await request.app[STORE].info(stream_id)
        try:
            kept = await cache.snapshot(stream_id, scope, info)
        except HistoryChangedError as exc:
            raise ProblemError("history-reset", "the stream was written again as another generation while it was "
                               "read; read it again", extensions={"epoch": None, "last_seq": None}) from exc
    if not kept.whole:
        raise ProblemError("history-trimmed", "seq 1 is no longer stored: no snapshot can be assembled",
                           extensions={"first_seq": None, "last_seq": info.last_seq})
    if kept.read_seq < info.last_seq:
        raise ProblemError("history-expired", "the stream's events expired", extensions={"last_seq": info.last_seq})
    data = snapshot_json(stream_id, kept.read_seq, kept.ts_ms, kept.body)
    ident = event_id(kept.read_seq, info.epoch or None) if kept.read_seq else "0"
    frame = b"id: %s\nevent: %s\ndata: %s\n\n" % (ident.encode(), SNAPSHOT_TYPE.encode(), data)
    return SnapshotFrame(frame, kept.read_seq, kept.status != "running", info)
