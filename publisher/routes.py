"""The route table: every route the publisher serves, in one place (mirrored by ``openapi.json``).

The demo page and its routes plug in at :func:`add_optional_routes`, behind ``FANOUT_DEMO_PAGE=1``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from publisher.demo_routes import add_demo_routes
from publisher.events import stream_events
from publisher.readiness import healthz, readyz
from publisher.settings import PublisherSettings
from publisher.status import cancel, stream_status
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


def add_optional_routes(app: web.Application, settings: PublisherSettings) -> None:
    """Register routes behind feature flags: :mod:`publisher.demo_routes` when ``FANOUT_DEMO_PAGE=1``."""
    if settings.demo_page:
        add_demo_routes(app)
