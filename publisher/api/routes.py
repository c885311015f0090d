"""The route table: every route the publisher serves, in one place (mirrored by ``openapi.json``).

Optional routes come from plug-ins (:data:`Plugins`) the caller of
:func:`publisher.app.create_app` hands over: ``fanout publisher`` (``fanout_cli``) hands
the demo's (:func:`tools.demo.routes.install`), installed only with
``FANOUT_DEMO_PAGE=1``. The publisher itself never imports :mod:`tools`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from aiohttp import web

from publisher.api.agui_stream import stream_agui
from publisher.api.description import api_description, root
from publisher.api.durable import answer_options, refuse_write, stream_durable, stream_head
from publisher.api.events import stream_events
from publisher.api.readiness import healthz, readyz
from publisher.api.status import cancel, stream_status
from publisher.api.submit import mint_token, submit
from publisher.api.ui_stream import stream_ui
from publisher.settings import PublisherSettings
from schema.settings import SettingsError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Plugin = Callable[[web.Application], None]
"""Registers a plug-in's routes on the app."""
Plugins = Mapping[str, Plugin]
"""Plug-ins by name; ``demo`` is installed when ``FANOUT_DEMO_PAGE=1``."""

ROUTES: Final[tuple[tuple[str, str, Handler], ...]] = (
    ("POST", "/v1/streams", submit),
    ("GET", "/v1/streams/{stream_id}", stream_status),
    ("GET", "/v1/streams/{stream_id}/events", stream_events),
    ("GET", "/v1/streams/{stream_id}/ui", stream_ui),
    ("GET", "/v1/streams/{stream_id}/agui", stream_agui),
    ("GET", "/v1/streams/{stream_id}/durable", stream_durable),
    ("HEAD", "/v1/streams/{stream_id}/durable", stream_head),
    ("OPTIONS", "/v1/streams/{stream_id}/durable", answer_options),
    *((method, "/v1/streams/{stream_id}/durable", refuse_write) for method in ("POST", "PUT", "DELETE", "PATCH")),
    ("POST", "/v1/streams/{stream_id}/cancel", cancel),
    ("POST", "/v1/streams/{stream_id}/tokens", mint_token),
    ("GET", "/healthz", healthz),
    ("GET", "/readyz", readyz),
    ("GET", "/openapi.json", api_description),
    ("GET", "/", root),
)
"""(method, path template, handler) of every API route."""


def setup_routes(app: web.Application, settings: PublisherSettings, plugins: Plugins) -> None:
    """Register :data:`ROUTES` (no implicit HEAD) and the optional routes."""
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
    add_optional_routes(app, settings, plugins)


def add_optional_routes(app: web.Application, settings: PublisherSettings, plugins: Plugins) -> None:
    """Install the plug-ins behind feature flags: ``demo`` when ``FANOUT_DEMO_PAGE=1``.

    Raises:
        SettingsError: ``FANOUT_DEMO_PAGE=1`` but no ``demo`` plug-in was handed over
            (a publisher started other than by ``fanout publisher``).
    """
    if settings.demo_page:
        install = plugins.get("demo")
        if install is None:
            raise SettingsError("FANOUT_DEMO_PAGE=1 needs the demo plug-in, which `fanout publisher` provides")
        install(app)
