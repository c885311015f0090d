"""The publisher's settings: ``FANOUT_*`` environment variables as one frozen Struct.

Built with :func:`schema.settings.load_settings` (``FANOUT_TOKEN_TTL_S`` → ``token_ttl_s``;
``REDIS_URL`` → ``redis_url``), then checked by :func:`resolve_secrets`, which refuses a
deployment that could not work across several publishers. Imports no aiohttp or redis.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
from collections.abc import Mapping
from typing import Annotated, Literal

import msgspec

from schema.cli import DEFAULT_REDIS_URL
from schema.keys import MAX_JOB_SHARDS
from schema.settings import SettingsError, load_settings

log = logging.getLogger(__name__)

MIN_SECRET_CHARS = 32
"""Shortest accepted ``FANOUT_TOKEN_SECRET`` (characters); shorter keys are guessable."""

ProxyNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Positive = Annotated[int, msgspec.Meta(ge=1)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]


class PublisherSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Every knob of the publisher; field ``x`` is read from ``FANOUT_X``."""

    api_keys: list[str] = msgspec.field(default_factory=list)
    """Bearer API keys allowed to submit and cancel jobs and read any stream (comma-separated)."""
    token_secret: str = ""
    """HMAC-SHA256 key of read tokens; every publisher of a deployment shares it. Required (at
    least 32 characters) unless ``FANOUT_DEV=1``."""
    dev: bool = False
    """Development mode (or ``--dev``): a missing token secret is generated (per process) with a warning."""
    token_ttl_s: Positive = 3600
    """Lifetime of a read token, seconds."""
    sse_retry_ms: Annotated[int, msgspec.Meta(ge=0)] = 2000
    """``retry:`` hint sent at the start of every SSE response, milliseconds."""
    heartbeat_s: PositiveFloat = 15.0
    """Idle time after which an SSE response gets a ``: ping`` comment, seconds."""
    durable_long_poll_s: PositiveFloat = 20.0
    """Longest a Durable Streams long-poll read (``/durable?live=long-poll``) waits for a new event
    before it is answered ``204``, seconds."""
    durable_sse_max_s: PositiveFloat = 60.0
    """A Durable Streams SSE read (``/durable?live=sse``) is ended after this many seconds, at an
    event boundary; its client reconnects from the last ``streamNextOffset`` (the protocol's
    section 10.2 asks for about 60 s, so CDNs can collapse readers)."""
    client_queue: Positive = 1024
    """Events a reader may have queued before its connection is closed (overflow)."""
    write_timeout_s: PositiveFloat = 60.0
    """Longest an SSE response may wait for its client to take the next 64 KiB, seconds, also
    during history replay; past it the connection is closed (a client that stopped reading)."""
    max_body_bytes: Positive = 1024 * 1024
    """Largest accepted request body, bytes; one more byte is a 413."""
    max_connections: Positive = 10_000
    """Open SSE responses per process; one more ``/events`` request is answered 200 with only a
    ``retry:`` hint and a ``busy: too-many-connections`` comment (``/ui``: 503 with ``Retry-After``)."""
    max_connections_per_token: Positive = 32
    """Open SSE responses (``/events`` and ``/ui`` together) per read token, counted by a digest of
    the token; one more ``/events`` request is answered 200 with only a ``retry:`` hint and a
    ``busy: too-many-requests`` comment, one more ``/ui`` request 429 ``too-many-requests``
    with ``Retry-After``. Each token reads one stream: a browser needs a few; one token shared
    by many viewers needs this raised (or one token minted per viewer)."""
    max_connections_per_key: Positive = 10_000
    """Open SSE responses per API key (counted by a digest of the key), answered as past
    ``max_connections_per_token``. An API key is a backend's credential: by default one may hold
    as many as the process (``FANOUT_MAX_CONNECTIONS``)."""
    max_connections_per_address: Positive = 32
    """Open SSE responses per client address for requests without a credential (today every SSE
    route refuses those with a 401 first, so none is ever counted); see ``trusted_proxies``."""
    max_status_reads_per_token: Positive = 2
    """Status requests (``GET /v1/streams/{id}``) in flight per read token, counted from the
    request's arrival until its body is written; one more is answered 429 ``too-many-requests``
    with ``Retry-After``."""
    max_status_reads_per_key: Positive = 64
    """Status requests in flight per API key, answered as past ``max_status_reads_per_token``."""
    max_status_reads_per_address: Positive = 8
    """Requests without a credential that read Redis for their answer (``GET /readyz``) in flight
    per client address, answered as past ``max_status_reads_per_token``."""
    status_read_rate_per_token: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    """Status requests (``GET /v1/streams/{id}``) per second per read token, sustained: a token
    bucket of ``status_read_burst_per_token`` requests refilled at this rate; one more is answered
    429 ``too-many-requests`` with a ``Retry-After`` of the seconds until the bucket holds one
    again (rounded up). Bounds the bytes of results one token makes the publisher write (at most
    about this rate times the result's size), which ``max_status_reads_per_token`` does not: two
    requests in flight, asked again at once, pulled 750 MB/s of a 2 MB result. 0 disables."""
    status_read_burst_per_token: Positive = 10
    """Status requests a read token may make at once before ``status_read_rate_per_token`` paces
    it (the size of its bucket)."""
    status_read_rate_per_key: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    """Status requests per second per API key, as ``status_read_rate_per_token``. 0 (the default)
    disables it: an API key is a backend's credential, which may poll many streams."""
    status_read_burst_per_key: Positive = 100
    """Status requests an API key may make at once before ``status_read_rate_per_key`` paces it."""
    status_read_buckets: Positive = 100_000
    """Status-read buckets kept per kind of credential (read tokens, API keys), about 150 bytes
    each. A bucket that has refilled is dropped when seen; past this many the least recently used
    is dropped (its credential may then make one more burst)."""
    share_retry_after_s: Positive = 30
    """Reconnection delay hinted to a request refused for its credential's (or address's) limit,
    seconds: ``Retry-After`` of the 429, and the ``retry:`` of the ``/events`` busy answer
    (jittered ±50 %). Long, because every client past the limit comes back after it (an
    EventSource reconnects after its ``retry:``): 10,000 connections of one token past its
    limit cost about 330 refusals a second at 30 s, 5,000 at 2 s."""
    trusted_proxies: list[str] = msgspec.field(default_factory=list)
    """Addresses or networks (CIDR, comma-separated) of the reverse proxies in front of the
    publisher. A request whose peer is one of them is counted under the rightmost
    ``X-Forwarded-For`` address that is not; without this setting ``X-Forwarded-For`` is
    ignored and the peer address counts (so requests through an untrusted proxy share its)."""
    status_cache_bytes: Annotated[int, msgspec.Meta(ge=0)] = 64 * 1024 * 1024
    """Assembled status results kept for reuse (an estimate of their memory), bytes; the least
    recently read go first. A result is assembled once per stream, projection and epoch and
    then only advanced by the events stored since (a finished stream's: never again while
    kept); concurrent requests share one assembly. 0 keeps none (each request reads the
    events its stream stored; concurrent requests still share)."""
    frame_cache_bytes: Annotated[int, msgspec.Meta(ge=0)] = 64 * 1024 * 1024
    """Rendered SSE frames of stored events kept for reuse (an estimate of their memory, with
    the stored values they were rendered from), bytes; the least recently read go first. A
    history read still asks Redis for the entries, but an event kept is not parsed and
    rendered again (nor a compacted run expanded again): a stream's events are rendered once
    in this process while kept, however many readers replay it, whenever. A new generation
    of a stream (history reset, or written again after its tombstone) or its compaction
    replaces what was kept of it. 0 keeps none (each read renders its pages; concurrent
    readers of the same page still share it)."""
    status_assemblies: Positive = 4
    """Status assemblies reading stored events at once in this process (each holds at most one
    pooled Redis connection at a time); more wait for a turn."""
    finished_max_age_s: Annotated[int, msgspec.Meta(ge=0)] = 86_400
    """Longest ``Cache-Control: max-age`` of a response about a finished stream, seconds (its
    events, snapshot, ``/ui`` and status are immutable then); the stream's remaining TTL when
    shorter. 0: finished streams are answered ``no-store`` as running ones are (no ``ETag``)."""
    ui_join_max_chars: Positive = 1024 * 1024
    """``/ui`` joins the deltas it replays into one per block (a resumed ``useChat`` gets each
    block's text in one delta); past this many characters held, what is held is sent as it
    stands, so a replay holds at most about this much text beyond its page."""
    reader_budget_bytes: Positive = 8 * 1024 * 1024
    """Publisher memory one SSE reader may hold while its client takes no bytes (the history page
    being written, the page read ahead, queued live events, the socket's unsent buffer; an
    estimate), bytes. A reader whose write has waited ``reader_stall_ms`` while holding more is
    dropped (its connection aborted); its client resumes with ``Last-Event-ID`` and loses nothing."""
    readers_budget_bytes: Positive = 64 * 1024 * 1024
    """Publisher memory all SSE readers waiting on their clients may hold together (pages shared
    by several readers count once), bytes. Past it, the readers that have waited longest are
    dropped until the rest fit, as past ``reader_budget_bytes``."""
    reader_stall_ms: Annotated[float, msgspec.Meta(ge=0, le=3_600_000)] = 1000.0
    """A reader whose write has waited this long for its client counts as stalled and is held to
    ``reader_budget_bytes``, milliseconds."""
    busy_retry_after_s: Positive = 2
    """Reconnection delay hinted to a client turned away for a transient reason, seconds:
    ``Retry-After`` of a 503, and the ``retry:`` (this many seconds, jittered ±50 %) of an SSE
    request answered 200 then closed."""
    max_sockets: Positive = 12_000
    """Open client sockets per process, of every route; one more is closed at once, before
    any byte is read (a browser's EventSource treats that as a network error and retries)."""
    header_timeout_s: PositiveFloat = 10.0
    """A connection must complete its request line and headers within this many seconds
    of opening (or of its previous response); past it the socket is closed. Idle
    keep-alive connections close after it too."""
    body_timeout_s: PositiveFloat = 30.0
    """Longest time to receive a whole request body, seconds; past it a 408 problem."""
    shutdown_window_s: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    """On SIGTERM, open SSE responses are closed spread over this window, seconds."""
    shutdown_grace_s: Annotated[float, msgspec.Meta(ge=0)] = 5.0
    """After the window, requests still running (a response blocked writing to a client that
    stopped reading, a submission in flight) get this long to finish; then they are cancelled
    and their connections closed, seconds."""
    cors_origins: list[str] = msgspec.field(default_factory=list)
    """Origins allowed by CORS (comma-separated); ``*`` allows any."""
    redis_url: str = DEFAULT_REDIS_URL
    """Redis server URL (``REDIS_URL``)."""
    redis_max_connections: Positive = 128
    """Size of the Redis connection pool, per node on a cluster (one connection is the hub's pub/sub)."""
    redis_pool_timeout_s: PositiveFloat = 5.0
    """Single node: how long a command waits for a free pooled connection before failing (503; SSE:
    200 with a ``retry:`` hint), seconds. A cluster's full node pool fails at once."""
    redis_timeout_s: Annotated[float, msgspec.Meta(ge=0.1)] = 2.0
    """Longest wait for Redis to answer one command, or to accept a connection, seconds. A
    command that times out is retried on a new connection (three times, with backoff of up
    to 1 s); then the request fails as when Redis is unreachable (503, or for SSE a
    ``retry:`` hint and the end of the response), instead of waiting for a Redis that
    stopped answering. One command can so take about four times this plus 2 s, and a
    request that needs several commands (an SSE request reads meta, then history) several
    times that. At least 0.1: below it a long history page times out on a healthy Redis. A live
    response whose Redis answered neither of two live audits in a row (frozen, partitioned; an
    audit runs every half ``FANOUT_HEARTBEAT_S`` on streams that heard nothing that long, and fails
    when not answered within that half interval or this timeout, whichever is longer) ends too,
    so its client reconnects with ``Last-Event-ID``."""
    redis_prefix: str = "fanout"
    """Key prefix of the deployment (schema.keys)."""
    redis_cluster: bool = False
    """``FANOUT_REDIS_CLUSTER=1``: ``REDIS_URL`` names a seed node of a Redis Cluster."""
    upstreams_file: str = ""
    """``FANOUT_UPSTREAMS_FILE``: the workers' upstreams file (TOML); submissions are checked
    against it (a job's ``endpoint`` or ``model`` route must serve its ``provider``, else 400). A
    mistake in it stops the publisher at start (exit 2). Secrets are not read here."""
    live_pubsub: Literal["auto", "classic", "sharded"] = "auto"
    """``FANOUT_LIVE_PUBSUB``: pub/sub of the live channels; ``auto`` is sharded on a Redis 7
    cluster, classic elsewhere (:func:`infra.live_pubsub.live_mode`); workers must agree."""
    job_shards: Annotated[int, msgspec.Meta(ge=1, le=MAX_JOB_SHARDS)] = 1
    """``FANOUT_JOB_SHARDS``: submissions spread over jobs streams ``P:jobs:{0..n-1}`` by stream id
    (16 suits a cluster)."""
    read_page: Positive = 2048
    """Most entries per ``XRANGE`` page when replaying or tailing a stream (the next page is read
    while one is written: ``read_ahead_hold_ms``)."""
    read_first_page: Positive = 256
    """Entries of a response's first history page (small, so the first byte leaves soon);
    every later page is ``read_page`` entries."""
    read_ahead_hold_ms: Annotated[float, msgspec.Meta(ge=0, le=3_600_000)] = 1000.0
    """While a history page is written the next one is read ahead; when that write has not
    completed after this many milliseconds (a client that stopped reading), the page read
    ahead is let go and read again once the write completes, so a stalled reader holds one
    page, not two. A client that keeps up is unaffected. 0: no read-ahead (each page is
    read after the write before it: one Redis round trip between pages); at most one hour."""
    live_batch_ms: Annotated[float, msgspec.Meta(ge=0, le=100)] = 3.0
    """After each read of the live-channel connection, leave it unread this long, so the
    notifications arriving meanwhile are handled in one read (fewer wake-ups per delivery
    under load: at 3,000 notifications/s, 3 ms costs about 35 µs of CPU per delivery where
    1 ms costs 43), milliseconds; the rest lasts this long, or as long as the fan-out took,
    or, while no live stream's notifications carry their events and that read waits for a
    ``FANOUT_LIVE_READ_MS`` token, until that token, at most 25 ms. Only a notification that
    arrives within that time of the previous read waits; 0 reads at once."""
    live_read_ms: Annotated[float, msgspec.Meta(ge=0, le=1000)] = 10.0
    """One live read per this many milliseconds on average (in bursts of up to 3). A live
    read serves every stream whose notification carried no events (or showed a gap) since
    the last one, in one ``XREAD`` on a single node, so such deliveries cost a bounded
    number of Redis commands per second however many streams are live; only when reads
    are wanted more often than that does one wait, at most this long; 0: no pacing."""
    subscribe_timeout_s: PositiveFloat = 5.0
    """How long a reader waits for Redis to confirm its live subscription, seconds."""
    cancel_ttl_s: Positive = 24 * 3600
    """Lifetime of a stream's cancel flag, seconds."""
    uvloop: bool = True
    """Run on uvloop when it is installed (extra ``fast``: ``pip install 'fanout[fast]'``);
    ``FANOUT_UVLOOP=0`` keeps asyncio's loop."""
    demo_page: bool = False
    """Serve the demo page at ``GET /demo`` and its routes, which submit jobs without an API key:
    a local demo stack only, never beside real provider credentials."""


