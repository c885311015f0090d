"""Background attempts (OpenAI Responses ``background: true``): the response id, the cursor, cancel, hand-over.

An endpoint of the upstreams file with ``background = true`` (:class:`schema.upstreams.Endpoint`)
sends ``background: true`` and ``store: true`` (:mod:`worker.platforms`), so the provider keeps
generating when the worker dies, and any process may re-read the response
(``GET {url}/responses/{id}?stream=true``) or stop it (``POST {url}/responses/{id}/cancel``),
UPSTREAMS.md E.1. A Gemini Interactions endpoint with ``background = true`` works the same way
(``{url}/v1beta/interactions/{id}?stream=true``, ``.../cancel``; the cursor is the last
``event_id``), UPSTREAMS.md E.3. This module holds what a job needs around such an attempt:

* :class:`CursorAdapter`: the Responses adapter that also keeps the response id and the last
  ``sequence_number`` it normalized (:func:`cursor_pipeline` puts it in a pipeline);
* :func:`writer_fields`: the ``(bg_id, bg_cursor, bg_endpoint)`` the job's
  :class:`~worker.stream_writer.StreamWriter` stores in meta with every batch, in the same
  append script call (:mod:`worker.append_script`), and as soon as the response id is known
  (a batch of no event), so a successor knows the response even before the first content;
* :func:`stored_state`: those meta fields, read by the worker that reclaims the stream
  (:mod:`worker.reattach` re-attaches);
* :func:`cancel_response`: the provider's cancel, since closing the socket of a background
  response stops neither generation nor billing;
* :func:`handed_over`: which running jobs a draining worker gives back at once.

Must not import :mod:`publisher` or :mod:`tools`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import aiohttp
import msgspec

from infra.redis_client import RedisClient
from schema.errors import FanoutError
from schema.job import Job
from schema.keys import Keys
from schema.upstreams import Endpoint, Target
from worker.adapters.gemini_interactions import GeminiInteractionsAdapter
from worker.adapters.openai_responses import OpenAIResponsesAdapter
from worker.auth import Authorizer
from worker.pipeline import Pipeline
from worker.secrets import Secrets
from worker.stream_writer import StreamWriter
from worker.upstream import UpstreamRequest, request_for

if TYPE_CHECKING:
    from worker.job_run import JobRun

log = logging.getLogger("fanout.worker.background")

CANCEL_TIMEOUT_S: Final = 5.0
"""Longest wait for the provider's answer to a cancel, seconds."""
HANDOVER_POLL_S: Final = 0.05
"""How often a draining worker looks for background streams to give back, seconds."""
BACKGROUND_FIELDS: Final = (b"bg_id", b"bg_cursor", b"bg_endpoint")
"""Meta fields of a background stream (written by the append script; :data:`schema.keys.META_FIELDS`)."""


class BackgroundState(msgspec.Struct, frozen=True, kw_only=True):
    """Where a background stream's provider response stands, as stored with its last batch."""

    response_id: str
    """The provider's response id (``resp_...``)."""
    cursor: int
    """The last provider ``sequence_number`` normalized into stored events (-1: none, or a Gemini
    Interactions stream, whose cursor is an opaque ``event_id``, kept in meta ``bg_cursor`` as is)."""
    endpoint: str
    """The upstreams-file endpoint that holds the response."""


class CursorAdapter(OpenAIResponsesAdapter):
    """The OpenAI Responses adapter, also keeping the response id and the last ``sequence_number`` seen."""

    cursor = -1
    """The ``sequence_number`` of the last event dispatched (-1: none yet)."""

    @property
    def response_id(self) -> str | None:
        """The provider's response id once an event named it."""
        return self._response_id

    def _dispatch(self, handlers: Mapping[str, Callable[[dict[str, Any]], None]], name: str,
                  payload: dict[str, Any]) -> None:
        super()._dispatch(handlers, name, payload)
        number = payload.get("sequence_number")
        if isinstance(number, int) and not isinstance(number, bool):
            self.cursor = number


def cursor_pipeline(pipeline: Pipeline, *, max_frame_bytes: int) -> Pipeline:
    """Return a pipeline like ``pipeline`` (same normalizer) whose adapter is a :class:`CursorAdapter`.

    A Gemini Interactions pipeline is returned as is: its adapter keeps the interaction id and
    the last ``event_id`` itself.
    """
    if isinstance(pipeline.adapter, GeminiInteractionsAdapter):
        return pipeline
    adapter = CursorAdapter(pipeline.adapter.norm, framing=pipeline.adapter.framing)
    return Pipeline(adapter, max_frame_bytes=max_frame_bytes)


def writer_fields(pipeline: Pipeline, endpoint: str) -> tuple[str, str, str] | None:
    """Return ``(bg_id, bg_cursor, bg_endpoint)`` of a background pipeline once its response id is known."""
    adapter = pipeline.adapter
    if isinstance(adapter, GeminiInteractionsAdapter) and adapter.interaction_id:
        return adapter.interaction_id, adapter.last_event_id or "", endpoint
    if not isinstance(adapter, CursorAdapter) or not adapter.response_id:
        return None
    return adapter.response_id, str(adapter.cursor), endpoint


