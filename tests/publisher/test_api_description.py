"""GET /openapi.json serves the repository's description, every 404 points at it, and / leads somewhere useful."""

from __future__ import annotations

import json
from pathlib import Path

from tests.publisher.helpers import make_settings
from tools.demo.routes import install

ROOT_DOC = Path(__file__).resolve().parents[2] / "openapi.json"


async def test_openapi_json_is_the_repository_document(server, http):
    async with http.get(server.url("/openapi.json")) as resp:
        assert resp.status == 200
        assert resp.content_type == "application/json"
        body = await resp.read()
    assert body == ROOT_DOC.read_bytes()
    assert json.loads(body)["openapi"].startswith("3.1")


async def test_a_404_problem_names_a_path_the_publisher_serves(server, http):
    async with http.get(server.url("/v1/v1/streams/x/events")) as resp:
        assert resp.status == 404
        detail = (await resp.json())["detail"]
    assert "/openapi.json" in detail
    async with http.get(server.url("/openapi.json")) as resp:
        assert resp.status == 200


async def test_root_redirects_to_the_description(server, http):
    async with http.get(server.url("/"), allow_redirects=False) as resp:
        assert resp.status == 302
        assert resp.headers["Location"] == "/openapi.json"
    async with http.get(server.url("/")) as resp:
        assert resp.status == 200
        assert (await resp.json())["info"]["title"] == "fanout publisher"


async def test_root_redirects_to_the_demo_page_in_demo_mode(start_app, http):
    server = await start_app(make_settings(demo_page=True), plugins={"demo": install})
    async with http.get(server.url("/"), allow_redirects=False) as resp:
        assert resp.status == 302
        assert resp.headers["Location"] == "/demo"
    async with http.get(server.url("/")) as resp:
        assert resp.status == 200
        assert resp.content_type == "text/html"
