"""``GET /healthz`` (liveness) and ``GET /readyz`` (readiness): which dependency is unhealthy, never where.

``/readyz`` is unauthenticated, so its 503 names the dependency (``redis``) and a short
cause from the one table of Redis replies (:func:`infra.redis_faults.readiness_cause`:
``unreachable``, ``replicas missing (NOREPLICAS)``, ``refuses writes: out of memory
(OOM)``...) with its kind (``transient``: passes by itself once Redis recovers;
``pressure``: Redis refuses writes until memory or disk is freed; ``permanent``: someone
must change something). No host, port, URL, key name or server text reaches the body:
they go to the log line (``event=not_ready``, credentials masked), for the operator.

Follows the Redis pages of PING, SET, CLUSTER INFO and XINFO GROUPS, and RFC 9457 for the
problem document.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final, NamedTuple

from aiohttp import web
from redis.exceptions import ResponseError

from infra.groups import missing_groups, streams_in_use
from infra.redis_client import REDIS_ERRORS, cluster_problems
from infra.redis_faults import fault_fields, readiness_cause
from infra.storage import probe_write
from publisher.api.problems import ProblemError
from publisher.state import FAIR_SHARES, KEYS, REDIS, SETTINGS, SHARDS
from schema.redis_replies import FaultKind

log = logging.getLogger("publisher.api.readiness")

READY_TIMEOUT_S: Final = 2.0
"""Longest wait for all of ``/readyz``'s checks, seconds."""


class Unready(NamedTuple):
    """A readiness check that failed without a Redis exception to classify."""

    cause: str
    """Short and safe (no address, no server text)."""
    fault: FaultKind
    """``transient``, ``pressure`` or ``permanent``."""
    detail: str
    """For the log line only: node addresses, key names, the server's text (masked)."""


def not_ready(dependency: str, cause: str, fault: FaultKind) -> ProblemError:
    """Return the 503 ``redis-unavailable`` problem of ``/readyz``.

    Args:
        dependency: What is unhealthy (``redis``).
        cause: Short and safe (no address, no server text).
        fault: ``transient``, ``pressure`` or ``permanent`` (:data:`schema.redis_replies.FaultKind`).

    Returns:
        The problem: ``detail`` ``"<dependency>: <cause>"`` and the extension members
        ``dependency``, ``cause`` and ``fault``.
    """
    return ProblemError("redis-unavailable", f"{dependency}: {cause}",
                        extensions={"dependency": dependency, "cause": cause, "fault": fault})


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers. Never touches Redis."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: Redis answers and takes a write, the cluster is ok, every jobs stream in use has its group.

    Within :data:`READY_TIMEOUT_S`: PING, a probe write (:func:`infra.storage.probe_write`,
    ``SET P:probe 1 PX``: fails while Redis refuses writes, e.g. OOM, NOREPLICAS,
    READONLY, MISCONF), ``cluster_state:ok`` on every primary (cluster mode), and
    ``XINFO GROUPS`` of every jobs stream in use shows ``workers``. A missing group is
    created here, as a worker creates it (:meth:`publisher.api.submit.JobShards.restore_groups`),
    so a publisher started before Redis, or a Redis that came back empty, is ready without
    waiting for a worker: submissions are kept from id 0 for the first worker to read.

    At most ``FANOUT_MAX_STATUS_READS_PER_ADDRESS`` run at once per client address (it
    takes no credential); one more is a 429 ``too-many-requests``.

    Raises:
        ProblemError: 503 ``redis-unavailable`` naming the cause (:func:`not_ready`); 429 as said.
    """
    claim = request.app[FAIR_SHARES].claim(request, "status", anonymous=True)
    try:
        return await _ready(request)
    finally:
        claim.release()


async def _ready(request: web.Request) -> web.Response:
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            unready = await _check(request.app)
    except (*REDIS_ERRORS, TimeoutError, OSError) as exc:
        cause, fault = readiness_cause(exc)
        if isinstance(exc, TimeoutError):
            cause = f"no answer within {READY_TIMEOUT_S:g} s"
        unready = Unready(cause, fault, fault_fields(exc))
    if unready is not None:
        log.warning("event=not_ready dependency=redis cause=%r %s", unready.cause, unready.detail)
        raise not_ready("redis", unready.cause, unready.fault)
    return web.json_response({"status": "ok"})


async def _check(app: web.Application) -> Unready | None:
    """Run the checks of :func:`readyz`; return the first that fails without raising, else ``None``."""
    redis, keys = app[REDIS], app[KEYS]
    await redis.ping()
    await probe_write(redis, keys.probe, timeout_s=READY_TIMEOUT_S)
    if problems := await cluster_problems(redis):
        return Unready(f"cluster down ({len(problems)} primaries not ok)", "transient", "; ".join(problems))
    missing = await missing_groups(redis, await streams_in_use(redis, keys, app[SETTINGS].job_shards))
    if missing and (refused := await app[SHARDS].restore_groups(redis, missing)):
        return _group_refused(refused)
    return None


def _group_refused(refused: list[tuple[str, ResponseError]]) -> Unready:
    _stream, exc = refused[0]
    cause, fault = readiness_cause(exc)
    detail = "; ".join(f"jobs stream {s}: cannot create its 'workers' group: {fault_fields(e)}" for s, e in refused)
    return Unready(f"jobs group cannot be created: {cause}", fault, detail)