async def stored_state(redis: RedisClient, keys: Keys, stream_id: str) -> BackgroundState | None:
    """Read a stream's background fields from meta; ``None`` for a stream that is not a background one.

    Raises:
        redis.exceptions.RedisError: Redis failed.
    """
    raw = await redis.hmget(keys.meta(stream_id), list(BACKGROUND_FIELDS))
    values = [v.decode() if isinstance(v, bytes) else v for v in raw]
    if not values[0] or not values[2]:
        return None
    cursor = values[1] or "-1"
    return BackgroundState(response_id=values[0], cursor=int(cursor) if cursor.lstrip("-").isdigit() else -1,
                           endpoint=values[2])


def response_request(job: Job, endpoint: Endpoint, response_id: str, credentials: Secrets,
                     authorizer: Authorizer, *, suffix: str) -> UpstreamRequest:
    """Return a request on the stored response with the endpoint's auth.

    ``{url}/responses/{id}{suffix}`` (OpenAI Responses) or ``{url}/v1beta/interactions/{id}{suffix}``
    (Gemini Interactions, its ``Api-Revision`` header kept).

    Args:
        job: The stream's job (its body is not sent).
        endpoint: The endpoint that holds the response.
        response_id: The provider's id.
        credentials: Where the endpoint's key is read.
        authorizer: The process's token cache.
        suffix: ``?stream=true`` (the replay) or ``/cancel``.

    Raises:
        FanoutError: ``invalid_request`` (the endpoint no longer speaks the job's API).
    """
    base = request_for(job, Target(endpoint=endpoint, model=job.model), credentials, authorizer)
    path = "v1beta/interactions" if job.provider == "gemini_interactions" else "responses"
    url = f"{endpoint.url.rstrip('/')}/{path}/{response_id}{suffix}"
    return msgspec.structs.replace(base, url=url, body=b"")


async def cancel_response(session: aiohttp.ClientSession, request: UpstreamRequest) -> int | None:
    """POST the provider's cancel; return its HTTP status, ``None`` when it could not be reached.

    Never raises: a failed cancel is logged (``event=background_cancel_failed``); the stream
    is ended ``cancelled`` either way.
    """
    headers = request.headers | (await request.auth() if request.auth is not None else {})
    try:
        async with session.post(request.url, headers=headers, allow_redirects=False,
                                timeout=aiohttp.ClientTimeout(total=CANCEL_TIMEOUT_S)) as response:
            status = response.status
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        log.warning("event=background_cancel_failed endpoint=%s error=%s", request.endpoint, type(exc).__name__)
        return None
    log.info("event=background_cancelled endpoint=%s status=%d", request.endpoint, status)
    return status


def handed_over(writer: StreamWriter | None) -> bool:
    """Whether a draining worker gives this job back at once: meta holds its background response's id.

    Only then does a successor re-attach (:mod:`worker.reattach`); a stream whose response id
    is not stored yet would be started again from scratch, so it drains as others do.
    """
    return writer is not None and writer.background_stored is not None and writer.terminal is None


async def cancel_background(run: JobRun) -> int | None:
    """Cancel the job's background response at its provider, if it has one (known here or stored in meta).

    Returns:
        The provider's HTTP status, or ``None`` (no background response, or not reachable).

    Raises:
        redis.exceptions.RedisError: Reading meta failed.
    """
    ctx, job = run.ctx, run.job
    fields = run.writer.background if run.writer is not None else None
    if fields is None:
        state = await stored_state(ctx.appender.redis, ctx.appender.keys, job.stream_id)
        fields = (state.response_id, str(state.cursor), state.endpoint) if state else None
    endpoint = ctx.upstreams.endpoints.get(fields[2]) if fields else None
    if fields is None or endpoint is None:
        return None
    try:
        request = response_request(job, endpoint, fields[0], ctx.credentials, ctx.authorizer, suffix="/cancel")
    except FanoutError:
        return None
    log.info("event=background_cancel stream_id=%s endpoint=%s", job.stream_id, endpoint.name)
    return await cancel_response(ctx.session, request)


async def drain_handing_over(runs: Mapping[str, JobRun], tasks: set[asyncio.Task[None]],
                             drain_s: float) -> set[asyncio.Task[None]]:
    """Wait up to ``drain_s`` for ``tasks``, stopping (``shutdown``) every run :func:`handed_over` meanwhile.

    A stopped run writes nothing and its entry is released by the runner, so another worker
    re-attaches at its next ``XAUTOCLAIM``. Checked every :data:`HANDOVER_POLL_S`, so a
    background stream that stores its first content during the drain is given back too.

    Returns:
        The tasks still running at the end of ``drain_s``.
    """
    deadline = time.monotonic() + drain_s
    pending = set(tasks)
    while pending:
        for run in list(runs.values()):
            if run.stopper.reason is None and handed_over(run.writer):
                log.info("event=background_handover stream_id=%s", run.job.stream_id)
                run.stop("shutdown")
        left = deadline - time.monotonic()
        if left <= 0:
            break
        _done, pending = await asyncio.wait(pending, timeout=min(left, HANDOVER_POLL_S))
    return pending
