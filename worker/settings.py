"""The worker's configuration: one frozen Struct read from ``FANOUT_*`` variables.

Every field is the variable's name lower-cased without ``FANOUT_`` (``FANOUT_IDLE_TIMEOUT_S``
→ ``idle_timeout_s``); ``REDIS_URL`` maps as :func:`schema.settings.load_settings` describes
(``OTEL_*`` variables are the SDK's: :mod:`infra.otel_setup`; ``FANOUT_LOG_LEVEL`` and
``FANOUT_LOG_FORMAT`` every process's: :mod:`schema.logs`). Provider API keys are not settings: they
are read by :func:`worker.upstream.credentials_from_env` and never stored in a Struct
that could be logged. Units live in the names (``_s`` seconds, ``_ms`` milliseconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Final, Literal

import msgspec

from schema.cli import DEFAULT_REDIS_URL, redact_url
from schema.keys import MAX_JOB_SHARDS
from schema.settings import SettingsError, load_settings
from schema.upstreams_file import base_url_problem as base_url_problem

BASE_URL_FIELDS: Final = ("openai_base_url", "anthropic_base_url", "gemini_base_url")
"""The provider API roots (``FANOUT_<PROVIDER>_BASE_URL``), each checked by :func:`base_url_problem`."""

_Positive = Annotated[float, msgspec.Meta(gt=0)]
_NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything ``fanout worker`` reads from the environment (or CLI overrides)."""

    redis_url: str = DEFAULT_REDIS_URL
    """Redis to use (``REDIS_URL``)."""
    redis_prefix: str = "fanout"
    """Key namespace (``FANOUT_REDIS_PREFIX``), see :class:`schema.keys.Keys`."""
    redis_cluster: bool = False
    """``FANOUT_REDIS_CLUSTER=1``: ``REDIS_URL`` (``redis://`` or ``rediss://``) names a seed node of a Redis
    Cluster (:mod:`infra.redis_client`)."""
    live_pubsub: Literal["auto", "classic", "sharded"] = "auto"
    """``FANOUT_LIVE_PUBSUB``: how the append script notifies live channels; ``auto`` is
    ``SPUBLISH`` on a cluster whose every primary runs Redis 7+, ``PUBLISH`` elsewhere
    (:func:`infra.live_pubsub.live_mode`); ``sharded`` on a single node or a primary older than
    7.0 is refused at start (exit 2); publishers must agree."""
    job_shards: Annotated[int, msgspec.Meta(ge=1, le=MAX_JOB_SHARDS)] = 1
    """``FANOUT_JOB_SHARDS``: jobs streams ``P:jobs:{0..n-1}``; the worker serves at least
    these and every shard count a publisher recorded (:mod:`worker.shards`)."""
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 16
    """Streams one worker process runs at once (``--concurrency``)."""
    block_ms: Annotated[int, msgspec.Meta(ge=1)] = 2000
    """``XREADGROUP BLOCK`` while waiting for jobs; bounds how fast shutdown stops intake. An idle
    worker sends two commands per jobs stream per block."""

    connect_timeout_s: _Positive = 10.0
    """TCP (and TLS) connect to the provider; past it the attempt fails ``timeout``."""
    idle_timeout_s: _Positive = 60.0
    """No byte from the provider (headers or body) for this long: ``interrupted``/``timeout``."""
    progress_timeout_s: _Positive = 120.0
    """No meaningful event (pings, comments, keep-alives do not count): ``interrupted``/``timeout``."""
    total_timeout_s: _Positive = 900.0
    """Whole job, retries included: ``interrupted``/``timeout`` when exceeded."""

    max_retries: Annotated[int, msgspec.Meta(ge=0, le=20)] = 2
    """Upstream retries after the first attempt, only before the first delta is stored."""
    backoff_base_s: _Positive = 0.5
    """First backoff window; attempt ``n`` waits uniformly in ``[0, base * 2**(n-1)]`` (full jitter)."""
    backoff_max_s: _Positive = 10.0
    """Upper bound of the jittered backoff window."""
    retry_after_max_s: _NonNegative = 30.0
    """Largest ``Retry-After`` honoured; longer answers are cut to this."""
    cooldown_after_failures: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 3
    """Retryable failures in a row (HTTP 429/5xx/529, connection errors, timeouts, errors before
    content) after which an upstreams-file endpoint cools down for ``cooldown_failure_s``; 0: never
    for that reason. Cooldowns are per worker process (docs/upstreams.md)."""
    cooldown_failure_s: _NonNegative = 30.0
    """How long an endpoint that failed ``cooldown_after_failures`` times in a row is skipped while
    others of its route remain, seconds."""
    cooldown_max_s: _NonNegative = 300.0
    """Longest cooldown a ``Retry-After`` on HTTP 429/503/529 sets, seconds (an endpoint that asks
    for longer is skipped this long)."""

    lease_s: _Positive = 30.0
    """Lease of a running job: its pending entry is renewed every ``lease_s / 3``; a job idle
    longer is reclaimed by ``XAUTOCLAIM``."""
    append_retry_s: _NonNegative = 30.0
    """How long a write to Redis (claim, append, terminal, ack) that failed on a connection
    error, timeout, a transient refusal (``LOADING``, ``BUSY``, ``NOREPLICAS``, ``MASTERDOWN``,
    ``READONLY``, ``TRYAGAIN``, ``CLUSTERDOWN``: :mod:`schema.redis_replies`), ``OOM`` or
    ``MISCONF`` is tried again, seconds; capped by ``lease_s`` (:attr:`append_retry_window_s`).
    ``OOM``/``MISCONF`` lasting longer end the stream ``failed``/``internal``."""
    append_retry_base_s: _Positive = 0.05
    """First backoff window of those retries (and of failed lease renewals); doubles per try (full jitter)."""
    append_retry_max_delay_s: _Positive = 1.0
    """Longest single wait between two tries of a failed write."""
    terminal_wait_replicas: Annotated[int, msgspec.Meta(ge=0, le=16)] = 0
    """After a stream's terminal event is stored and before its job is acked, ``WAIT`` for this
    many replicas of the stream's primary (0: no ``WAIT``); set 1 with replicas (Cluster)."""
    terminal_wait_ms: Annotated[int, msgspec.Meta(ge=1)] = 1000
    """Longest ``WAIT`` of that check, ms; the job is acked afterwards either way."""
    max_claims: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 5
    """A stream claimed more often than this (meta ``token``: every claim or reclaim counts)
    is ended ``failed``/``internal`` instead of being run again."""
    drain_s: _NonNegative = 25.0
    """After SIGTERM, how long running streams may go on before they are stopped unwritten."""
    stream_ttl_s: Annotated[int, msgspec.Meta(ge=1)] = 86_400
    """TTL of a finished stream's events and meta."""
    tombstone_ttl_s: Annotated[int, msgspec.Meta(ge=1)] = 7 * 86_400
    """TTL of the tombstone (``last_seq``, ``status``) that outlives the events, so a reader gets
    ``204``/``410`` instead of ``404``."""
    done_maxlen: Annotated[int, msgspec.Meta(ge=1)] = 100_000
    """Approximate cap (``MAXLEN ~``) of the finished-stream summaries stream ``P:done``."""
    live_max_bytes: Annotated[int, msgspec.Meta(ge=0)] = 64 * 1024
    """Largest batch (its events' compact stored bytes + 1 per event) whose events ride on the live
    notification; a larger batch is notified by its last seq only (publishers then read it). 0: always seq-only."""
    compact_grace_s: float = 10.0
    """How long after its terminal event a finished stream is compacted (its deltas rewritten as
    one entry per block run, losslessly: :mod:`worker.compactor`), seconds; short, so most
    reloads read the compacted form. Negative: never compact."""
    compact_run_deltas: Annotated[int, msgspec.Meta(ge=1, le=65_536)] = 512
    """Most deltas one compacted entry holds (a reader expands at most this many for one entry)."""
    compact_sweep_s: _Positive = 1.0
    """How often each worker looks for streams whose compaction is due, seconds."""
    max_frame_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 8 * 1024 * 1024
    """Largest SSE frame, JSON-array element or AWS event-stream message (Bedrock) accepted from a provider;
    past it ``failed``/``protocol``."""

    openai_base_url: str = "https://api.openai.com/v1"
    """OpenAI (or compatible server) API root; ``/chat/completions`` or ``/responses`` is appended.
    Each ``*_BASE_URL`` must be an http(s) URL with a host (checked at start, exit 2 otherwise)."""
    anthropic_base_url: str = "https://api.anthropic.com"
    """Anthropic API root; ``/v1/messages`` is appended."""
    gemini_base_url: str = "https://generativelanguage.googleapis.com"
    """Gemini API root; ``/v1beta/models/{model}:streamGenerateContent`` is appended."""
    gemini_framing: Literal["sse", "json_array"] = "sse"
    """``sse`` asks Gemini for ``alt=sse``; ``json_array`` reads its default streamed array."""
    upstreams_file: str = ""
    """``FANOUT_UPSTREAMS_FILE``: path of the upstreams file (TOML, see the Upstreams page): named
    endpoints (OpenAI-compatible servers, Azure, Vertex, Bedrock) and model routes. When set, the
    ``*_BASE_URL`` variables above and ``FANOUT_GEMINI_FRAMING`` no longer apply; a mistake in it,
    or an endpoint whose secret cannot be read, stops the worker at start (exit 2)."""

    metrics_poll_s: _Positive = 5.0
    """How often the jobs consumer group is read (``XINFO GROUPS``) for the ``fanout.jobs.pending``
    and ``fanout.jobs.lag`` gauges, seconds; only while metrics are exported. The ``OTEL_*``
    variables are read by :mod:`infra.otel_setup`, not here."""

    @property
    def append_retry_window_s(self) -> float:
        """The retry window of a failed write: ``append_retry_s``, at most ``lease_s``."""
        return min(self.append_retry_s, self.lease_s)

    @property
    def lease_renew_s(self) -> float:
        """Seconds between two renewals of a running job's lease (a third of the lease)."""
        return self.lease_s / 3


def load_worker_settings(environ: Mapping[str, str], **overrides: object) -> WorkerSettings:
    """Read :class:`WorkerSettings` from ``environ`` plus CLI overrides (``None`` ignored).

    Raises:
        schema.settings.SettingsError: A variable that does not parse or is out of range,
            or a ``FANOUT_*_BASE_URL`` that is not an http(s) URL with a host (named with
            its value, a password masked): the worker cannot start (exit 2).
    """
    settings = load_settings(WorkerSettings, environ, **overrides)
    for field in BASE_URL_FIELDS:
        value = getattr(settings, field)
        problem = base_url_problem(value)
        if problem:
            example = getattr(WorkerSettings(), field)
            raise SettingsError(f"bad configuration: FANOUT_{field.upper()}={redact_url(value)!r}: {problem}, "
                                f"e.g. {example}")
    return settings
