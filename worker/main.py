"""``fanout worker``: run one worker process until SIGTERM/SIGINT, then drain and exit.

Configuration comes from the environment (:class:`worker.settings.WorkerSettings`, provider
keys from ``OPENAI_API_KEY``/``ANTHROPIC_API_KEY``/``GEMINI_API_KEY``); flags override it.
Logs are ``event=... key=value`` records on stderr, in the format every fanout process
shares (:mod:`schema.logs`: ``FANOUT_LOG_LEVEL`` or ``--log-level``, ``FANOUT_LOG_FORMAT``);
they never hold keys or prompt text. A Redis that does not answer at start ends the process
with one line and exit 4 (no traceback); with no provider credential at all the worker
still starts, and says so as a WARNING.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

import redis.exceptions

from infra.redis_client import REDIS_ERRORS, RedisOptions, connect
from infra.redis_faults import refuses_the_url
from schema import logs
from schema.cli import EXIT_USAGE, check_redis_url, redis_refused, redis_unreachable
from schema.keys import Keys
from schema.settings import SettingsError
from schema.upstreams import Upstreams
from schema.upstreams_file import load_upstreams
from worker.job_groups import watch_job_groups
from worker.runner import Worker
from worker.secrets import Secrets, check_secrets
from worker.settings import WorkerSettings, load_worker_settings
from worker.telemetry import Telemetry
from worker.upstream import Credentials, credentials_from_env, new_session

log = logging.getLogger("fanout.worker")


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Declare the ``worker`` options (each overrides its ``FANOUT_*`` variable)."""
    defaults = WorkerSettings()
    parser.add_argument("--concurrency", type=int, default=None,
                        help=f"streams run at once (env FANOUT_CONCURRENCY; default {defaults.concurrency})")
    parser.add_argument("--redis-url", default=None, help=f"Redis URL (env REDIS_URL; default {defaults.redis_url})")
    parser.add_argument("--prefix", dest="redis_prefix", default=None,
                        help=f"key prefix (env FANOUT_REDIS_PREFIX; default {defaults.redis_prefix})")
    logs.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run the worker; return 0 after a clean drain, 2 on bad configuration, 1 when Redis cannot serve it.

    A mistake in the upstreams file (``FANOUT_UPSTREAMS_FILE``) or an endpoint whose secret
    cannot be read is bad configuration (exit 2, one line naming the file, table and key).

    Raises:
        CommandError: ``REDIS_URL`` is not a Redis URL, ``FANOUT_LOG_LEVEL`` or
            ``FANOUT_LOG_FORMAT`` is malformed (exit 2), or Redis does not answer when the
            worker starts (exit 4).
    """
    try:
        settings = load_worker_settings(os.environ, concurrency=args.concurrency, redis_url=args.redis_url,
                                        redis_prefix=args.redis_prefix)
        upstreams = load_upstreams(os.environ)
        check_secrets(upstreams, Secrets(os.environ))
    except SettingsError as exc:
        sys.stderr.write(f"fanout worker: {exc}\n")
        return EXIT_USAGE
    source = "--redis-url" if args.redis_url else "REDIS_URL (or --redis-url)"
    check_redis_url(settings.redis_url, source=source)
    logs.configure_from_env(os.environ, log_level=args.log_level)
    telemetry = Telemetry.from_env(os.environ)
    try:
        return _serve_to_exit(settings, telemetry, source, upstreams)
    finally:
        telemetry.shutdown()


def _serve_to_exit(settings: WorkerSettings, telemetry: Telemetry, source: str, upstreams: Upstreams) -> int:
    """Serve until stopped; map what Redis or a setting refuses to the exit status (0 after a clean drain).

    Raises:
        CommandError: Redis does not answer (exit 4).
    """
    try:
        asyncio.run(serve(settings, telemetry, upstreams))
    except SettingsError as exc:  # a setting Redis cannot honour (FANOUT_LIVE_PUBSUB=sharded on Redis 6.2)
        sys.stderr.write(f"fanout worker: {exc}\n")
        return EXIT_USAGE
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        if refuses_the_url(exc):  # an AuthenticationError is a ConnectionError: Redis did answer
            raise redis_refused(settings.redis_url, exc, source=source) from exc
        raise redis_unreachable(settings.redis_url, exc, source=source) from exc
    except (*REDIS_ERRORS, ValueError) as exc:
        if refuses_the_url(exc):  # "DB index is out of range" is a ResponseError
            raise redis_refused(settings.redis_url, exc, source=source) from exc
        sys.stderr.write(f"fanout worker: cannot use Redis at REDIS_URL (cluster mode {settings.redis_cluster}): "
                         f"{type(exc).__name__}: {exc}; check REDIS_URL and FANOUT_REDIS_CLUSTER\n")
        return 1
    return 0


async def serve(settings: WorkerSettings, telemetry: Telemetry, upstreams: Upstreams | None = None) -> None:
    """Run one worker until SIGTERM or SIGINT, then drain (see :mod:`worker.runner`).

    ``upstreams``: the endpoints and routes (default: those of today's variables).
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, stop, sig)
    credentials = credentials_from_env(os.environ)
    # quoted: the repr has spaces and '=' in it, which would otherwise read as more pairs
    # (json lines got fields "anthropic": "unset," and "gemini": "unset)")
    log.info("event=worker_config concurrency=%d job_shards=%d redis_cluster=%s credentials=%s",
             settings.concurrency, settings.job_shards, settings.redis_cluster, logs.quoted(repr(credentials)))
    if upstreams is not None and upstreams.source:
        log.info("event=upstreams file=%s endpoints=%s routes=%s", logs.quoted(upstreams.source),
                 ",".join(upstreams.endpoints), logs.quoted(",".join(upstreams.models)))
    else:
        _warn_without_credentials(credentials)
    client = connect(settings.redis_url, RedisOptions(cluster=settings.redis_cluster,
                                                      client_name=f"fanout-worker:{settings.redis_prefix}"))
    session = new_session(settings)
    try:
        keys = Keys(settings.redis_prefix)
        worker = Worker.create(client, keys, settings, session=session, credentials=credentials, telemetry=telemetry,
                               upstreams=upstreams)
        shard_streams = [(str(n), keys.jobs_shard(n)) for n in range(settings.job_shards)]
        gauges = asyncio.create_task(watch_job_groups(client, shard_streams, telemetry,
                                                      interval_s=settings.metrics_poll_s, stop=stop))
        await worker.run(stop)
        await gauges
    finally:
        await session.close()
        await client.aclose()


def _warn_without_credentials(credentials: Credentials) -> None:
    """Log a WARNING when no provider key is set: real providers will refuse every job (401)."""
    if not any(credentials.key(vendor) for vendor in ("openai", "anthropic", "gemini")):
        log.warning("event=no_credentials detail=\"no provider key is set (OPENAI_API_KEY, ANTHROPIC_API_KEY, "
                    "GEMINI_API_KEY): real providers will refuse every job; fine against fanout upstream\"")


def _on_signal(stop: asyncio.Event, sig: signal.Signals) -> None:
    log.info("event=signal name=%s action=drain", sig.name)
    stop.set()
