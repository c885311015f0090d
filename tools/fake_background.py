"""Background mode of the fake provider: OpenAI Responses answers generated once, kept, re-readable.

A ``POST /v1/responses`` whose body holds ``"background": true`` (:func:`asks_background`)
creates a kept response from the recorded transcript its model names
(``transcripts/openai_responses/<case>.sse``): its events get ``sequence_number`` 0, 1, 2, ...
in order and the response id ``<transcript id>_bg<n>``; event ``i`` is "generated"
``i * delay`` after the creation whether or not anyone reads it (the provider keeps
generating when the client leaves). Routes, as UPSTREAMS.md E.1 describes the real API:

==========================================  ================================================
request                                     answer
==========================================  ================================================
``POST /v1/responses`` (background)          the events as they are generated
``GET /v1/responses/{id}?stream=true``       every event generated so far at once, from
                                             ``sequence_number`` 0, then the rest as generated
``... &starting_after=N``                    the same, from the event after N
``POST /v1/responses/{id}/cancel``           ``{"id", "status": "cancelled"}``; the events not
                                             yet generated are replaced by one
                                             ``response.cancelled``; idempotent
unknown id                                   404 (``invalid_request_error``)
==========================================  ================================================

Model prefixes, before the case (after ``slow-``, which paces by ``slow_delay_ms``):
``expire-`` answers every ``GET`` with the 400 the API sends for a response past its
stream window; ``drift-`` replays ``response.output_text.delta`` events with other text
(a provider whose replay disagrees with its first stream). Never for production.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgspec
from aiohttp import web

EXPIRED_MESSAGE: Final = "This response can no longer be streamed because it is more than 5 minutes old."
"""The 400's message for an ``expire-`` response (openai/openai-python#2828)."""
DRIFT_TEXT: Final = "(replayed differently) "
"""What a ``drift-`` replay puts before every text delta."""

_json: Final = msgspec.json.Decoder()
_encoder: Final = msgspec.json.Encoder()


def asks_background(raw: bytes) -> bool:
    """Whether a request body asks for background mode (``"background": true``)."""
    try:
        body = _json.decode(raw)
    except msgspec.DecodeError:
        return False
    return isinstance(body, dict) and body.get("background") is True


class Kept(msgspec.Struct, kw_only=True):
    """One kept response."""

    id: str
    events: list[dict[str, Any]]
    """Its events' payloads, ``sequence_number`` in order from 0."""
    created: float
    """Monotonic creation time."""
    delay_s: float
    """Time between two generated events."""
    expire: bool = False
    drift: bool = False
    cancelled: bool = False

    def generated(self, now: float) -> int:
        """How many events exist at ``now``."""
        return min(len(self.events), 1 + int((now - self.created) / self.delay_s) if self.delay_s else len(self.events))

    def cancel(self, now: float) -> None:
        """Stop generating: the events not yet generated become one ``response.cancelled``."""
        if self.cancelled:
            return
        self.cancelled = True
        cut = self.generated(now)
        if cut < len(self.events):
            response: dict[str, Any] = {"id": self.id, "object": "response", "status": "cancelled", "output": [],
                                        "usage": None}
            self.events = [*self.events[:cut], {"type": "response.cancelled", "sequence_number": cut,
                                                "response": response}]


class BackgroundStore:
    """The kept responses of one fake server, and the ids whose cancel was asked (tests read it)."""

    def __init__(self) -> None:
        self.kept: dict[str, Kept] = {}
        self.cancelled: list[str] = []
        self.replays: list[tuple[str, int | None]] = []
        """``(id, starting_after)`` of every ``GET ?stream=true``."""
        self.cursors: list[tuple[str, str | None]] = []
        """``(id, last_event_id)`` of every Gemini Interactions ``GET`` (:mod:`tools.fake_interactions`)."""
        self._ids = itertools.count(1)

    def create(self, transcript: bytes, *, delay_s: float, expire: bool, drift: bool) -> Kept:
        """Keep a response made of the transcript's JSON events, renumbered, under a new id."""
        payloads = [p for p in (_payload(block) for block in re.split(rb"\r?\n\r?\n", transcript)) if p is not None]
        original = next((p["response"].get("id") for p in payloads if isinstance(p.get("response"), dict)), None)
        kept_id = f"{original or 'resp_fake'}_bg{next(self._ids)}"
        for number, payload in enumerate(payloads):
            payload["sequence_number"] = number
            if isinstance(payload.get("response"), dict):
                payload["response"]["id"] = kept_id
        kept = Kept(id=kept_id, events=payloads, created=time.monotonic(), delay_s=delay_s, expire=expire,
                    drift=drift)
        self.kept[kept_id] = kept
        return kept


