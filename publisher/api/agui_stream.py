"""``GET /v1/streams/{stream_id}/agui``: a stream as AG-UI events over SSE, with exact ``Last-Event-ID`` resume.

Same tokens and visibility as ``/events`` (:func:`publisher.api.auth.authorize_read`,
:class:`publisher.history.visibility.Projection`); the events are
:mod:`publisher.wire.agui`'s translation of what the token may see, framed as
``@ag-ui/encoder`` frames them (``data: <JSON>``), each contract event's last AG-UI
event carrying the stored event's SSE ``id`` (``<seq>.<epoch>``). The position is read
as ``/events`` reads it (``Last-Event-ID``, else ``last_event_id``), and answered as
``/events`` answers it before the body (400, 404, 410, and 204 when the client already
holds the terminal event: :func:`publisher.api.positions.early_answer`), but for
``429 too-many-requests`` past the credential's share, since AG-UI clients read with
``fetch`` (as ``/ui``'s do).

Every response replays the stream from seq 1 through the translator (its state is the
whole history). With no position, everything is sent. After a position ``p``, nothing
up to ``p`` is sent again; instead, once the translator has reached ``p``, the
connection opens with ``RUN_STARTED`` and the start of every item still open
(:meth:`publisher.wire.agui.AGUITranslator.reattach`, same ids, which AG-UI clients apply
idempotently), then the events after ``p``.

With ``?snapshot=1`` and no position (as on ``/events``:
:func:`publisher.api.snapshot.wants_snapshot`), the events up to the stream's stored top
``p`` are replaced by ``RUN_STARTED`` and one ``MESSAGES_SNAPSHOT`` built from the
translator's state at ``p`` (:mod:`publisher.wire.agui_snapshot`: the messages the full
replay assembles), then what is still open and the events after ``p``.

A gap found mid-response (history vanished, or the stream was written again: contract
1.1) ends the response with a ``RUN_ERROR`` whose ``code`` is ``stream_gap`` or
``history_reset`` and no ``id``.

Follows the AG-UI 1.0 specification ("HTTP SSE transport", "Runs and Steps") and WHATWG
HTML "9.2 Server-sent events".
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from publisher.api.auth import authorize_read
from publisher.api.limits import path_stream_id
from publisher.api.positions import Position, check_first_page, early_answer, parse_position, reader_epoch
from publisher.api.problems import ProblemError
from publisher.api.projected import drop, entry_id, entry_json, serve_projected
from publisher.api.snapshot import wants_snapshot
from publisher.history.entries import Entry
from publisher.history.visibility import Projection, Scope
from publisher.live.reader import Reader
from publisher.state import FAIR_SHARES, GATE, HUB, SETTINGS, STORE, TELEMETRY
from publisher.wire.agui import AGUIEvent, AGUITranslator, sse_frame
from publisher.wire.agui_snapshot import snapshot_events
from schema.contract import decode_event
from schema.errors import InternalError

AGUI_HEADERS: Final = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",
}
"""The response headers (``EventEncoder.getContentType()`` for SSE, and no proxy buffering)."""


async def stream_agui(request: web.Request) -> web.StreamResponse:
    """Serve one stream as AG-UI events (see the module docstring for every non-200 answer).

    Raises:
        ProblemError: 400, 401, 403, 404, 410 as ``/events``; 429 past the credential's
            ``FANOUT_MAX_CONNECTIONS_PER_*``; 503 past ``FANOUT_MAX_CONNECTIONS`` or when the
            live channel is not confirmed.
    """
    stream_id = path_stream_id(request)
    scope = authorize_read(request, stream_id)
    position = parse_position(request)
    if position.seq > 0:
        request.app[TELEMETRY].resumes.add(1)
    claim = request.app[FAIR_SHARES].claim(request, "sse")
    gate = request.app[GATE]
    refusal = gate.try_acquire()
    if refusal is not None:
        claim.release()
        raise ProblemError(refusal, "the publisher cannot open another stream now; retry shortly",
                           headers={"Retry-After": str(request.app[SETTINGS].busy_retry_after_s)})
    try:
        return await _answer(request, stream_id, scope, position)
    except ProblemError as exc:
        if exc.status == 410:
            request.app[TELEMETRY].gone.add(1, {"cause": exc.slug})
        raise
    except InternalError as exc:  # the live subscription was not confirmed: nothing was sent yet
        raise ProblemError("redis-unavailable", "the live channel is not available now; retry shortly",
                           headers={"Retry-After": str(request.app[SETTINGS].busy_retry_after_s)}) from exc
    finally:
        gate.release()
        claim.release()


async def _answer(request: web.Request, stream_id: str, scope: Scope, position: Position) -> web.StreamResponse:
    """Answer 204, 404 or 410 as ``/events`` does (and counts them alike), else serve from seq 1.

    The caller holds the connection's slot.
    """
    info = await request.app[STORE].info(stream_id)
    snapshot = wants_snapshot(request, position.seq) and info.last_seq > 0
    early = early_answer(stream_id, info, position)
    if early is not None:
        request.app[TELEMETRY].no_content.add(1)
        return early
    reader = Reader(stream_id, 0, request.app[SETTINGS].client_queue, lambda: drop(request),
                    epoch=reader_epoch(info))
    hub = request.app[HUB]
    try:
        await hub.join(reader)
        page = await request.app[STORE].read_after(stream_id, 0)
        await check_first_page(request, info, page, reader)
        after = info.last_seq if snapshot else position.seq
        writer = AGUIWriter(Projection(scope), after=after, snapshot=snapshot)
        return await serve_projected(request, reader, writer, page, info.last_seq, headers=AGUI_HEADERS)
    finally:
        hub.leave(reader)


class AGUIWriter:
    """Turns stored entries into AG-UI SSE bytes for one response.

    Args:
        projection: What the reader may see (internal reasoning left out of public tokens).
        after: The seq the client holds (0: none), or the one the snapshot reflects;
            nothing up to it is sent again.
        snapshot: Send ``MESSAGES_SNAPSHOT`` at ``after`` (:mod:`publisher.wire.agui_snapshot`)
            instead of reopening what the client holds.
    """

    def __init__(self, projection: Projection, *, after: int = 0, snapshot: bool = False) -> None:
        self.projection = projection
        self.after = after
        self.snapshot = snapshot
        self.translator = AGUITranslator(keep_text=snapshot)

    @property
    def finished(self) -> bool:
        """True once the terminal event's AG-UI events were produced."""
        return self.translator.finished

    def frames(self, entries: list[Entry]) -> bytes:
        """Return the SSE bytes of the AG-UI events these entries produce (each group's last one with its ``id``)."""
        out: list[bytes] = []
        for entry in entries:
            events = self._translate(entry)
            if entry.seq < self.after:
                continue
            if entry.seq == self.after and self.snapshot:
                out += self._snapshot(events, entry_id(entry))
                if self.translator.finished:
                    break
                continue
            if entry.seq == self.after:
                events = self.translator.reattach()
            out += _group(events, entry_id(entry))
            if self.translator.finished:
                break
        return b"".join(out)

    def gap_frame(self, *, reset: bool) -> bytes:
        """Return the ``RUN_ERROR`` sent when stored history no longer follows (no ``id``)."""
        if reset:
            event: AGUIEvent = {"type": "RUN_ERROR", "code": "history_reset",
                                "message": "the stream was written again as another generation; read it again "
                                           "from the start (no Last-Event-ID)"}
        else:
            event = {"type": "RUN_ERROR", "code": "stream_gap",
                     "message": "stored history no longer follows this stream; reconnect to get the cause"}
        return sse_frame(event)

    def live(self) -> bytes:
        """Return nothing: every event was sent as it was translated."""
        return b""

    def _snapshot(self, events: list[AGUIEvent], event_id: bytes) -> list[bytes]:
        """Frame the snapshot at ``after``: its ``id`` on ``MESSAGES_SNAPSHOT``, or on the terminal when there is one.

        A client holding a finished stream's last id holds its terminal event (the next
        read is ``204``), so then the id goes on the terminal, which follows at once.
        """
        finished = self.translator.finished
        group, at = snapshot_events(self.translator, events if finished else [])
        carrier = len(group) - 1 if finished else at
        return [sse_frame(event, event_id if i == carrier else b"") for i, event in enumerate(group)]

    def _translate(self, entry: Entry) -> list[AGUIEvent]:
        if not entry.frame or not self.projection.visible(entry):
            return []
        event = decode_event(entry_json(entry))
        return self.translator.feed(event) if event is not None else []


def _group(events: list[AGUIEvent], event_id: bytes) -> list[bytes]:
    """Frame one contract event's AG-UI events; only the last carries the SSE ``id``."""
    last = len(events) - 1
    return [sse_frame(event, event_id if i == last else b"") for i, event in enumerate(events)]
