"""``GET /v1/streams/{stream_id}`` (status and assembled result) and ``POST .../cancel``.

The result is the reducer's (schema.reducer) over the stored events the reader may see:
a ``public`` reader's result has no internal reasoning block. It is assembled once per
stream, projection and epoch, shared by concurrent requests and kept
(:mod:`publisher.api.status_cache`); a credential has at most ``FANOUT_MAX_STATUS_READS_PER_*``
requests in flight and makes at most ``FANOUT_STATUS_READ_RATE_PER_*`` a second
(:mod:`publisher.api.fair_share`, 429 past either). Cancel follows the
protocol of :mod:`schema.keys`: ``SET`` the cancel flag, then ``PUBLISH`` the stream id
on the cancels channel (two plain commands); the owning worker ends the stream ``cancelled``.

Follows the Redis pages of SET and PUBLISH, and RFC 9457 for errors.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Final

import msgspec
from aiohttp import web

from publisher.api.auth import authorize_read, require_api_key
from publisher.api.caching import NO_STORE, freshness
from publisher.api.limits import path_stream_id
from publisher.api.problems import FieldError, ProblemError
from publisher.api.status_cache import Snapshot
from publisher.history.store import HistoryChangedError, StreamInfo
from publisher.history.visibility import Scope
from publisher.state import FAIR_SHARES, KEYS, REDIS, SETTINGS, STATUS_CACHE, STORE
from schema.contract import EPOCH_PATTERN

log = logging.getLogger(__name__)

_EPOCH: Final = re.compile(EPOCH_PATTERN)
_encoder: Final = msgspec.json.Encoder()
_NULL_END: Final = b"null}"


async def send_json(request: web.Request, parts: list[bytes],
                    headers: dict[str, str] | None = None) -> web.StreamResponse:
    """Write a ``200`` JSON body made of ``parts`` now, within ``FANOUT_WRITE_TIMEOUT_S`` (else drop the connection).

    The parts are written as they are (a kept result is not copied into each response),
    and before the handler returns, so the request's place under its credential is held
    until its body is out: a client that stops reading holds its place. ``headers`` are added.
    """
    response = web.StreamResponse(headers={"Content-Type": "application/json; charset=utf-8", **(headers or {})})
    response.content_length = sum(len(part) for part in parts)
    try:
        async with asyncio.timeout(request.app[SETTINGS].write_timeout_s):
            await response.prepare(request)
            for part in parts:
                await response.write(part)
            await response.write_eof()
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()
    return response


async def stream_status(request: web.Request) -> web.StreamResponse:
    """Return the stream's state, status, last seq and assembled result so far.

    ``state`` is the meta's (``queued``, ``running``, ``done``) or ``expired`` when only
    the tombstone remains (``result`` is then null). ``history_complete`` is false when
    the stored events do not run from seq 1 to the stored top without a hole (they no
    longer start at seq 1, a failover lost some, the events key is gone under its meta):
    the result is then partial. ``epoch`` is the stream's generation (contract 1.1; null
    before its ``stream.start`` or on a stream older than 1.1); a caller that names the
    generation it holds (``?epoch=``, the part after the ``.`` of its last SSE ``id``) and
    finds another one gets ``history_complete: false`` too: its history is not this one.
    Meta is read before the events, so a stream whose terminal event was stored between the two reads
    as ``done`` with the result's status and the last seq read.

    A finished stream's document is immutable: it carries a strong ``ETag`` and
    ``Cache-Control: private, max-age=<remaining TTL>``, and ``If-None-Match`` gets ``304``
    without an event read (:mod:`publisher.api.caching`); any other is ``no-store``.

    Raises:
        ProblemError: 401/403 (credentials), 404 (unknown stream), 429 (the credential's
            ``FANOUT_MAX_STATUS_READS_PER_*`` requests are in flight, or its
            ``FANOUT_STATUS_READ_RATE_PER_*`` bucket is empty).
    """
    stream_id = path_stream_id(request)
    scope = authorize_read(request, stream_id)
    held = _held_epoch(request)
    claim = request.app[FAIR_SHARES].claim(request, "status", paced=True)
    try:
        info = await request.app[STORE].info(stream_id)
        fresh = await freshness(request, stream_id, info, "status", (scope, held))
        if fresh is not None and fresh.matches(request):
            return fresh.not_modified()
        headers = fresh.headers if fresh is not None else {"Cache-Control": NO_STORE}
        return await send_json(request, await _status_body(request, stream_id, scope, held, info), headers)
    finally:
        claim.release()


async def _status_body(request: web.Request, stream_id: str, scope: Scope, held: str | None,
                       info: StreamInfo) -> list[bytes]:
    """Return the status document in parts: the fields, then the kept result's JSON as it is, then ``}``."""
    if not info.known:
        if not info.tomb:
            raise ProblemError("not-found", f"no stream {stream_id}")
        return [_encoder.encode({
            "stream_id": stream_id, "state": "expired", "status": info.tomb.get("status"),
            "last_seq": info.tomb_last_seq, "epoch": info.epoch or None, "history_complete": False, "result": None,
        })]
    info, result = await _snapshot(request, stream_id, scope, info)
    meta = info.meta
    created_ms = meta.get("created_ms")
    # The events are read after meta: a terminal event stored in between is in the result but not in
    # what meta said, so the stream reads as ended then too (never "running" beside a finished result).
    ended = info.terminal or result.status != "running"
    head = _encoder.encode({
        "stream_id": stream_id,
        "state": "done" if ended else meta.get("state") or "running",
        "status": meta.get("status") or (result.status if ended else None),
        "last_seq": max(info.last_seq, result.read_seq),
        "provider": meta.get("provider"),
        "model": meta.get("model"),
        "endpoint": result.endpoint,
        "created_ms": int(created_ms) if created_ms else None,
        "epoch": info.epoch or None,
        # every seq from 1 to the top meta had stored (not only a first seq of 1, or nothing read at all),
        # of the generation the caller holds when it names one
        "history_complete": result.whole and result.read_seq >= info.last_seq and held in (None, info.epoch),
        "result": None,
    })
    return [head[:-len(_NULL_END)], result.body, b"}"]  # head ends '"result":null}'


