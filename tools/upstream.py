"""``fanout upstream``: a local stand-in for the four providers that streams recorded transcripts.

It answers the providers' real paths (``POST /v1/chat/completions``, ``POST /v1/responses``,
``POST /v1/messages``, ``POST /v1beta/models/{model}:streamGenerateContent`` with or without
``alt=sse``, ``POST /v1beta/interactions``) by streaming ``<root>/<dir>/<model>.sse`` in ``chunk_bytes`` pieces,
``delay_ms`` apart. ``<dir>`` is the provider's transcript directory
(:data:`tools.replay.TRANSCRIPT_DIRS`; Gemini: ``gemini_sse`` with ``alt=sse``, else
``gemini_json_array``); roots are ``--transcripts`` then ``transcripts/`` and
``tests/cases/transcripts/``. Special models, for tests and demos:

=====================  ===========================================================================
model                  answer
=====================  ===========================================================================
``<case>``             the transcript, chunked
``slow-<case>``        the transcript one provider event at a time (an SSE event, a JSON array
                       element: :func:`tools.pacing.provider_events`), ``slow_delay_ms`` apart
                       (``--slow-pacing chunk``, and :class:`ServerConfig`'s default: one chunk at a time)
``fail<N>-<case>``     the first N requests for this model: 503 (``Retry-After: 0``), then the case
``status-<code>``      that HTTP status with the provider's error body (``Retry-After: 1`` on 429/503)
``context-too-long``   400 with the provider's "prompt too long" error body
``hang``               200 and headers, then nothing until the client leaves
``pings``              200, then only keep-alives (SSE comments, Anthropic ``ping``) forever
``gzip-<case>``        the transcript gzip-compressed, sent with ``Content-Encoding: gzip``
                       (whatever the request's ``Accept-Encoding``)
``gzip-status-<code>`` that HTTP status with the provider's error body gzip-compressed
``garbage``            200 (the framing's content type), then :data:`GARBAGE_BYTES` random bytes
                       (seeded: the same bytes on every request)
unknown                404 with the provider's error body, pointing at ``transcripts/<dir>/INDEX.md``
=====================  ===========================================================================

A ``/v1/responses`` body with ``"background": true`` gets OpenAI's background mode
(:mod:`tools.fake_background`: kept responses, ``GET /v1/responses/{id}?stream=true``, cancel).

Every request is recorded (method, path, query, headers with secret values shown as
``***``, whether a credential was sent, JSON body, monotonic arrival time) and listed by ``GET /_requests``;
``DELETE /_requests`` clears the list. Never for production: it checks no credential.

This module is the command (options, serving until a signal); the server is
:mod:`tools.upstream_server`, what it answers and records :mod:`tools.upstream_bodies`.
Both are re-exported here under their old names.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from aiohttp import web

from schema import logs
from schema.cli import CommandError, at_least, existing_directory, port_number
from tools.upstream_bodies import (
    DEFAULT_ROOTS,
    GARBAGE_BYTES,
    case_names,
    error_body,
    fingerprint,
    garbage_body,
    not_found_message,
)
from tools.upstream_server import STATE, ServerConfig, ServerState, make_app

__all__ = ["DEFAULT_ROOTS", "GARBAGE_BYTES", "STATE", "ServerConfig", "ServerState", "add_arguments", "case_names",
           "error_body", "fingerprint", "garbage_body", "make_app", "not_found_message", "run", "transcript_roots"]


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Declare the ``upstream`` options."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=port_number, default=8081,
                        help="TCP port, 0-65535 (0: any free port, printed at start)")
    parser.add_argument("--transcripts", type=existing_directory, action="append", default=[],
                        help="extra transcript root (<root>/<provider dir>/<case>.sse), searched first "
                             "(default: FANOUT_TRANSCRIPTS_DIR when set)")
    parser.add_argument("--chunk-bytes", type=at_least(int, 1), default=64, help="bytes per written chunk (>= 1)")
    parser.add_argument("--delay-ms", type=at_least(int, 0), default=10, help="pause between chunks (ms, >= 0)")
    parser.add_argument("--slow-delay-ms", type=at_least(int, 0), default=1000,
                        help="pause between provider events of slow-<case> (ms, >= 0)")
    parser.add_argument("--slow-pacing", choices=("event", "chunk"), default="event",
                        help="what slow-<case> sends between pauses: one provider event, or one --chunk-bytes chunk")


def transcript_roots(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[Path, ...]:
    """Return the transcript roots in search order: ``FANOUT_TRANSCRIPTS_DIR``, each ``--transcripts``, the bundled.

    Raises:
        CommandError: ``FANOUT_TRANSCRIPTS_DIR`` names no directory (exit 2). A bad
            ``--transcripts`` was already refused by argparse (:func:`schema.cli.existing_directory`).
    """
    env_root = environ.get("FANOUT_TRANSCRIPTS_DIR")
    if env_root and not Path(env_root).is_dir():
        raise CommandError(f"FANOUT_TRANSCRIPTS_DIR {env_root!r} is not a directory: "
                           "point it at an existing transcript root, or unset it")
    return (*([Path(env_root)] if env_root else []), *args.transcripts, *DEFAULT_ROOTS)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT; print ``listening on http://host:port`` once bound.

    aiohttp's own records (a handler that failed) go to stderr in the shared format
    (:mod:`schema.logs`); there is no access log, as a Gemini request carries its key in the query.
    """
    logs.configure_from_env(os.environ)
    config = ServerConfig(roots=transcript_roots(args, os.environ), chunk_bytes=args.chunk_bytes,
                          delay_ms=args.delay_ms, slow_delay_ms=args.slow_delay_ms, slow_pacing=args.slow_pacing)
    asyncio.run(_serve(make_app(config), args.host, args.port))
    return 0


async def _serve(app: web.Application, host: str, port: int) -> None:
    runner = web.AppRunner(app, shutdown_timeout=2.0, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_host, bound_port = runner.addresses[0][:2]
    sys.stdout.write(f"fanout upstream listening on http://{bound_host}:{bound_port}\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