STORE: Final = web.AppKey("background_store", BackgroundStore)


def _payload(block: bytes) -> dict[str, Any] | None:
    data = b"\n".join(line[5:].lstrip(b" ") for line in block.splitlines() if line.startswith(b"data:"))
    if not data.strip():
        return None
    try:
        value = _json.decode(data)
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, dict) else None


def _frame(payload: dict[str, Any], *, drift: bool) -> bytes:
    if drift and payload.get("type") == "response.output_text.delta":
        payload = {**payload, "delta": DRIFT_TEXT + str(payload.get("delta", ""))}
    return b"event: " + str(payload.get("type", "message")).encode() + b"\ndata: " + _encoder.encode(payload) + b"\n\n"


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
    return web.json_response(body, status=status)


def parse_model(model: str) -> tuple[str, bool, bool, bool]:
    """Split a background model name into ``(case, slow, expire, drift)``."""
    slow = model.startswith("slow-")
    model = model[5:] if slow else model
    expire = model.startswith("expire-")
    model = model[7:] if expire else model
    drift = model.startswith("drift-")
    return (model[6:] if drift else model), slow, expire, drift


async def create(request: web.Request, model: str, find: Callable[[str], Path | None],
                 delays_ms: tuple[int, int]) -> web.StreamResponse:
    """Answer a background ``POST /v1/responses``: keep the response, stream it as it is generated.

    Args:
        request: The request.
        model: Its body's model (a case, with the prefixes of the module docstring).
        find: Returns the transcript of a case, or ``None``.
        delays_ms: ``(delay_ms, slow_delay_ms)`` of the server.
    """
    case, slow, expire, drift = parse_model(model)
    path = find(case)
    if path is None:
        return _error(404, f"The model '{model}' does not exist in fanout upstream (background mode)")
    delay_s = (delays_ms[1] if slow else delays_ms[0]) / 1000
    kept = request.app[STORE].create(path.read_bytes(), delay_s=delay_s, expire=expire, drift=drift)
    return await _stream(request, kept, 0, drift=False)


async def retrieve(request: web.Request) -> web.StreamResponse:
    """Answer ``GET /v1/responses/{id}?stream=true[&starting_after=N]`` (the module's table)."""
    store = request.app[STORE]
    kept = store.kept.get(request.match_info["id"])
    if kept is None:
        return _error(404, f"Response with id '{request.match_info['id']}' not found.")
    after_text = request.query.get("starting_after")
    after = int(after_text) if after_text and after_text.lstrip("-").isdigit() else None
    store.replays.append((kept.id, after))
    if kept.expire:
        return _error(400, EXPIRED_MESSAGE)
    if request.query.get("stream") != "true":
        return web.json_response({"id": kept.id, "object": "response", "status": "in_progress"})
    return await _stream(request, kept, 0 if after is None else after + 1, drift=kept.drift)


async def cancel(request: web.Request) -> web.Response:
    """Answer ``POST /v1/responses/{id}/cancel``: stop generating; idempotent."""
    store = request.app[STORE]
    kept = store.kept.get(request.match_info["id"])
    if kept is None:
        return _error(404, f"Response with id '{request.match_info['id']}' not found.")
    kept.cancel(time.monotonic())
    store.cancelled.append(kept.id)
    return web.json_response({"id": kept.id, "object": "response", "status": "cancelled"})


async def _stream(request: web.Request, kept: Kept, start: int, *, drift: bool) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    index = start
    try:
        while index < len(kept.events):
            wait = kept.created + index * kept.delay_s - time.monotonic()
            if wait > 0 and not kept.cancelled:
                await asyncio.sleep(wait)
            if request.transport is None or request.transport.is_closing():
                return response
            await response.write(_frame(kept.events[index], drift=drift))
            index += 1
        await response.write_eof()
    except (ConnectionError, RuntimeError):
        pass
    return response


def install(app: web.Application, store: BackgroundStore) -> None:
    """Add ``store`` and the ``GET``/cancel routes to the fake provider's application."""
    app[STORE] = store
    app.router.add_get("/v1/responses/{id}", retrieve)
    app.router.add_post("/v1/responses/{id}/cancel", cancel)
