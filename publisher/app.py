"""The publisher's application factory: settings in, a ready ``web.Application`` out.

:func:`create_app` is what the CLI, the functional tests, later end-to-end tests and the
demo all start. The Redis client (:func:`infra.redis_client.connect`: on a single node a
blocking pool of ``FANOUT_REDIS_MAX_CONNECTIONS``, so a burst of readers waits for a
connection instead of failing; with ``FANOUT_REDIS_CLUSTER=1`` a cluster client, that
many connections per node), the hub (classic pub/sub on a plain connection to one node,
or, on a Redis 7 cluster, sharded pub/sub at each slot's owner:
:func:`infra.live_pubsub.live_mode`) and
the jobs streams' groups (created at start, the shard count recorded in
``P:jobshards``) live in ``cleanup_ctx``; state is reached
through the typed keys of :mod:`publisher.state`. Run the app with
:data:`RUNNER_KWARGS` (masked access log, handler cancellation on client disconnect).
On shutdown, open SSE responses are closed spread over ``FANOUT_SHUTDOWN_WINDOW_S`` so
their clients reconnect to other publishers gradually.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from aiohttp import web
from opentelemetry import metrics, trace

from infra.live_pubsub import LiveMode, live_mode
from infra.redis_client import RedisClient, RedisOptions, connect, node_client
from publisher.api.accesslog import MaskedAccessLogger
from publisher.api.edge import install_log_filter
from publisher.api.fair_share import FairShares
from publisher.api.limits import ConnectionGate
from publisher.api.middleware import add_cors_headers, edge_middleware
from publisher.api.routes import Plugins, setup_routes
from publisher.api.status_cache import StatusCache
from publisher.api.submit import JobShards, announce_shards
from publisher.history.frame_cache import FrameCache
from publisher.history.store import Store
from publisher.live.hub import Hub
from publisher.live.reader import Reader
from publisher.live.reader_budget import ReaderBudget
from publisher.settings import PublisherSettings, resolve_secrets
from publisher.state import (
    BUDGET,
    FAIR_SHARES,
    GATE,
    HUB,
    KEYS,
    REDIS,
    SETTINGS,
    SHARDS,
    STATUS_CACHE,
    STORE,
    TELEMETRY,
    UPSTREAMS,
)
from publisher.telemetry import Telemetry
from schema.keys import Keys
from schema.settings import SettingsError
from schema.upstreams import Upstreams, default_upstreams

RUNNER_KWARGS: Final[dict[str, Any]] = {"access_log_class": MaskedAccessLogger, "handler_cancellation": True}
"""Keyword arguments for ``web.AppRunner`` / ``TestServer`` / ``web.run_app`` of this app."""

RedisWrapper = Callable[[RedisClient], Any]
"""Takes the command client, returns an object with the same methods (tests hook reads)."""


def create_app(
    settings: PublisherSettings,
    *,
    keys: Keys | None = None,
    redis_url: str | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    wrap_redis: RedisWrapper | None = None,
    plugins: Plugins | None = None,
    upstreams: Upstreams | None = None,
) -> web.Application:
    """Build the publisher app.

    Args:
        settings: The settings; a missing token secret is resolved or refused here.
        keys: Key layout (default: ``settings.redis_prefix``); tests pass a unique one.
        redis_url: Overrides ``settings.redis_url``.
        tracer_provider: Source of spans (default: the global provider).
        meter_provider: Source of metrics (default: the global provider).
        wrap_redis: Wraps the command client used for stream reads and writes.
        plugins: Optional routes by name (:data:`publisher.api.routes.Plugins`): ``demo``
            is installed with ``FANOUT_DEMO_PAGE=1``.
        upstreams: Endpoints and routes submissions are checked against
            (:func:`schema.upstreams.load_upstreams`); default: today's endpoints, no file.

    Raises:
        SettingsError: No usable ``FANOUT_TOKEN_SECRET`` outside dev mode, a
            ``FANOUT_TRUSTED_PROXIES`` entry that is no address or network, or
            ``FANOUT_DEMO_PAGE=1`` without the ``demo`` plug-in.
    """
    settings = resolve_secrets(settings)
    app = web.Application(
        middlewares=[edge_middleware],
        client_max_size=settings.max_body_bytes,
        handler_args={"keepalive_timeout": settings.header_timeout_s},
    )
    install_log_filter()
    app[SETTINGS] = settings
    app[KEYS] = keys or Keys(settings.redis_prefix)
    app[UPSTREAMS] = upstreams or default_upstreams({})
    app[SHARDS] = JobShards(app[KEYS], settings.job_shards)
    app[TELEMETRY] = Telemetry(tracer_provider, meter_provider)
    app[GATE] = ConnectionGate(settings.max_connections, settings.busy_retry_after_s)
    app[FAIR_SHARES] = FairShares(settings, app[TELEMETRY].shares_refused)
    app[BUDGET] = ReaderBudget(settings.reader_budget_bytes, settings.readers_budget_bytes,
                               settings.reader_stall_ms / 1000, app[TELEMETRY])
    app.cleanup_ctx.append(_redis_context(redis_url or settings.redis_url, wrap_redis))
    app.on_response_prepare.append(add_cors_headers)
    app.on_shutdown.append(close_streams)
    setup_routes(app, settings, plugins or {})
    return app


def _redis_context(
    url: str, wrap_redis: RedisWrapper | None
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def redis_context(app: web.Application) -> AsyncIterator[None]:
        keys, settings = app[KEYS], app[SETTINGS]
        client = _connect(url, settings, keys.prefix)
        commands = wrap_redis(client) if wrap_redis is not None else client
        app[REDIS] = commands
        app[STORE] = store = Store(commands, keys, settings.read_page, first_page=settings.read_first_page,
                                     cluster=settings.redis_cluster, frames=FrameCache(settings.frame_cache_bytes))
        app[TELEMETRY].frames = store.frames
        app[STATUS_CACHE] = StatusCache(store, app[TELEMETRY], settings.status_cache_bytes, settings.status_assemblies)
        await announce_shards(client, app[SHARDS])
        try:
            mode = await live_mode(client, settings.live_pubsub)  # as the workers decide it
        except SettingsError:
            await client.aclose()
            raise
        hub, live = await _hub(client, store, keys, settings, mode)
        app[HUB] = hub
        await hub.start()
        yield
        await hub.close()
        if live is not None:
            await live.aclose()
        await client.aclose()

    return redis_context


def _connect(url: str, settings: PublisherSettings, prefix: str) -> RedisClient:
    """Open the publisher's command client (``FANOUT_REDIS_*`` settings; named in ``CLIENT LIST``)."""
    return connect(url, RedisOptions(
        cluster=settings.redis_cluster, max_connections=settings.redis_max_connections,
        pool_timeout_s=settings.redis_pool_timeout_s,
        socket_timeout_s=settings.redis_timeout_s, connect_timeout_s=settings.redis_timeout_s,
        client_name=f"fanout-publisher:{prefix}",  # shows in CLIENT LIST
    ))


