"""The fake provider's HTTP server: the providers' streaming paths answered from recorded transcripts.

:func:`make_app` builds the aiohttp application that ``fanout upstream`` (:mod:`tools.upstream`,
whose docstring tables the special models) serves: each request is recorded, then answered
by the model it names (a case streamed in chunks, slowly: per provider event or chunk, after N
failures, gzip-compressed, an error status, a hang, keep-alives only, or garbage); a
``/v1/responses`` body with ``"background": true`` gets OpenAI's background mode
(:mod:`tools.fake_background`). What the answers hold comes from
:mod:`tools.upstream_bodies`. Never for production: it checks no credential.
"""

from __future__ import annotations

import asyncio
import gzip
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, Final, Literal

import msgspec
from aiohttp import web

from tools import fake_background, fake_interactions
from tools.pacing import provider_events
from tools.upstream_bodies import (
    CONTEXT_MESSAGES,
    DEFAULT_ROOTS,
    content_type,
    error_body,
    find_case,
    garbage_body,
    not_found_message,
    record,
    vendor_of,
)
from worker.upstream_errors import STATUS_CATEGORY


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
        self.open_now = 0
        """Streamed answers (200 bodies) being written now."""
        self.open_max = 0
        """The most streamed answers ever written at once (tests of concurrency caps)."""
        self.stopping = asyncio.Event()
        self.background = fake_background.BackgroundStore()
        """Kept background responses (:mod:`tools.fake_background`)."""


STATE: Final = web.AppKey("state", ServerState)


BACKGROUND_CREATE: Final = {"openai_responses": fake_background.create, "gemini_interactions": fake_interactions.create}
"""Transcript directory → its background-mode ``create`` (a body with ``"background": true``)."""

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
        return _error(provider_dir, 400, CONTEXT_MESSAGES[vendor_of(provider_dir)], code="context_length_exceeded")
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
    per_event = case.startswith("slow-") and state.config.slow_pacing == "event"
    if case.startswith("slow-"):
        delay_ms, case = state.config.slow_delay_ms, case[5:]
    path = find_case(state.config.roots, provider_dir, case)
    if path is None:
        return _error(provider_dir, 404, not_found_message(provider_dir, model), code="model_not_found")
    return await _stream(request, provider_dir, path.read_bytes(), delay_ms, per_event=per_event)


async def _gzipped(request: web.Request, provider_dir: str, case: str) -> web.StreamResponse:
    """Answer ``gzip-<case>``/``gzip-status-<code>``: the body compressed, ``Content-Encoding: gzip``."""
    state = request.app[STATE]
    if case.startswith("status-") and case[7:].isdigit():
        status = int(case[7:])
        body = gzip.compress(error_body(provider_dir, status, f"simulated HTTP {status}, compressed"))
        return web.Response(status=status, body=body, content_type="application/json",
                            headers={"Content-Encoding": "gzip"})
    path = find_case(state.config.roots, provider_dir, case)
    if path is None:
        return _error(provider_dir, 404, f"no transcript named {case!r} to compress")
    return await _stream(request, provider_dir, gzip.compress(path.read_bytes()), state.config.delay_ms,
                         headers={"Content-Encoding": "gzip"})


async def _stream(request: web.Request, provider_dir: str, body: bytes, delay_ms: int,
                  headers: dict[str, str] | None = None, *, per_event: bool = False) -> web.StreamResponse:
    """Write ``body`` in pieces ``delay_ms`` apart: ``chunk_bytes`` chunks, or provider events when ``per_event``."""
    state = request.app[STATE]
    response = web.StreamResponse(headers={"Content-Type": content_type(provider_dir), "Cache-Control": "no-cache",
                                           **(headers or {})})
    await response.prepare(request)
    size = max(1, state.config.chunk_bytes)
    pieces = (provider_events(body, json_array=provider_dir == "gemini_json_array") if per_event
              else [body[start:start + size] for start in range(0, len(body), size)])
    outcome = "complete"
    state.open_now += 1
    state.open_max = max(state.open_max, state.open_now)
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
    finally:
        state.open_now -= 1
    state.outcomes.append(outcome)
    return response


def _client_left(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _keep_open(request: web.Request, provider_dir: str, *, pings: bool) -> web.StreamResponse:
    state = request.app[STATE]
    response = web.StreamResponse(headers={"Content-Type": content_type(provider_dir)})
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
    state = request.app[STATE]
    state.requests.append(record(request, raw))
    if provider_dir in BACKGROUND_CREATE and fake_background.asks_background(raw):
        return await BACKGROUND_CREATE[provider_dir](request, model, partial(find_case, state.config.roots,
                                                                             provider_dir),
                                                     (state.config.delay_ms, state.config.slow_delay_ms))
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
    app.router.add_post("/v1beta/interactions", _by_body_model("gemini_interactions"))
    fake_background.install(app, app[STATE].background)
    fake_interactions.install(app)
    app.router.add_get("/_requests", _list_requests)
    app.router.add_delete("/_requests", _clear_requests)
    return app
