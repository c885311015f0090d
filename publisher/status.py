"""``GET /v1/streams/{stream_id}`` (status and assembled result), ``POST .../cancel``, health routes.

The result is the reducer's (schema.reducer) over the stored events the reader may see:
a ``public`` reader's result has no internal reasoning block. It is assembled once per
stream, projection and epoch, shared by concurrent requests and kept
(:mod:`publisher.status_cache`); a credential has at most ``FANOUT_MAX_STATUS_READS_PER_*``
requests in flight (:mod:`publisher.fair_share`, 429 past it), ``/readyz`` per client address. Cancel follows the
protocol of :mod:`schema.keys`: ``SET`` the cancel flag, then ``PUBLISH`` the stream id
on the cancels channel (two plain commands); the owning worker ends the stream ``cancelled``.

Follows the Redis pages of SET, PUBLISH, PING, CLUSTER INFO and XINFO GROUPS, and RFC 9457 for errors.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import msgspec
from aiohttp import web

from publisher.auth import authorize_read, require_api_key
from publisher.limits import path_stream_id
from publisher.problems import ProblemError
from publisher.state import FAIR_SHARES, KEYS, REDIS, SETTINGS, SHARDS, STATUS_CACHE, STORE
from publisher.tokens import Scope
from worker.error_policy import safe_message
from worker.intake import missing_groups, streams_in_use
from worker.redis_client import REDIS_ERRORS, cluster_problems
from worker.storage import probe_write

log = logging.getLogger(__name__)

READY_TIMEOUT_S: Final = 2.0
"""Longest wait for Redis to take the probe write in ``/readyz``, seconds."""
_encoder: Final = msgspec.json.Encoder()
_NULL_END: Final = b"null}"


async def send_json(request: web.Request, parts: list[bytes]) -> web.StreamResponse:
    """Write a ``200`` JSON body made of ``parts`` now, within ``FANOUT_WRITE_TIMEOUT_S`` (else drop the connection).

    The parts are written as they are (a kept result is not copied into each response),
    and before the handler returns, so the request's place under its credential is held
    until its body is out: a client that stops reading holds its place.
    """
    response = web.StreamResponse(headers={"Content-Type": "application/json; charset=utf-8"})
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
    the result is then partial. Meta is read
    before the events, so a stream whose terminal event was stored between the two reads
    as ``done`` with the result's status and the last seq read.

    Raises:
        ProblemError: 401/403 (credentials), 404 (unknown stream), 429 (the credential's
            ``FANOUT_MAX_STATUS_READS_PER_*`` requests are in flight).
    """
    stream_id = path_stream_id(request)
    scope = authorize_read(request, stream_id)
    claim = request.app[FAIR_SHARES].claim(request, "status")
    try:
        return await send_json(request, await _status_body(request, stream_id, scope))
    finally:
        claim.release()


async def _status_body(request: web.Request, stream_id: str, scope: Scope) -> list[bytes]:
    """Return the status document in parts: the fields, then the kept result's JSON as it is, then ``}``."""
    info = await request.app[STORE].info(stream_id)
    if not info.known:
        if not info.tomb:
            raise ProblemError("not-found", f"no stream {stream_id}")
        return [_encoder.encode({
            "stream_id": stream_id, "state": "expired", "status": info.tomb.get("status"),
            "last_seq": info.tomb_last_seq, "history_complete": False, "result": None,
        })]
    result = await request.app[STATUS_CACHE].snapshot(stream_id, scope, info)
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
        "created_ms": int(created_ms) if created_ms else None,
        # every seq from 1 to the top meta had stored (not only a first seq of 1, or nothing read at all)
        "history_complete": result.whole and result.read_seq >= info.last_seq,
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


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers. Never touches Redis."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: Redis answers, the cluster is ok, every jobs stream in use has its group.

    Within :data:`READY_TIMEOUT_S`: PING, a probe write (:func:`worker.storage.probe_write`,
    ``SET P:probe 1 PX``: fails while Redis refuses writes, e.g. OOM, READONLY, MISCONF),
    ``cluster_state:ok`` on every primary (cluster mode), and ``XINFO GROUPS`` of every
    jobs stream in use shows ``workers``. A missing group is created here, as a worker
    creates it (:meth:`publisher.submit.JobShards.restore_groups`), so a publisher
    started before Redis, or a Redis that came back empty, is ready without waiting for
    a worker: submissions are kept from id 0 for the first worker to read.

    At most ``FANOUT_MAX_STATUS_READS_PER_ADDRESS`` run at once per client address (it
    takes no credential); one more is a 429 ``too-many-requests``.

    Raises:
        ProblemError: 503 ``redis-unavailable`` naming what failed; 429 as said.
    """
    claim = request.app[FAIR_SHARES].claim(request, "status", anonymous=True)
    try:
        return await _ready(request)
    finally:
        claim.release()


async def _ready(request: web.Request) -> web.Response:
    redis, keys = request.app[REDIS], request.app[KEYS]
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            await redis.ping()
            written = await probe_write(redis, keys.probe, timeout_s=READY_TIMEOUT_S)
            problems = [written] if written else []
            problems += await cluster_problems(redis)
            missing = await missing_groups(redis, await streams_in_use(redis, keys, request.app[SETTINGS].job_shards))
            if missing:
                problems += await request.app[SHARDS].restore_groups(redis, missing)
    except (*REDIS_ERRORS, TimeoutError, OSError) as exc:
        reason = safe_message(str(exc)) or f"no answer within {READY_TIMEOUT_S:g} s"
        detail = f"Redis does not answer: {type(exc).__name__}: {reason}"
        raise ProblemError("redis-unavailable", detail) from exc
    if problems:
        raise ProblemError("redis-unavailable", "; ".join(problems))
    return web.json_response({"status": "ok"})
