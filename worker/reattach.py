"""Re-attach a reclaimed background stream to its provider response: replay, check, continue.

A worker that claims a stream with events past ``stream.start`` (its previous owner died,
drained or lost its lease) used to end it ``worker_lost``, and one with only ``stream.start``
stored called the model again. When meta holds a background response
(:func:`worker.background.stored_state`; stored as soon as its id is known, even before
any content) on an endpoint that still runs in background mode, :func:`reattach` instead:

1. opens ``GET {url}/responses/{bg_id}?stream=true`` on the stored endpoint: the provider
   replays the response from its first event (``sequence_number`` 0, ``response.created``)
   and then streams the rest as it is generated (UPSTREAMS.md E.2); for a Gemini
   Interactions endpoint ``GET {url}/v1beta/interactions/{bg_id}?stream=true``, with no
   ``last_event_id`` (E.3; the replay from the first event is **unconfirmed** there);
2. normalizes that replay from the start with a fresh adapter (the normalizer continues
   after the stored ``stream.start``), so the adapter's state is rebuilt exactly as the
   dead worker's was: the same provider events in the same order give the same contract
   events at the same seqs;
3. compares every regenerated event at a stored seq with the stored one (all fields but
   ``ts``) and stores nothing for it; appends only the events beyond the stored seq,
   fenced by the new token like any append, with the cursor updated in the same call.

How it ends otherwise (each with one log line that says why):

===========================================  ==========================================
found                                        the stream ends
===========================================  ==========================================
the provider answers 400/404 (the window     ``interrupted``/``worker_lost``
passed), or any other non-2xx or transport
failure before the replay's body
the endpoint is gone from the upstreams      ``interrupted``/``worker_lost``
file or no longer ``background``
the replay breaks before reaching the        ``interrupted``/``worker_lost``
stored seq
a regenerated event differs from the         ``failed``/``protocol``
stored one at its seq
===========================================  ==========================================

With only ``stream.start`` stored, a replay that cannot be read, or that ends in a retryable
error before any content, leaves the job to a fresh attempt, as any failure before content.

``starting_after`` (Gemini: ``last_event_id``) is not used: it would need the adapter's state persisted, and a full
replay costs only the already-generated events once more (the design's "full replay +
dedupe by fanout seq").

Must not import :mod:`publisher` or :mod:`tools`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec
from opentelemetry import trace
from yarl import URL

from schema.contract import Event, StreamError, encode_event
from schema.errors import FanoutError, UpstreamError, UpstreamProtocolError
from schema.stored_entries import entry_jsons
from worker.attempt import Attempt, RetryAttempt
from worker.background import BackgroundState, cursor_pipeline, response_request, stored_state
from worker.control import Deadline
from worker.pipeline import Pipeline
from worker.targets import endpoint_limits
from worker.upstream_errors import MAX_ERROR_BODY_BYTES, http_error

if TYPE_CHECKING:
    from worker.job_run import JobRun

log = logging.getLogger("fanout.worker.reattach")

EXPIRED_STATUSES = frozenset({400, 404})
"""Provider answers to the replay that mean its window passed (UPSTREAMS.md E.1)."""
_json: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


class ReplayLost(Exception):  # noqa: N818 - a control signal
    """The replay cannot continue the stream; it ends ``worker_lost`` (the message says why)."""


class ReplayDisagrees(Exception):  # noqa: N818 - a control signal
    """A regenerated event differs from the stored one at the same seq."""


def _comparable(raw: bytes | str) -> dict[str, Any]:
    value = _json.decode(raw)
    value.pop("ts", None)
    return dict(value)


class ReplayHost:
    """The :class:`~worker.attempt.AttemptHost` of a replay: skips and checks stored seqs, appends the rest.

    Args:
        run: The job run that reclaimed the stream.
        state: The stored background fields.
        stored: Stored event JSON by seq, from seq 2 to the claim's ``last_seq``.
    """

    def __init__(self, run: JobRun, state: BackgroundState, stored: dict[int, bytes]) -> None:
        self.run, self.state, self.stored = run, state, stored
        self.job, self.settings, self.session = run.job, run.settings, run.session
        self.telemetry, self.stopper, self.total_at = run.telemetry, run.stopper, run.total_at
        self.stored_seq = max(stored, default=1)

    def new_pipeline(self, framing: str) -> Pipeline:
        """Return a cursor pipeline continuing after ``stream.start`` (the replay starts at the response's start)."""
        run = self.run
        assert run.writer is not None
        stored_last = run.writer.last_seq
        run.writer.last_seq = 1  # the normalizer numbers the replay from seq 2, as the first owner did
        try:
            pipeline = run.new_pipeline(framing)
        finally:
            run.writer.last_seq = stored_last
        run._pipeline = cursor_pipeline(pipeline, max_frame_bytes=self.settings.max_frame_bytes)
        return run._pipeline

    async def deliver(self, pipeline: Pipeline, events: list[Event], *, retry_after_s: float | None = None) -> None:
        """Check the events at stored seqs, append the others.

        Raises:
            ReplayLost: The replay broke (transport, timeout) before the stored seq.
            ReplayDisagrees: An event differs from the stored one.
        """
        fresh = []
        for event in events:
            if event.seq > self.stored_seq:
                fresh.append(event)
            elif _comparable(encode_event(event)) != _comparable(self.stored[event.seq]):
                if isinstance(event, StreamError) and event.error.category in ("transport", "timeout"):
                    raise ReplayLost(f"the replay broke before the stored seq {self.stored_seq}: "
                                     f"{event.error.message}")
                raise ReplayDisagrees(f"the provider's replay differs from the stored stream at seq {event.seq}")
        if fresh:  # stored as any attempt's events (a retryable error before content raises RetryAttempt)
            await self.run.deliver(pipeline, fresh)


class ReplayAttempt(Attempt):
    """An attempt that reads the stored response (``GET ...?stream=true``) instead of creating one."""

    async def _exchange(self, pipeline: Pipeline, span: trace.Span) -> None:
        host, limits = self.host, self.limits
        headers_by = Deadline(("idle", time.monotonic() + limits.connect_timeout_s + limits.idle_timeout_s),
                              ("total", host.total_at))
        try:
            response = await host.stopper.race(self._open(), headers_by)
        except UpstreamError as exc:  # a timeout, a credential that cannot be made
            raise ReplayLost(f"the provider could not be reached ({exc.message})") from exc
        span.set_attribute("http.response.status_code", response.status)
        try:
            await self._pump(pipeline, response)
        finally:
            response.close()

    async def _open(self) -> aiohttp.ClientResponse:
        """Send the ``GET`` and return its 2xx response, body unread.

        Raises:
            ReplayLost: No connection, or a non-2xx answer (400/404: the window passed).
            worker.auth.CredentialError: The endpoint's token could not be made.
        """
        request = self.request
        headers = request.headers | (await request.auth() if request.auth is not None else {})
        timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=self.limits.connect_timeout_s,
                                        sock_read=None)
        try:
            response = await self.host.session.get(URL(request.url, encoded=True), headers=headers,
                                                   allow_redirects=False, timeout=timeout)
            if 200 <= response.status < 300:
                return response
            body = await response.content.read(MAX_ERROR_BODY_BYTES)
        except (aiohttp.ClientError, OSError) as exc:
            raise ReplayLost(f"the provider could not be reached ({type(exc).__name__})") from exc
        response.release()
        error = http_error(request.provider, response.status, dict(response.headers), body)
        why = "the provider's window for the response passed" if response.status in EXPIRED_STATUSES \
            else "the provider refused the replay"
        raise ReplayLost(f"{why} (HTTP {response.status}: {error.message})")


