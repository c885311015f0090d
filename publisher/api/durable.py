"""``/v1/streams/{stream_id}/durable``: a stream read by the Durable Streams protocol (its read routes).

Same tokens and visibility as ``/events`` (:func:`publisher.api.auth.authorize_read`); the
messages are the contract events, in JSON mode (:mod:`publisher.wire.durable`). ``GET``
without ``live`` is a catch-up read (one page, at most ``FANOUT_READ_PAGE`` events);
``live=long-poll`` and ``live=sse`` are served by :mod:`publisher.api.durable_live`;
``HEAD`` gives the tail offset and closure. Streams are written by workers only, so
``POST``, ``PUT``, ``DELETE`` and ``PATCH`` are answered ``405`` (section 5.2's refusal).

==============================================================  ======================
situation                                                       answer
==============================================================  ======================
``offset`` repeated, empty or malformed; ``live`` unknown or    400 ``invalid-position``
repeated; a live read without ``offset``                        / ``invalid-field``
no meta, no events, no tombstone                                404 ``not-found``
offset of another generation (the stream was written again)     410 ``history-reset``
events expired (tombstone only) and offset not its last seq     410 ``history-expired``
offset past the stored top                                      410 ``position-ahead``
first entry after the offset is not the next seq                410 ``history-trimmed``
the stream ended at the offset (EOF)                            200 ``[]`` / 204 / control, ``Stream-Closed``
otherwise                                                       200 (long-poll: 204 after the wait)
==============================================================  ======================

Every answer, its client-error problems included, carries ``X-Content-Type-Options: nosniff``
(a ``503`` for unavailable storage comes from the middleware, without it).

Follows the Durable Streams Protocol, sections 5.5 to 5.8, 8, 9.1, 10 and 12.7.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from publisher.api.auth import authorize_read
from publisher.api.durable_live import serve_live
from publisher.api.durable_read import Query, contiguous, messages, parse_query, resolve
from publisher.api.durable_write import send_answer
from publisher.api.limits import path_stream_id
from publisher.api.positions import check_first_page, reader_epoch
from publisher.api.problems import ProblemError
from publisher.history.visibility import Projection, Scope
from publisher.live.reader import Reader
from publisher.state import FAIR_SHARES, STORE
from publisher.wire.durable import (
    CACHEABLE,
    NO_STORE,
    NOW,
    SECURITY_HEADERS,
    ReadState,
    entity_tag,
    format_offset,
    json_array,
    none_match,
    read_headers,
)

ALLOW: Final = "GET, HEAD, OPTIONS"
"""The methods a durable URL serves (``Allow`` of a refused write and of ``OPTIONS``)."""


async def stream_durable(request: web.Request) -> web.StreamResponse:
    """Serve one read (catch-up, long-poll or SSE) of a stream; see the module table.

    Raises:
        ProblemError: 400, 401, 403, 404, 410 as tabled; 429/503 for live reads past
            the connection limits (the client retries after ``Retry-After``).
    """
    try:
        stream_id = path_stream_id(request)
        scope = authorize_read(request, stream_id)
        query = parse_query(request)
        if query.live is not None:
            return await serve_live(request, stream_id, scope, query)
        return await _catch_up(request, stream_id, scope, query)
    except ProblemError as exc:
        exc.headers.update(SECURITY_HEADERS)
        raise


async def _catch_up(request: web.Request, stream_id: str, scope: Scope, query: Query) -> web.StreamResponse:
    claim = request.app[FAIR_SHARES].claim(request, "status")
    try:
        store = request.app[STORE]
        info = await store.info(stream_id)
        start = resolve(stream_id, info, query.offset)
        if start.closed or query.offset == NOW:
            state = ReadState(start.offset, up_to_date=True, closed=start.closed)
            return web.Response(body=b"[]", headers=read_headers(state, cache_control=NO_STORE))
        reader = Reader(stream_id, start.seq, 1, epoch=reader_epoch(info))  # never joins the hub: a cursor only
        page = await store.read_after(stream_id, start.seq)
        await check_first_page(request, info, page, reader)
        entries = contiguous(reader, list(page))
        body = json_array(await messages(request, Projection(scope), stream_id, entries))
        epoch = page.epoch.decode() if entries else start.epoch
        state = ReadState(format_offset(reader.cursor, epoch), up_to_date=len(entries) == len(page) < store.page,
                          closed=bool(entries) and entries[-1].terminal)
        tag = entity_tag(scope, query.offset, state)
        pinned = "." in query.offset or not epoch  # a bare seq on a stream with generations names none
        cache = CACHEABLE if entries and start.seq > 0 and pinned else NO_STORE  # seq 0 (-1, 0000...): a start
        headers = read_headers(state, cache_control=cache, etag=tag)
        if none_match(request.headers.get("If-None-Match"), tag):
            return web.Response(status=304, headers={k: v for k, v in headers.items() if k != "Content-Type"})
        return await send_answer(request, body, headers)
    finally:
        claim.release()


async def stream_head(request: web.Request) -> web.Response:
    """Answer ``HEAD``: the tail offset and, once the stream ended, ``Stream-Closed`` (section 5.5).

    Raises:
        ProblemError: 401, 403, 404 (every answer carries the security headers).
    """
    try:
        stream_id = path_stream_id(request)
        authorize_read(request, stream_id)
        info = await request.app[STORE].info(stream_id)
        start = resolve(stream_id, info, NOW)
        return web.Response(headers=read_headers(ReadState(start.offset, up_to_date=False, closed=start.closed),
                                                 cache_control=NO_STORE))
    except ProblemError as exc:
        exc.headers.update(SECURITY_HEADERS)
        raise


async def refuse_write(request: web.Request) -> web.Response:
    """Refuse the protocol's writes: fanout streams are written by workers only (section 5.2: 405).

    Raises:
        ProblemError: ``method-not-allowed`` (405) with ``Allow: GET, HEAD, OPTIONS``.
    """
    raise ProblemError("method-not-allowed", f"{request.method} is not served: fanout streams are written by its "
                       "workers only (submit a job with POST /v1/streams); this URL serves reads",
                       headers={"Allow": ALLOW, **SECURITY_HEADERS})


async def answer_options(request: web.Request) -> web.Response:
    """Answer a plain ``OPTIONS`` (a CORS preflight is answered by the middleware first).

    ``204`` with ``Allow: GET, HEAD, OPTIONS`` (RFC 9110, section 9.3.7): the methods the
    refused writes' ``Allow`` names, so OPTIONS is one of them in fact.
    """
    return web.Response(status=204, headers={"Allow": ALLOW, **SECURITY_HEADERS})
