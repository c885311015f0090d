"""``fanout upstream``: a local stand-in for the four providers that streams recorded transcripts.

It answers the providers' real paths (``POST /v1/chat/completions``, ``POST /v1/responses``,
``POST /v1/messages``, ``POST /v1beta/models/{model}:streamGenerateContent`` with or without
``alt=sse``) by streaming ``<root>/<dir>/<model>.sse`` in ``chunk_bytes`` pieces,
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

Every request is recorded (method, path, query, headers with secret values shown as
``***``, whether a credential was sent, JSON body, monotonic arrival time) and listed by ``GET /_requests``;
``DELETE /_requests`` clears the list. Never for production: it checks no credential.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import os
import random
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Final, Literal

import msgspec
from aiohttp import web

from schema import logs
from schema.cli import CommandError, at_least, existing_directory, port_number
from tools.pacing import provider_events
from worker.upstream_errors import STATUS_CATEGORY

ROOT: Final = Path(__file__).resolve().parents[1]
DEFAULT_ROOTS: Final = (ROOT / "transcripts", ROOT / "tests" / "cases" / "transcripts")
"""Transcript roots searched after ``--transcripts``."""

SECRET_HEADERS: Final = re.compile(r"(?i)authorization|api-key|apikey|token|secret|cookie|^key$")
_GEMINI_STATUS: Final = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                         404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE",
                         504: "DEADLINE_EXCEEDED"}
_ANTHROPIC_TYPE: Final = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                          404: "not_found_error", 429: "rate_limit_error", 529: "overloaded_error",
                          503: "overloaded_error"}
_CONTEXT_MESSAGES: Final = {
    "openai": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.",
    "anthropic": "prompt is too long: 210000 tokens > 200000 maximum",
    "gemini": "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
}


GARBAGE_BYTES: Final = 4096
"""Length of the ``garbage`` model's body."""
GARBAGE_SEED: Final = 20260
"""Seed of the ``garbage`` body; its first byte is neither SSE nor a JSON array start."""


def garbage_body() -> bytes:
    """Return the ``garbage`` model's body: :data:`GARBAGE_BYTES` seeded random bytes."""
    return random.Random(GARBAGE_SEED).randbytes(GARBAGE_BYTES)  # noqa: S311 - test data, not a secret


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """How the fake upstream streams."""

    roots: tuple[Path, ...] = DEFAULT_ROOTS
    """Transcript roots, searched in order."""
    chunk_bytes: int = 64
    """Bytes per written chunk."""
    delay_ms: int = 10
    """Pause between chunks."""
    slow_delay_ms: int = 1000
    """Pause between provider events (or chunks, see :attr:`slow_pacing`) for ``slow-<case>`` models."""
    slow_pacing: Literal["event", "chunk"] = "chunk"
    """What ``slow-<case>`` sends between pauses: one ``chunk_bytes`` chunk (the default here, which
    tests tune their timings with), or one provider event (``fanout upstream``'s default)."""
    ping_interval_ms: int = 50
    """Pause between keep-alives for the ``pings`` model."""


class ServerState:
    """The recorded requests, the ``fail<N>-`` counters and the stop signal of one app."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.requests: list[dict[str, Any]] = []
        self.seen: Counter[str] = Counter()
        self.outcomes: list[str] = []
        """How each streamed answer ended: ``complete``, ``client_left`` or ``stopped``."""
        self.stopping = asyncio.Event()


STATE: Final = web.AppKey("state", ServerState)


def _vendor(provider_dir: str) -> str:
    for vendor in ("openai", "gemini"):
        if provider_dir.startswith(vendor):
            return vendor
    return provider_dir


def error_body(provider_dir: str, status: int, message: str, *, code: str | None = None) -> bytes:
    """Return the provider's error body shape for ``status`` (OpenAI, Anthropic or Gemini)."""
    vendor = _vendor(provider_dir)
    if vendor == "anthropic":
        error: dict[str, Any] = {"type": "error", "error": {"type": _ANTHROPIC_TYPE.get(status, "api_error"),
                                                           "message": message}}
    elif vendor == "gemini":
        error = {"error": {"code": status, "message": message, "status": _GEMINI_STATUS.get(status, "UNKNOWN")}}
        if provider_dir == "gemini_json_array":
            return msgspec.json.encode([error])
    else:
        kind = "server_error" if status >= 500 else "requests" if status == 429 else "invalid_request_error"
        code = code or ("rate_limit_exceeded" if status == 429 else None)
        error = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return msgspec.json.encode(error)


