"""``POST /v1/streams`` (submit a job) and ``POST /v1/streams/{stream_id}/tokens`` (mint a read token).

Submission follows the protocol of :mod:`schema.keys`: create the stream's meta
(``state=queued``, ``provider``, ``model``, ``created_ms``, ``body_hash``,
``last_seq=0``, and ``traceparent`` of the submit span when traced), then XADD the Job
JSON (its ``trace_context`` set by the OpenTelemetry propagator) under field ``j`` to the
stream id's jobs shard (:class:`JobShards`; ``FANOUT_JOB_SHARDS``), and store its ref as
meta ``job_id``. The meta
is created by one script that first looks for the stream (meta, tombstone or events),
so a client-chosen ``stream_id`` is an idempotency key: the same body gets the same
answer, another body a 409, and a stream id never names two jobs.

Follows the Redis pages of EVAL, HSET and XADD.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

import msgspec
from aiohttp import web
from opentelemetry import propagate
from redis.exceptions import RedisError, ResponseError

from infra.groups import ensure_group, ensure_jobs_group
from infra.redis_client import REDIS_ERRORS, RedisClient
from infra.redis_faults import fault_kind
from publisher.api.auth import require_api_key
from publisher.api.limits import path_stream_id, read_body
from publisher.api.problems import FieldError, ProblemError
from publisher.api.tokens import issue
from publisher.api.validation import Submission, check_route, decode_body, parse_submission
from publisher.history.visibility import Scope
from publisher.settings import PublisherSettings
from publisher.state import KEYS, REDIS, SETTINGS, SHARDS, UPSTREAMS
from schema.job import Job, job_encoder, new_stream_id
from schema.keys import JOB_FIELD, Keys, shard_of
from schema.logs import quoted

log = logging.getLogger(__name__)

CREATE_META: Final = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[1], 'body_hash') ~= ARGV[1] then return 'conflict' end
  if redis.call('HEXISTS', KEYS[1], 'job_id') == 0 and redis.call('HGET', KEYS[1], 'state') == 'queued'
     and tonumber(ARGV[2]) - tonumber(redis.call('HGET', KEYS[1], 'created_ms') or '0') > tonumber(ARGV[3]) then
    redis.call('HSET', KEYS[1], 'created_ms', ARGV[2])
    return 'orphan'
  end
  return 'same'
end
if redis.call('EXISTS', KEYS[2]) == 1 or redis.call('EXISTS', KEYS[3]) == 1 then return 'used' end
redis.call('HSET', KEYS[1], 'body_hash', ARGV[1], unpack(ARGV, 4))
return 'created'
"""
"""KEYS: meta, tomb, events (one hash slot). ARGV: body_hash, now_ms, orphan_after_ms, then
meta field/value pairs. Returns ``created``, ``same`` (meta with this body hash),
``orphan`` (same body, but the job was never enqueued: a publisher died between the meta
and the XADD more than ``orphan_after_ms`` ago; the caller enqueues it now),
``conflict`` (another body) or ``used`` (only a tombstone or events remain)."""

ORPHAN_AFTER_MS: Final = 30_000
"""A queued meta without ``job_id`` older than this was orphaned by a crashed publisher
(an XADD never takes this long); resubmitting the same body enqueues its job."""


SHARD_ANNOUNCE_S: Final = 30.0
"""How often a submitting publisher records its shard count again (``SADD P:jobshards``), seconds:
workers serve every recorded count, and this restores it after Redis lost its data."""


