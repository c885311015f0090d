"""``GET /v1/streams/{stream_id}/ui``: a stream as the AI SDK's UI message stream, for ``useChat``.

Same tokens and auth as ``/events`` (:func:`publisher.api.auth.authorize_read`); the chunks
are :mod:`publisher.wire.ui_chunks`' translation of the events the token may see. Every
request replays the stream from its first event (what the SDK's resume expects: it
rebuilds the message from the start), then serves live events as they are stored, and
ends with ``data: [DONE]`` after the terminal event. The replay joins each block's deltas
into one (:class:`~publisher.wire.ui_join.DeltaJoiner`): a resumed ``useChat`` gets each
block's text so far in one delta; live deltas follow one by one. A finished stream's
response is cacheable (:mod:`publisher.api.caching`: ``ETag``, ``304``).

==========================================================  ======================
situation                                                   answer
==========================================================  ======================
no meta, no events, no tombstone                            404 ``not-found``
ended, ``If-None-Match`` names the response's ``ETag``      304
``?resume=1`` and the stream ended (or only its tombstone)  204: nothing to resume
the credential holds its open streams (fair share)          429 ``too-many-requests``
events expired (tombstone only), no ``resume``              410 ``history-expired``
history no longer starts at seq 1                           410 ``history-trimmed``
the first page read belongs to another generation          410 ``history-reset``
otherwise                                                   200 ``text/event-stream``
==========================================================  ======================

A credential holding ``FANOUT_MAX_CONNECTIONS_PER_*`` open streams (``/events`` and
``/ui`` together, :mod:`publisher.api.fair_share`) gets a 429 with ``Retry-After``, as the
other transient refusals here are problem documents (503): the SDK's transport reads
this route with ``fetch``, not EventSource, and fails a non-2xx answer visibly, where a
200 without chunks would end the message silently empty.

``?resume=1`` is the reconnect request of the SDK's transport (``reconnectToStream``,
whose convention is 204 when no stream is active). A gap found mid-response (history
vanished, or the stream was written again as another generation: contract 1.1) sends an
``error`` chunk and ends without ``[DONE]``; a reader dropped at shutdown or on overflow
ends without ``[DONE]`` too, and its client reconnects. Every request starts from seq 1,
so a reconnect after a reset rebuilds the message from the new generation.

Follows the AI SDK's "Stream Protocols" page and WHATWG HTML "9.2 Server-sent events".
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from publisher.api.auth import authorize_read
from publisher.api.caching import freshness
from publisher.api.limits import path_stream_id
from publisher.api.positions import check_first_page, reader_epoch
from publisher.api.problems import ProblemError
from publisher.api.projected import drop, entry_json, serve_projected
from publisher.history.entries import Entry
from publisher.history.visibility import Projection, Scope
from publisher.live.reader import Reader
from publisher.state import FAIR_SHARES, GATE, HUB, SETTINGS, STORE
from publisher.wire.ui_chunks import DONE_LINE, UIMessageTranslator, chunk_frame
from publisher.wire.ui_join import DeltaJoiner
from schema.contract import decode_event
from schema.errors import InternalError

UI_HEADERS: Final = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-store, no-transform",
    "X-Vercel-AI-UI-Message-Stream": "v1",
    "X-Accel-Buffering": "no",
}
"""The SDK's ``UI_MESSAGE_STREAM_HEADERS``, but ``no-store`` (finished streams: :mod:`publisher.api.caching`)."""

async def stream_ui(request: web.Request) -> web.StreamResponse:
    """Serve one stream as a UI message stream (see the module table for every non-200 answer).

    Raises:
        ProblemError: 401, 403, 404, 410 as tabled; 429 past the credential's
            ``FANOUT_MAX_CONNECTIONS_PER_*``; 503 past ``FANOUT_MAX_CONNECTIONS``.
    """
    stream_id = path_stream_id(request)
    scope = authorize_read(request, stream_id)
    resume = request.query.get("resume", "") in ("1", "true")
    claim = request.app[FAIR_SHARES].claim(request, "sse")
    gate = request.app[GATE]
    refusal = gate.try_acquire()
    if refusal is not None:
        claim.release()
        raise ProblemError(refusal, "the publisher cannot open another stream now; retry shortly",
                           headers={"Retry-After": str(request.app[SETTINGS].busy_retry_after_s)})
    try:
        return await _answer(request, stream_id, scope, resume=resume)
    except InternalError as exc:  # the live subscription was not confirmed: nothing was sent yet
        raise ProblemError("redis-unavailable", "the live channel is not available now; retry shortly",
                           headers={"Retry-After": str(request.app[SETTINGS].busy_retry_after_s)}) from exc
    finally:
        gate.release()
        claim.release()


