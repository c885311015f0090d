"""``fanout publisher --host H --port P``: run the HTTP edge until SIGTERM or SIGINT.

Settings come from ``FANOUT_*`` variables (:mod:`publisher.settings`), telemetry from
``OTEL_*`` (:func:`publisher.telemetry.providers_from_env`). On SIGTERM the listening
socket closes first, then open SSE responses are closed spread over
``FANOUT_SHUTDOWN_WINDOW_S``, then Redis connections. Exit code 0 after a clean stop,
2 for bad configuration (a bad variable, ``REDIS_URL`` not a Redis URL, the port in use).
Logs go to stderr in the format every fanout process shares (:mod:`schema.logs`:
``FANOUT_LOG_LEVEL`` or ``--log-level``, ``FANOUT_LOG_FORMAT``).

A Redis that does not answer at start does not stop the publisher: it logs a WARNING
naming the URL, answers ``503`` on ``/readyz`` and on the routes that need Redis, and
serves normally as soon as Redis answers (readiness probes keep traffic away meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys

from aiohttp import web
from redis.exceptions import RedisError

from infra.redis_client import REDIS_ERRORS
from infra.redis_faults import refuses_the_url
from publisher.api.edge import EdgeRunner
from publisher.api.edge import run as run_loop
from publisher.api.readiness import READY_TIMEOUT_S
from publisher.api.routes import Plugins
from publisher.app import RUNNER_KWARGS, create_app
from publisher.settings import PublisherSettings, settings_from_env
from publisher.state import REDIS
from publisher.telemetry import providers_from_env
from schema import logs
from schema.cli import EXIT_USAGE, check_redis_url, port_number, redact_url
from schema.settings import SettingsError
from schema.upstreams import Upstreams
from schema.upstreams_file import load_upstreams

log = logging.getLogger("publisher")


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Add the ``publisher`` subcommand's flags."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=8080,
                        help="TCP port, 0-65535; 0 picks a free one (default 8080)")
    parser.add_argument("--dev", action="store_true",
                        help="development mode, as FANOUT_DEV=1: a throwaway token secret when none is set")
    defaults = PublisherSettings()
    parser.add_argument("--redis-url", default=None, help=f"Redis URL (env REDIS_URL; default {defaults.redis_url})")
    parser.add_argument("--prefix", dest="redis_prefix", default=None,
                        help=f"key prefix (env FANOUT_REDIS_PREFIX; default {defaults.redis_prefix})")
    logs.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run the publisher; return the process exit code.

    Raises:
        CommandError: ``REDIS_URL`` is not a Redis URL, or ``FANOUT_LOG_LEVEL`` or
            ``FANOUT_LOG_FORMAT`` is malformed (exit 2).
    """
    logs.configure_from_env(os.environ, log_level=args.log_level)  # first: reading the settings may warn
    try:
        settings = settings_from_env(os.environ, dev=True if args.dev else None, redis_url=args.redis_url,
                                     redis_prefix=args.redis_prefix)
        upstreams = load_upstreams(os.environ)
    except SettingsError as exc:
        print(f"fanout publisher: {exc}", file=sys.stderr)
        return EXIT_USAGE
    check_redis_url(settings.redis_url, source="--redis-url" if args.redis_url else "REDIS_URL")
    try:
        return run_loop(serve(settings, args.host, args.port, getattr(args, "plugins", None) or {}, upstreams),
                        use_uvloop=settings.uvloop)
    except SettingsError as exc:  # a setting Redis cannot honour (FANOUT_LIVE_PUBSUB=sharded on a single node)
        print(f"fanout publisher: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (*REDIS_ERRORS, ValueError) as exc:
        print(f"fanout publisher: cannot use Redis at REDIS_URL (cluster mode {settings.redis_cluster}): "
              f"{type(exc).__name__}: {exc}; check REDIS_URL and FANOUT_REDIS_CLUSTER", file=sys.stderr)
        return 1


def freeze_startup_objects() -> None:
    """Move every object alive after start-up out of the cyclic garbage collector's scans (``gc.freeze``).

    The imported modules, the app and its clients (about 60,000 objects) live as long
    as the process; scanning them made each full collection cost about 14 ms on a
    2-core VM, a pause every live reader of the process shares. Objects created later
    (connections, events) are collected as usual. Follows the Python ``gc`` module
    documentation of ``gc.freeze``.
    """
    gc.collect()
    gc.freeze()


async def serve(settings: PublisherSettings, host: str, port: int, plugins: Plugins,
                upstreams: Upstreams | None = None) -> int:
    """Serve until SIGTERM/SIGINT, then shut down gracefully; return 0.

    ``plugins``: optional routes (:data:`publisher.api.routes.Plugins`), from ``fanout_cli``;
    ``upstreams``: what submissions are checked against (default: today's endpoints).
    """
    providers = providers_from_env(os.environ)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    app = create_app(settings, tracer_provider=providers.tracer_provider, meter_provider=providers.meter_provider,
                     plugins=plugins, upstreams=upstreams)
    runner = EdgeRunner(app, handle_signals=False, shutdown_timeout=settings.shutdown_grace_s, **RUNNER_KWARGS)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError:  # port in use, unknown host: fanout_cli words it
        await runner.cleanup()
        raise
    for address in runner.addresses:
        log.info("listening on http://%s:%s", *address[:2])
    await warn_unless_redis_answers(app, settings.redis_url)
    freeze_startup_objects()
    await stop.wait()
    log.info("stopping: no new connections; closing event streams over %ss, then %ss for what still runs",
             settings.shutdown_window_s, settings.shutdown_grace_s)
    await runner.cleanup()
    providers.shutdown()
    log.info("stopped")
    return 0


async def warn_unless_redis_answers(app: web.Application, redis_url: str) -> bool:
    """PING Redis once at start; log a WARNING naming the URL and the fix when it does not answer.

    Returns:
        True when Redis answered within :data:`publisher.api.readiness.READY_TIMEOUT_S`.
    """
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            await app[REDIS].ping()
    except (RedisError, TimeoutError, OSError) as exc:
        reason = str(exc).rstrip(".") or type(exc).__name__
        if refuses_the_url(exc):  # starting Redis would not help: the URL must change
            log.warning("Redis at %s answered but refused it (%s): /readyz and the stream routes answer 503; "
                        "check the user, password and database number in REDIS_URL", redact_url(redis_url), reason)
        else:
            log.warning("Redis at %s does not answer (%s): /readyz and the stream routes answer 503 until it does; "
                        "start Redis, or point REDIS_URL at a running one", redact_url(redis_url), reason)
        return False
    return True