def _record(request: web.Request, raw: bytes) -> dict[str, Any]:
    headers = {name: ("***" if SECRET_HEADERS.search(name) else value) for name, value in request.headers.items()}
    query = {name: ("***" if SECRET_HEADERS.search(name) else value) for name, value in request.query.items()}
    auth = any(n.lower() in ("authorization", "x-api-key", "x-goog-api-key") for n in request.headers) or "key" in query
    try:
        body: Any = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        body = None
    fingerprints = {name.lower(): fingerprint(value) for name, value in request.headers.items()
                    if SECRET_HEADERS.search(name)}
    return {"method": request.method, "path": request.path, "query": query, "headers": headers,
            "auth_present": auth, "auth_fingerprints": fingerprints, "body": body, "received_s": time.monotonic()}


def fingerprint(secret: str) -> str:
    """Return the first 12 hex digits of SHA-256 of a header value.

    Lets tests check which credential was sent without the recording ever holding it.
    """
    return hashlib.sha256(secret.encode()).hexdigest()[:12]


def _find(roots: tuple[Path, ...], provider_dir: str, case: str) -> Path | None:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", case) or ".." in case:
        return None
    return next((root / provider_dir / f"{case}.sse" for root in roots
                 if (root / provider_dir / f"{case}.sse").is_file()), None)


def case_names(roots: tuple[Path, ...], provider_dir: str) -> list[str]:
    """Return the cases this server answers for ``provider_dir``, sorted; empty when none.

    A case is ``<root>/<provider_dir>/<case>.sse`` in any root, named as :func:`_find` accepts
    (``slow-``/``fail<N>-`` forms of each are answered too, and are not listed).
    """
    stems = {path.stem for root in roots for path in (root / provider_dir).glob("*.sse")}
    return sorted(stem for stem in stems if _find(roots, provider_dir, stem) is not None)


def _error(provider_dir: str, status: int, message: str, *, code: str | None = None) -> web.Response:
    headers = {"Retry-After": "1"} if status in (429, 503) else {}
    return web.Response(status=status, body=error_body(provider_dir, status, message, code=code),
                        content_type="application/json", headers=headers)


async def _answer(request: web.Request, provider_dir: str, model: str) -> web.StreamResponse:
    state = request.app[STATE]
    state.seen[model] += 1
    if model.startswith("status-") and model[7:].isdigit():
        status = int(model[7:])
        return _error(provider_dir, status, f"simulated HTTP {status} ({STATUS_CATEGORY.get(status, ('?',))[0]})")
    if model == "context-too-long":
        return _error(provider_dir, 400, _CONTEXT_MESSAGES[_vendor(provider_dir)], code="context_length_exceeded")
    if model in ("hang", "pings"):
        return await _keep_open(request, provider_dir, pings=model == "pings")
    if model == "garbage":
        return await _stream(request, provider_dir, garbage_body(), state.config.delay_ms)
    if model.startswith("gzip-"):
        return await _gzipped(request, provider_dir, model[5:])
    delay_ms, case = state.config.delay_ms, model
    failing = re.fullmatch(r"fail(\d+)-(.+)", model)
    if failing:
        if state.seen[model] <= int(failing.group(1)):
            response = _error(provider_dir, 503, "simulated overload before the stream")
            response.headers["Retry-After"] = "0"
            return response
        case = failing.group(2)
    slow = case.startswith("slow-")
    if slow:
        delay_ms, case = state.config.slow_delay_ms, case[5:]
    path = _find(state.config.roots, provider_dir, case)
    if path is None:
        return _error(provider_dir, 404, not_found_message(provider_dir, model), code="model_not_found")
    per_event = slow and state.config.slow_pacing == "event"
    return await _stream(request, provider_dir, path.read_bytes(), delay_ms, per_event=per_event)


async def _gzipped(request: web.Request, provider_dir: str, case: str) -> web.StreamResponse:
    """Answer ``gzip-<case>``/``gzip-status-<code>``: the body compressed, ``Content-Encoding: gzip``."""
    state = request.app[STATE]
    if case.startswith("status-") and case[7:].isdigit():
        status = int(case[7:])
        body = gzip.compress(error_body(provider_dir, status, f"simulated HTTP {status}, compressed"))
        return web.Response(status=status, body=body, content_type="application/json",
                            headers={"Content-Encoding": "gzip"})
    path = _find(state.config.roots, provider_dir, case)
    if path is None:
        return _error(provider_dir, 404, f"no transcript named {case!r} to compress")
    return await _stream(request, provider_dir, gzip.compress(path.read_bytes()), state.config.delay_ms,
                         headers={"Content-Encoding": "gzip"})