async def _answer(request: web.Request, stream_id: str, scope: Scope, *, resume: bool) -> web.StreamResponse:
    """Answer 204, 404 or 410 from the stored state, else serve from seq 1 (the slot is held by the caller)."""
    info = await request.app[STORE].info(stream_id)
    if not info.known and not info.tomb:
        raise ProblemError("not-found", f"no stream {stream_id}")
    if resume and (info.terminal or not info.known):
        return web.Response(status=204)
    if not info.known:
        raise ProblemError("history-expired", "the stream ended and its events expired",
                           extensions={"last_seq": info.tomb_last_seq})
    fresh = await freshness(request, stream_id, info, "ui", (scope,), extra="no-transform")
    if fresh is not None and fresh.matches(request):
        return fresh.not_modified()
    reader = Reader(stream_id, 0, request.app[SETTINGS].client_queue, lambda: drop(request),
                    epoch=reader_epoch(info))
    hub = request.app[HUB]
    try:
        await hub.join(reader)
        page = await request.app[STORE].read_after(stream_id, 0)
        await check_first_page(request, info, page, reader)
        writer = UIWriter(Projection(scope), request.app[SETTINGS].ui_join_max_chars)
        return await serve_projected(request, reader, writer, page, info.last_seq,
                                     headers=UI_HEADERS | (fresh.headers if fresh else {}), cacheable=bool(fresh))
    finally:
        hub.leave(reader)


class UIWriter:
    """Turns stored entries into UI chunk bytes for one response.

    While the history is replayed, the deltas of a run are joined per block
    (:class:`~publisher.wire.ui_join.DeltaJoiner`); live events after :meth:`live` are
    sent one chunk each.

    Args:
        projection: What the reader may see (internal reasoning left out of public tokens).
        join_max_chars: Most replayed text held for joining (``FANOUT_UI_JOIN_MAX_CHARS``).
    """

    def __init__(self, projection: Projection, join_max_chars: int) -> None:
        self.projection = projection
        self.translator = UIMessageTranslator()
        self.joiner: DeltaJoiner | None = DeltaJoiner(join_max_chars)

    def live(self) -> bytes:
        """Return the deltas held from the replay, joined; from now on every delta is sent as it comes."""
        chunks, self.joiner = self.joiner.flush() if self.joiner is not None else [], None
        return b"".join(chunk_frame(chunk) for chunk in chunks)

    @property
    def finished(self) -> bool:
        """True once the terminal event's chunks (and ``[DONE]``) were produced."""
        return self.translator.finished

    def frames(self, entries: list[Entry]) -> bytes:
        """Return the SSE bytes of the chunks these entries produce (``[DONE]`` after a terminal)."""
        out: list[bytes] = []
        for entry in entries:
            if not entry.frame or not self.projection.visible(entry):
                continue
            event = decode_event(entry_json(entry))
            if event is None:
                continue
            chunks = self.translator.feed(event)
            if self.joiner is not None:
                chunks = self.joiner.feed(chunks)
            out += [chunk_frame(chunk) for chunk in chunks]
            if self.translator.finished:
                out.append(DONE_LINE)
                break
        return b"".join(out)

    def gap_frame(self, *, reset: bool) -> bytes:
        """Return the ``error`` chunk sent when stored history no longer follows (no ``[DONE]``).

        ``reset``: the stream was written again as another generation (contract 1.1).
        """
        text = ("stream.gap: history-reset: the stream was written again as another generation; reconnect to "
                "read it from the start" if reset else
                "stream.gap: stored history no longer follows this stream; reconnect to get the cause")
        return chunk_frame({"type": "error", "errorText": text})
