"""``fanout worker``: run one worker process until SIGTERM/SIGINT, then drain and exit.

Configuration comes from the environment (:class:`worker.settings.WorkerSettings`, provider
keys from ``OPENAI_API_KEY``/``ANTHROPIC_API_KEY``/``GEMINI_API_KEY``); flags override it.
Logs are ``key=value`` lines on stderr; they never hold keys or prompt text.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from schema.keys import Keys
from schema.settings import SettingsError
from worker.redis_client import REDIS_ERRORS, RedisOptions, connect
from worker.runner import Worker
from worker.settings import WorkerSettings, load_worker_settings
from worker.telemetry import Telemetry
from worker.upstream import credentials_from_env, new_session

log = logging.getLogger("fanout.worker")

LOG_FORMAT = "ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"
"""Format of every log line (``key=value`` pairs)."""


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Declare the ``worker`` options (each overrides its ``FANOUT_*`` variable)."""
    parser.add_argument("--concurrency", type=int, default=None, help="streams run at once (FANOUT_CONCURRENCY)")
    parser.add_argument("--redis-url", default=None, help="Redis URL (REDIS_URL)")
    parser.add_argument("--prefix", dest="redis_prefix", default=None, help="key prefix (FANOUT_REDIS_PREFIX)")
    parser.add_argument("--log-level", default=None, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="log level (FANOUT_LOG_LEVEL)")


def run(args: argparse.Namespace) -> int:
    """Run the worker; return 0 after a clean drain, 2 on bad configuration, 1 when Redis is unusable."""
    try:
        settings = load_worker_settings(os.environ, concurrency=args.concurrency, redis_url=args.redis_url,
                                        redis_prefix=args.redis_prefix, log_level=args.log_level)
    except SettingsError as exc:
        sys.stderr.write(f"fanout worker: {exc}\n")
        return 2
    logging.basicConfig(level=settings.log_level, format=LOG_FORMAT, stream=sys.stderr)
    telemetry = Telemetry.from_exporters(traces=settings.otel_traces_exporter,
                                         metrics_exporter=settings.otel_metrics_exporter)
    try:
        asyncio.run(serve(settings, telemetry))
    except (*REDIS_ERRORS, ValueError) as exc:
        sys.stderr.write(f"fanout worker: cannot use Redis at REDIS_URL (cluster mode {settings.redis_cluster}): "
                         f"{type(exc).__name__}: {exc}; check REDIS_URL and FANOUT_REDIS_CLUSTER\n")
        return 1
    finally:
        telemetry.shutdown()
    return 0


async def serve(settings: WorkerSettings, telemetry: Telemetry) -> None:
    """Run one worker until SIGTERM or SIGINT, then drain (see :mod:`worker.runner`)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, stop, sig)
    credentials = credentials_from_env(os.environ)
    log.info("event=worker_config concurrency=%d job_shards=%d redis_cluster=%s credentials=%r",
             settings.concurrency, settings.job_shards, settings.redis_cluster, credentials)
    client = connect(settings.redis_url, RedisOptions(cluster=settings.redis_cluster,
                                                      client_name=f"fanout-worker:{settings.redis_prefix}"))
    session = new_session(settings)
    try:
        worker = Worker.create(client, Keys(settings.redis_prefix), settings, session=session,
                               credentials=credentials, telemetry=telemetry)
        await worker.run(stop)
    finally:
        await session.close()
        await client.aclose()


def _on_signal(stop: asyncio.Event, sig: signal.Signals) -> None:
    log.info("event=signal name=%s action=drain", sig.name)
    stop.set()
