"""``fanout publisher --host H --port P``: run the HTTP edge until SIGTERM or SIGINT.

Settings come from ``FANOUT_*`` variables (:mod:`publisher.settings`), telemetry from
``OTEL_*`` (:func:`publisher.telemetry.providers_from_env`). On SIGTERM the listening
socket closes first, then open SSE responses are closed spread over
``FANOUT_SHUTDOWN_WINDOW_S``, then Redis connections. Exit code 0 after a clean stop,
2 for bad configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from aiohttp import web

from publisher.app import RUNNER_KWARGS, create_app
from publisher.edge import EdgeRunner
from publisher.edge import run as run_loop
from publisher.settings import PublisherSettings, settings_from_env
from publisher.telemetry import providers_from_env
from schema.settings import SettingsError

log = logging.getLogger("publisher")


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Add the ``publisher`` subcommand's flags."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port; 0 picks a free one (default 8080)")
    parser.add_argument("--dev", action="store_true", help="development mode, as FANOUT_DEV=1")


def run(args: argparse.Namespace) -> int:
    """Run the publisher; return the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = settings_from_env(os.environ, dev=True if args.dev else None)
    except SettingsError as exc:
        print(f"fanout publisher: {exc}", file=sys.stderr)
        return 2
    return run_loop(serve(settings, args.host, args.port), use_uvloop=settings.uvloop)


async def serve(settings: PublisherSettings, host: str, port: int) -> int:
    """Serve until SIGTERM/SIGINT, then shut down gracefully; return 0."""
    tracer_provider, meter_provider = providers_from_env(os.environ)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    app = create_app(settings, tracer_provider=tracer_provider, meter_provider=meter_provider)
    runner = EdgeRunner(app, handle_signals=False, **RUNNER_KWARGS)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    for address in runner.addresses:
        log.info("listening on http://%s:%s", *address[:2])
    await stop.wait()
    log.info("stopping: no new connections; closing event streams over %ss", settings.shutdown_window_s)
    await runner.cleanup()
    for provider in (tracer_provider, meter_provider):
        if provider is not None:
            provider.shutdown()
    log.info("stopped")
    return 0