def settings_from_env(environ: Mapping[str, str], **overrides: object) -> PublisherSettings:
    """Read :class:`PublisherSettings` from ``environ`` plus CLI overrides, secrets resolved.

    Raises:
        SettingsError: A malformed variable, or a missing secret outside dev mode.
    """
    settings = load_settings(PublisherSettings, environ, **overrides)
    if not settings.api_keys:
        log.warning("FANOUT_API_KEYS is empty: every job submission will be refused (401)")
    proxy_networks(settings.trusted_proxies)
    return resolve_secrets(settings)


def proxy_networks(entries: list[str]) -> tuple[ProxyNetwork, ...]:
    """Parse ``FANOUT_TRUSTED_PROXIES``: each entry an address (``10.0.0.7``) or a network (``10.0.0.0/8``).

    Returns the networks in the order given (an address is a network of one).

    Raises:
        SettingsError: An entry that is neither, naming it.
    """
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise SettingsError(f"bad configuration: FANOUT_TRUSTED_PROXIES entry {entry!r}: expected an IP "
                                "address or a network such as 10.0.0.0/8") from None
    return tuple(networks)


def resolve_secrets(settings: PublisherSettings) -> PublisherSettings:
    """Return ``settings`` with a usable token secret, or refuse it.

    A token signed by one publisher must verify on every other, so a random
    per-process secret only works for a single development process: it is generated
    (with a loud warning) only when ``dev`` is set.

    Raises:
        SettingsError: No ``FANOUT_TOKEN_SECRET`` outside dev mode, or one shorter than
            :data:`MIN_SECRET_CHARS`. The process must not start.
    """
    if settings.token_secret:
        if len(settings.token_secret) < MIN_SECRET_CHARS:
            raise SettingsError(f"FANOUT_TOKEN_SECRET must have at least {MIN_SECRET_CHARS} characters "
                                f"(make one with: openssl rand -hex {MIN_SECRET_CHARS})")
        return settings
    if not settings.dev:
        raise SettingsError(f"FANOUT_TOKEN_SECRET is required: the same random text of at least {MIN_SECRET_CHARS} "
                            f"characters on every publisher (openssl rand -hex {MIN_SECRET_CHARS}), or "
                            "FANOUT_DEV=1 for a throwaway one")
    log.warning("FANOUT_DEV=1 and no FANOUT_TOKEN_SECRET: generated a random per-process secret; "
                "read tokens from this process will NOT verify on any other publisher")
    return msgspec.structs.replace(settings, token_secret=secrets.token_urlsafe(48))
