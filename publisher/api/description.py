"""The API description and the root: ``GET /openapi.json`` and ``GET /``.

``openapi.json`` (OpenAPI 3.1, the repository's root file, shipped in this package as
``publisher/api/openapi.json``) is what every ``404`` problem points at, so the
publisher serves it itself. ``GET /`` sends a person who opens the publisher's address
in a browser somewhere useful: the demo page in demo mode (``FANOUT_DEMO_PAGE=1``), else
the description. Must not import :mod:`tools` or :mod:`worker`.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Final

from aiohttp import web

from publisher.state import SETTINGS

DESCRIPTION_PATH: Final = "/openapi.json"
"""Where the publisher serves its API description."""
_HEADERS: Final = {"Content-Type": "application/json", "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


@functools.cache
def description_bytes() -> bytes:
    """Return ``openapi.json`` as shipped with the package (read once).

    Raises:
        FileNotFoundError: The package was built without it (a packaging bug:
            ``tests/test_packaging.py`` checks the wheel holds it).
    """
    return resources.files("publisher.api").joinpath("openapi.json").read_bytes()


async def api_description(request: web.Request) -> web.Response:
    """Answer ``GET /openapi.json``: the OpenAPI 3.1 description, 200 ``application/json``."""
    return web.Response(body=description_bytes(), headers=_HEADERS)


async def root(request: web.Request) -> web.StreamResponse:
    """Answer ``GET /`` with a ``302``: to ``/demo`` in demo mode, else to :data:`DESCRIPTION_PATH`."""
    target = "/demo" if request.app[SETTINGS].demo_page else DESCRIPTION_PATH
    return web.Response(status=302, headers={"Location": target, "Cache-Control": "no-cache"})