def not_found_message(provider_dir: str, model: str) -> str:
    """Return the ``404`` message for a model that names no case: where the case list is."""
    return (f"The model '{model}' does not exist in fanout upstream: here a model names a recorded case, "
            f"transcripts/{provider_dir}/<case>.sse (the list: transcripts/{provider_dir}/INDEX.md); "
            "slow-<case> streams it slowly")


def _content_type(provider_dir: str) -> str:
    return "application/json" if provider_dir == "gemini_json_array" else "text/event-stream"


async def _stream(request: web.Request, provider_dir: str, body: bytes, delay_ms: int,
                  headers: dict[str, str] | None = None, *, per_event: bool = False) -> web.StreamResponse:
    state = request.app[STATE]
    response = web.StreamResponse(headers={"Content-Type": _content_type(provider_dir), "Cache-Control": "no-cache",
                                           **(headers or {})})
    await response.prepare(request)
    size = max(1, state.config.chunk_bytes)
    pieces = (provider_events(body, json_array=provider_dir == "gemini_json_array") if per_event
              else [body[start:start + size] for start in range(0, len(body), size)])
    outcome = "complete"
    try:
        for number, piece in enumerate(pieces):
            if number and not await _pause(state, delay_ms):
                outcome = "stopped"
                break
            if _client_left(request):
                outcome = "client_left"
                break
            await response.write(piece)
        else:
            await response.write_eof()
    except (ConnectionError, RuntimeError):
        outcome = "client_left"
    state.outcomes.append(outcome)
    return response


def _client_left(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _keep_open(request: web.Request, provider_dir: str, *, pings: bool) -> web.StreamResponse:
    state = request.app[STATE]
    response = web.StreamResponse(headers={"Content-Type": _content_type(provider_dir)})
    await response.prepare(request)
    ping = b'event: ping\ndata: {"type":"ping"}\n\n' if provider_dir == "anthropic" else b": keep-alive\n\n"
    outcome = "stopped"
    try:
        while await _pause(state, state.config.ping_interval_ms):
            if _client_left(request):
                outcome = "client_left"
                break
            if pings:
                await response.write(ping)
    except (ConnectionError, RuntimeError):
        outcome = "client_left"
    state.outcomes.append(outcome)
    return response


async def _pause(state: ServerState, delay_ms: int) -> bool:
    """Sleep ``delay_ms``; False when the server is stopping."""
    try:
        await asyncio.wait_for(state.stopping.wait(), timeout=delay_ms / 1000)
    except TimeoutError:
        return True
    return False


async def _handle(request: web.Request, provider_dir: str, model: str) -> web.StreamResponse:
    raw = await request.read()
    request.app[STATE].requests.append(_record(request, raw))
    return await _answer(request, provider_dir, model)


def _by_body_model(provider_dir: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await _handle(request, provider_dir, await _model_of(request))

    return handler


async def _gemini(request: web.Request) -> web.StreamResponse:
    provider_dir = "gemini_sse" if request.query.get("alt") == "sse" else "gemini_json_array"
    return await _handle(request, provider_dir, request.match_info["model"])


async def _model_of(request: web.Request) -> str:
    try:
        body = msgspec.json.decode(await request.read())
    except msgspec.DecodeError:
        return ""
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else ""


async def _list_requests(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].requests)


async def _clear_requests(request: web.Request) -> web.Response:
    request.app[STATE].requests.clear()
    request.app[STATE].seen.clear()
    return web.Response(status=204)


async def _on_shutdown(app: web.Application) -> None:
    app[STATE].stopping.set()


def make_app(config: ServerConfig | None = None) -> web.Application:
    """Return the fake-provider application (routes in the module docstring)."""
    app = web.Application()
    app[STATE] = ServerState(config or ServerConfig())
    app.on_shutdown.append(_on_shutdown)
    app.router.add_post("/v1/chat/completions", _by_body_model("openai_chat"))
    app.router.add_post("/v1/responses", _by_body_model("openai_responses"))
    app.router.add_post("/v1/messages", _by_body_model("anthropic"))
    app.router.add_post("/v1beta/models/{model:[^/:]+}:streamGenerateContent", _gemini)
    app.router.add_get("/_requests", _list_requests)
    app.router.add_delete("/_requests", _clear_requests)
    return app


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