async def cancel(request: web.Request) -> web.Response:
    """Ask the owning worker to stop; ``202`` however often it is asked before the end.

    Raises:
        ProblemError: 401 (API key), 404 (unknown stream), 409 ``already-terminal``.
    """
    require_api_key(request)
    stream_id = path_stream_id(request)
    info = await request.app[STORE].info(stream_id)
    if not info.known and not info.tomb:
        raise ProblemError("not-found", f"no stream {stream_id}")
    if info.terminal or not info.known:
        status = info.meta.get("status") or info.tomb.get("status")
        raise ProblemError("already-terminal", "the stream already ended", extensions={"stream_status": status})
    keys, redis = request.app[KEYS], request.app[REDIS]
    # Two plain commands: the cluster pipeline refuses PUBLISH, and the two keys live in two slots.
    await redis.set(keys.cancel(stream_id), "1", ex=request.app[SETTINGS].cancel_ttl_s)
    await redis.publish(keys.cancels, stream_id)
    return web.json_response({"stream_id": stream_id, "state": "cancelling"}, status=202)


async def _snapshot(request: web.Request, stream_id: str, scope: Scope,
                    info: StreamInfo) -> tuple[StreamInfo, Snapshot]:
    """Return the kept result of ``info``'s generation; once more with a fresh ``info`` if it changed while read."""
    try:
        return info, await request.app[STATUS_CACHE].snapshot(stream_id, scope, info)
    except HistoryChangedError:  # written again while read: read the new generation once more
        info = await request.app[STORE].info(stream_id)
        return info, await request.app[STATUS_CACHE].snapshot(stream_id, scope, info)


def _held_epoch(request: web.Request) -> str | None:
    """Return the ``epoch`` query parameter (the generation the caller holds), or ``None``.

    Raises:
        ProblemError: ``invalid-field`` (400) for a value that is not an epoch, or one given twice.
    """
    values = request.query.getall("epoch", ())
    if not values:
        return None
    if len(values) > 1 or _EPOCH.fullmatch(values[0]) is None:
        raise ProblemError("invalid-field", "epoch must be given once, as the part after the '.' of an SSE id",
                           errors=[FieldError(field="epoch", detail="lowercase letters and digits, 1 to 32")])
    return values[0]