class JobShards:
    """Which jobs stream a submission goes to, and the record of the shard count in ``P:jobshards``.

    Args:
        keys: Key layout.
        shards: ``FANOUT_JOB_SHARDS``.
    """

    def __init__(self, keys: Keys, shards: int) -> None:
        self.keys, self.shards = keys, shards
        self._announced_at: float | None = None

    def stream_for(self, stream_id: str) -> str:
        """Jobs stream of ``stream_id``: shard :func:`schema.keys.shard_of` (stable across publishers)."""
        return self.keys.jobs_shard(shard_of(stream_id, self.shards))

    async def announce(self, redis: RedisClient, *, create_groups: bool = False) -> bool:
        """``SADD P:jobshards <shards>`` at most every :data:`SHARD_ANNOUNCE_S` (always with ``create_groups``).

        With ``create_groups`` also creates every shard and its ``workers`` group (at start, so
        readiness passes before the first worker ran). Returns False, after logging, when
        Redis failed: the next submission tries again.
        """
        now = time.monotonic()
        if not create_groups and self._announced_at is not None and now - self._announced_at < SHARD_ANNOUNCE_S:
            return True
        try:
            await redis.sadd(self.keys.job_shards, str(self.shards))
            if create_groups:
                for stream in self.keys.jobs_streams(self.shards):
                    await ensure_group(redis, stream)
        except REDIS_ERRORS as exc:
            log.warning("could not record the job shard count in Redis: %s: %s", type(exc).__name__, exc)
            return False
        self._announced_at = now
        return True


    async def restore_groups(self, redis: RedisClient, streams: list[str]) -> list[tuple[str, ResponseError]]:
        """Record the shard count and create the ``workers`` group of each of ``streams``.

        ``/readyz`` calls it for the jobs streams it found without their group: a Redis
        that did not answer when this publisher started (so :func:`announce_shards` could
        not create them), a mistyped prefix, or a Redis that lost its data. The group is
        the one a worker creates (:func:`infra.groups.ensure_group`: start id 0 and
        ``MKSTREAM``), so jobs submitted before any worker started are read, and creating
        it is idempotent (``BUSYGROUP``, a worker was first, is not an error): no job is
        lost or delivered twice by it.

        Args:
            redis: The command client.
            streams: Jobs stream keys, each possibly absent.

        Returns:
            ``(stream, refusal)`` per stream whose group Redis refused for good to create
            (e.g. ``WRONGTYPE``: the key is not a stream); empty when every group now exists.

        Raises:
            redis.exceptions.RedisError: Redis failed otherwise, or refused with a reply a
                retry cures (:func:`infra.redis_faults.fault_kind`); the caller answers 503.
        """
        await redis.sadd(self.keys.job_shards, str(self.shards))
        self._announced_at = time.monotonic()
        problems = []
        for stream in streams:
            try:
                created = await ensure_jobs_group(redis, self.keys, stream)
            except ResponseError as exc:
                if fault_kind(exc) != "permanent":
                    raise
                problems.append((stream, exc))
                continue
            if created:
                log.warning("created the 'workers' consumer group of jobs stream %s (start id 0): Redis had none "
                            "(a fresh Redis, or one that lost its data)", stream)
        return problems


async def announce_shards(redis: RedisClient, shards: JobShards) -> None:
    """At publisher start: record the shard count and create the shards' groups (:meth:`JobShards.announce`)."""
    await shards.announce(redis, create_groups=True)


def _urls(stream_id: str) -> dict[str, str]:
    base = f"/v1/streams/{stream_id}"
    return {"events_url": f"{base}/events", "status_url": base, "cancel_url": f"{base}/cancel"}


def _token(settings: PublisherSettings, stream_id: str, scope: Scope) -> dict[str, Any]:
    expires_at = int(time.time()) + settings.token_ttl_s
    token = issue(settings.token_secret, stream_id, scope, expires_at)
    return {"token": token, "token_expires_at": expires_at, "token_scope": scope}


