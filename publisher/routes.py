"""The route table: every route the publisher serves, in one place (mirrored by ``openapi.json``).

The static demo page plugs in at :func:`add_optional_routes`, behind ``FANOUT_DEMO_PAGE=1``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from aiohttp import web

from publisher.events import stream_events
from publisher.settings import PublisherSettings
from publisher.status import cancel, healthz, readyz, stream_status
from publisher.submit import mint_token, submit
from publisher.ui_stream import stream_ui

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ROUTES: Final[tuple[tuple[str, str, Handler], ...]] = (
    ("POST", "/v1/streams", submit),
    ("GET", "/v1/streams/{stream_id}", stream_status),
    ("GET", "/v1/streams/{stream_id}/events", stream_events),
    ("GET", "/v1/streams/{stream_id}/ui", stream_ui),
    ("POST", "/v1/streams/{stream_id}/cancel", cancel),
    ("POST", "/v1/streams/{stream_id}/tokens", mint_token),
    ("GET", "/healthz", healthz),
    ("GET", "/readyz", readyz),
)
"""(method, path template, handler) of every API route."""


def setup_routes(app: web.Application, settings: PublisherSettings) -> None:
    """Register :data:`ROUTES` (no implicit HEAD) and the optional routes."""
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
    add_optional_routes(app, settings)


DEMO_PAGE: Final = Path(__file__).with_name("static") / "demo.html"
"""The demo page: native EventSource, blocks by index, a control that drops the connection."""


async def demo_page(request: web.Request) -> web.StreamResponse:
    """Serve the demo page (``GET /demo?stream_id=...&token=...``); it reads the stream itself."""
    headers = {"Cache-Control": "no-cache", "Content-Type": "text/html; charset=utf-8"}
    return web.FileResponse(DEMO_PAGE, headers=headers)


def add_optional_routes(app: web.Application, settings: PublisherSettings) -> None:
    """Register routes behind feature flags: ``GET /demo`` when ``FANOUT_DEMO_PAGE=1``."""
    if settings.demo_page:
        app.router.add_route("GET", "/demo", demo_page)