async def _stored_events(run: JobRun, last_seq: int) -> dict[int, bytes]:
    """Return the stored event JSON by seq, from seq 2 to ``last_seq``."""
    appender = run.ctx.appender
    raw: Any = await appender.redis.xrange(appender.keys.events(run.job.stream_id), "0-2", f"0-{last_seq}")
    stream_id = run.job.stream_id
    return {seq: data for entry_id, fields in raw for seq, data in entry_jsons(stream_id, entry_id, fields)}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def reattach(run: JobRun, last_seq: int) -> bool:
    """Continue a reclaimed stream from its background response; False when it is not a background stream.

    Args:
        run: The job run holding the new token (its writer open at ``last_seq``).
        last_seq: Meta ``last_seq`` at the claim (2 or more).

    Returns:
        True when the stream was handled here (continued, or ended as the module's table says).

    Raises:
        worker.control.Stopped: The job was stopped meanwhile (nothing more stored).
        redis.exceptions.RedisError: Redis failed (the job stays pending).
    """
    ctx, sid = run.ctx, run.job.stream_id
    state = await stored_state(ctx.appender.redis, ctx.appender.keys, sid)
    if state is None:
        return False
    assert run.writer is not None
    run.writer.background = (state.response_id, str(state.cursor), state.endpoint)
    run.writer.background_stored = state.response_id
    try:
        await _replay(run, state, last_seq)
    except RetryAttempt:  # the response failed retryably before any content: a fresh attempt may follow
        log.info("event=reattach_retry stream_id=%s", sid)
        return False
    except ReplayLost as exc:
        if last_seq <= 1:  # nothing but stream.start stored: a fresh attempt may follow
            log.info("event=reattach_fresh stream_id=%s reason=\"%s\"", sid, exc)
            return False
        log.warning("event=reattach_lost stream_id=%s reason=\"%s\"", sid, exc)
        await run._write_error(FanoutError("the worker running this stream stopped mid-output and the provider's "
                                           "response could not be re-read", category="worker_lost", retryable=True))
    except ReplayDisagrees as exc:
        log.error("event=reattach_disagrees stream_id=%s reason=\"%s\"", sid, exc)
        await run._write_error(UpstreamProtocolError(str(exc)))
    return True


async def _replay(run: JobRun, state: BackgroundState, last_seq: int) -> None:
    """Re-read the response on its endpoint and continue the stream (:class:`ReplayAttempt`).

    Raises:
        ReplayLost, ReplayDisagrees: As :class:`ReplayHost` and :class:`ReplayAttempt` say.
    """
    ctx = run.ctx
    endpoint = ctx.upstreams.endpoints.get(state.endpoint)
    if endpoint is None or not endpoint.background:
        raise ReplayLost(f"endpoint {state.endpoint!r} no longer runs in background mode")
    try:
        request = response_request(run.job, endpoint, state.response_id, ctx.credentials, ctx.authorizer,
                                   suffix="?stream=true")
        targets, _ = run._targets()
    except FanoutError as exc:  # invalid_request: the job can no longer go there
        raise ReplayLost(exc.message) from exc
    run._target = next((t for t in targets if t.name == state.endpoint), None)
    if run._target is None:
        raise ReplayLost(f"the job's route no longer names endpoint {state.endpoint!r}")
    stored = await _stored_events(run, last_seq)
    log.info("event=reattach_start stream_id=%s endpoint=%s stored_seq=%d cursor=%d", run.job.stream_id,
             state.endpoint, last_seq, state.cursor)
    await ReplayAttempt(ReplayHost(run, state, stored), request, 1, endpoint=state.endpoint,
                        limits=endpoint_limits(endpoint, run.settings)).run()