def _trace_context() -> dict[str, str]:
    """W3C trace context (``traceparent``, ``tracestate``) of the current (submit) span; empty untraced."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


async def _create_meta(request: web.Request, stream_id: str, sub: Submission, now_ms: int) -> str:
    keys, redis = request.app[KEYS], request.app[REDIS]
    fields = ["state", "queued", "provider", sub.provider, "model", sub.model,
              "created_ms", str(now_ms), "last_seq", "0"]
    traceparent = _trace_context().get("traceparent")
    if traceparent:  # read by the SSE handler, which links its span to the submit span
        fields += ["traceparent", traceparent]
    outcome = await redis.eval(
        CREATE_META, 3, keys.meta(stream_id), keys.tomb(stream_id), keys.events(stream_id),
        sub.body_hash(), str(now_ms), str(ORPHAN_AFTER_MS), *fields,
    )
    return outcome.decode() if isinstance(outcome, bytes) else str(outcome)


async def _enqueue(request: web.Request, stream_id: str, sub: Submission, now_ms: int) -> None:
    """XADD the job; on failure remove the fresh meta so a retry can submit again."""
    keys, redis, shards = request.app[KEYS], request.app[REDIS], request.app[SHARDS]
    job = Job(stream_id=stream_id, provider=sub.provider, model=sub.model, request=sub.request,
              metadata=sub.metadata, created_ms=now_ms, reasoning_visibility=sub.reasoning_visibility,
              endpoint=sub.endpoint, trace_context=_trace_context())
    await shards.announce(redis)
    stream = shards.stream_for(stream_id)
    try:
        entry_id = await redis.xadd(stream, {JOB_FIELD: job_encoder.encode(job)})
    except RedisError:
        await redis.delete(keys.meta(stream_id))
        raise
    text_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    await redis.hsetnx(keys.meta(stream_id), "job_id", keys.job_ref(stream, text_id))  # never over a claim's


async def submit(request: web.Request) -> web.Response:
    """Validate a job, store its meta, enqueue it and answer ``201`` with URLs and a read token.

    Returns:
        ``201`` with ``stream_id``, ``events_url``, ``status_url``, ``cancel_url``,
        ``token`` (scope ``public``), ``token_expires_at`` (epoch seconds) and
        ``token_scope``; the same for a repeated submission of the same body.

    Raises:
        ProblemError: 401 (API key), 413 (body size), 400 (``invalid-body``,
            ``invalid-field``: also a job no endpoint serves, :func:`check_route`),
            409 (``stream-id-conflict``).
    """
    require_api_key(request)
    sub = parse_submission(await read_body(request, request.app[SETTINGS].max_body_bytes))
    body = await accept_submission(request, sub)
    return web.json_response(body, status=201, headers={"Location": body["status_url"]})


async def accept_submission(request: web.Request, sub: Submission) -> dict[str, Any]:
    """Store and enqueue a validated job; return the ``201`` body of :func:`submit`.

    The caller has already checked who may submit (:func:`submit`: an API key; the demo
    route: demo mode and its own page).

    Raises:
        ProblemError: 400 (``invalid-field``: no endpoint serves the job, :func:`check_route`),
            409 (``stream-id-conflict``).
    """
    check_route(request.app[UPSTREAMS], sub)
    settings = request.app[SETTINGS]
    stream_id = sub.stream_id or new_stream_id()
    now_ms = int(time.time() * 1000)
    outcome = await _create_meta(request, stream_id, sub, now_ms)
    if outcome in ("created", "orphan"):
        await _enqueue(request, stream_id, sub, now_ms)
        log.info("event=submitted stream_id=%s provider=%s model=%s%s", stream_id, sub.provider, quoted(sub.model),
                 " again=first_job_never_enqueued" if outcome == "orphan" else "")
    elif outcome != "same":
        detail = "the stream id is taken by a job with another body" if outcome == "conflict" else (
            "the stream id belonged to an earlier job whose history expired")
        raise ProblemError("stream-id-conflict", detail, extensions={"stream_id": stream_id})
    return {"stream_id": stream_id, **_urls(stream_id), **_token(settings, stream_id, "public")}


class _TokenRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    scope: Scope = "public"


def _parse_token_request(raw: bytes) -> Scope:
    body = decode_body(raw or b"{}")
    if not isinstance(body, dict):
        raise ProblemError("invalid-body", "the body must be a JSON object")
    try:
        return msgspec.convert(body, _TokenRequest).scope
    except msgspec.ValidationError as exc:
        error = FieldError(field="scope", detail="must be 'public' or 'internal' (the only field)")
        raise ProblemError("invalid-field", "the body takes one field, scope: 'public' or 'internal'",
                           errors=[error]) from exc


async def mint_token(request: web.Request) -> web.Response:
    """Issue a fresh read token for a known stream (``{"scope": "public" | "internal"}``).

    Used to renew an expiring token and to hand an ``internal`` reader its token.

    Raises:
        ProblemError: 401 (API key), 404 (no meta, events or tombstone), 400 (bad body).
    """
    require_api_key(request)
    stream_id = path_stream_id(request)
    scope = _parse_token_request(await read_body(request, request.app[SETTINGS].max_body_bytes))
    keys, redis = request.app[KEYS], request.app[REDIS]
    if not await redis.exists(keys.meta(stream_id), keys.tomb(stream_id), keys.events(stream_id)):
        raise ProblemError("not-found", f"no stream {stream_id}")
    body = {"stream_id": stream_id, **_token(request.app[SETTINGS], stream_id, scope)}
    return web.json_response(body, status=201)
