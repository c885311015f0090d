"""Background mode of the fake provider for the Gemini Interactions API: kept interactions, re-readable.

A ``POST /v1beta/interactions`` whose body holds ``"background": true`` creates a kept
interaction from the transcript its model names (``transcripts/gemini_interactions/<case>.sse``),
in the same store as :mod:`tools.fake_background` (same pacing: event ``i`` exists ``i * delay``
after creation, whether or not anyone reads). Every ``interaction`` object and
``interaction_id`` becomes the kept id, and every event gets the ``event_id`` ``<id>.<n>``.
Routes, as UPSTREAMS.md E.3 describes the real API:

==================================================  ========================================
request                                             answer
==================================================  ========================================
``POST /v1beta/interactions`` (background)           the events as they are generated
``GET /v1beta/interactions/{id}?stream=true``        every event so far from the first, then
                                                     the rest as generated
``... &last_event_id=<event_id>``                    the same, from the event after it
                                                     (an unknown ``event_id``: 400)
``POST /v1beta/interactions/{id}/cancel``            the interaction, ``status: cancelled``;
                                                     the events not yet generated become one
                                                     ``interaction.status_update`` ``cancelled``
unknown id                                           404 (``NOT_FOUND``)
==================================================  ========================================

The ``expire-`` model prefix answers every ``GET`` with 404, as for an interaction past its
retention (**unconfirmed** status). Never for production.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from tools.fake_background import STORE, Kept, _stream, parse_model


def _error(status: int, message: str, rpc: str) -> web.Response:
    return web.json_response({"error": {"code": status, "message": message, "status": rpc}}, status=status)


def _rename(kept: Kept) -> None:
    """Give the kept events the kept id and ``event_id`` ``<id>.<n>`` (no ``sequence_number``)."""
    for number, payload in enumerate(kept.events):
        payload.pop("sequence_number", None)
        payload.pop("response", None)
        if isinstance(payload.get("interaction"), dict):
            payload["interaction"]["id"] = kept.id
        if "interaction_id" in payload:
            payload["interaction_id"] = kept.id
        payload["event_id"] = f"{kept.id}.{number}"


async def create(request: web.Request, model: str, find: Callable[[str], Path | None],
                 delays_ms: tuple[int, int]) -> web.StreamResponse:
    """Answer a background ``POST /v1beta/interactions``: keep the interaction, stream it as generated.

    Args:
        request: The request.
        model: Its body's model (a case, after ``slow-`` and ``expire-`` prefixes).
        find: Returns the transcript of a case, or ``None``.
        delays_ms: ``(delay_ms, slow_delay_ms)`` of the server.
    """
    case, slow, expire, _drift = parse_model(model)
    path = find(case)
    if path is None:
        return _error(404, f"models/{model} is not found in fanout upstream (background mode)", "NOT_FOUND")
    delay_s = (delays_ms[1] if slow else delays_ms[0]) / 1000
    kept = request.app[STORE].create(path.read_bytes(), delay_s=delay_s, expire=expire, drift=False)
    _rename(kept)
    return await _stream(request, kept, 0, drift=False)


def _kept(request: web.Request) -> Kept | None:
    return request.app[STORE].kept.get(request.match_info["id"])


async def retrieve(request: web.Request) -> web.StreamResponse:
    """Answer ``GET /v1beta/interactions/{id}?stream=true[&last_event_id=...]`` (the module's table)."""
    kept = _kept(request)
    if kept is None:
        return _error(404, f"Interaction {request.match_info['id']} not found.", "NOT_FOUND")
    cursor = request.query.get("last_event_id")
    request.app[STORE].cursors.append((kept.id, cursor))
    if kept.expire:
        return _error(404, f"Interaction {kept.id} not found.", "NOT_FOUND")
    if request.query.get("stream") != "true":
        return web.json_response({"id": kept.id, "status": "in_progress"})
    ids = [payload.get("event_id") for payload in kept.events]
    if cursor is not None and cursor not in ids:
        return _error(400, f"Unknown last_event_id {cursor}.", "INVALID_ARGUMENT")
    return await _stream(request, kept, 0 if cursor is None else ids.index(cursor) + 1, drift=False)


async def cancel(request: web.Request) -> web.Response:
    """Answer ``POST /v1beta/interactions/{id}/cancel``: stop generating; idempotent."""
    store = request.app[STORE]
    kept = _kept(request)
    if kept is None:
        return _error(404, f"Interaction {request.match_info['id']} not found.", "NOT_FOUND")
    if not kept.cancelled:
        kept.cancelled = True
        cut = kept.generated(time.monotonic())
        if cut < len(kept.events):
            update: dict[str, Any] = {"event_type": "interaction.status_update", "interaction_id": kept.id,
                                      "status": "cancelled", "event_id": f"{kept.id}.{cut}"}
            kept.events = [*kept.events[:cut], update]
    store.cancelled.append(kept.id)
    return web.json_response({"id": kept.id, "status": "cancelled"})


def install(app: web.Application) -> None:
    """Add the ``GET``/cancel routes (the store is :mod:`tools.fake_background`'s, installed first)."""
    app.router.add_get("/v1beta/interactions/{id}", retrieve)
    app.router.add_post("/v1beta/interactions/{id}/cancel", cancel)