async def _hub(client: RedisClient, store: Store, keys: Keys, settings: PublisherSettings,
               mode: LiveMode) -> tuple[Hub, Any]:
    """Build the hub; return it and the node client it subscribes through (classic mode; ``None``: sharded)."""
    # classic: one node's connection hears the whole cluster; sharded: each channel at its slot's owner
    live = await node_client(client) if mode == "classic" else None
    hub = Hub(live or client, store, keys.live, settings.subscribe_timeout_s,
              heartbeat_s=settings.heartbeat_s, live_batch_s=settings.live_batch_ms / 1000,
              live_read_s=settings.live_read_ms / 1000, redis_timeout_s=settings.redis_timeout_s,
              reconnect=lambda: node_client(client), mode=mode)
    return hub, live


SHUTDOWN_POLL_S: Final = 0.1
"""While the shutdown window spaces the closes, how often it checks whether any reader is left, seconds."""


async def _wait_step(hub: Hub, rest: list[Reader], step_s: float) -> bool:
    """Wait ``step_s``; return False at once when no reader of ``rest`` is still open (their clients left)."""
    deadline = time.monotonic() + step_s
    while any(reader.closed is None and hub.joined(reader) for reader in rest):
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        await asyncio.sleep(min(left, SHUTDOWN_POLL_S))
    return False


async def close_streams(app: web.Application) -> None:
    """Close every open SSE response, spread evenly over ``FANOUT_SHUTDOWN_WINDOW_S``.

    New SSE requests are refused (503) from the start. Each closed response ends
    normally, so EventSource reconnects (to another publisher) after its ``retry:``. A
    reader whose client left meanwhile is not closed, and once every client still to
    close has left the window is not waited out.
    """
    app[GATE].closing = True
    hub = app[HUB]
    readers = hub.readers()
    step_s = app[SETTINGS].shutdown_window_s / len(readers) if readers else 0.0
    for index, reader in enumerate(readers):
        if index and not await _wait_step(hub, readers[index:], step_s):
            break  # every client still to close has left
        if reader.closed is None and hub.joined(reader):
            reader.close("shutdown")
    for reader in app[HUB].readers():
        reader.close("shutdown")
