"""openapi.json and the app agree: every route with its methods, every problem type."""

from __future__ import annotations

import json
import re
from pathlib import Path

from publisher.api.problems import PROBLEM_BASE, PROBLEM_TYPES
from publisher.app import create_app
from schema.job import PROVIDERS
from tests.publisher.helpers import make_settings
from tools.demo.routes import install

DOC_PATH = Path(__file__).resolve().parents[2] / "openapi.json"
METHODS = {"get", "put", "post", "delete", "patch", "options", "head", "trace"}


def load_doc() -> dict:
    return json.loads(DOC_PATH.read_text())


def app_routes() -> set[tuple[str, str]]:
    app = create_app(make_settings(demo_page=True), plugins={"demo": install})
    return {(route.method, route.resource.canonical) for route in app.router.routes()}


def doc_routes(doc: dict) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in doc["paths"].items() for method in item if method in METHODS}


def test_every_app_route_is_documented_and_every_documented_route_exists():
    assert app_routes() == doc_routes(load_doc())


def test_document_is_openapi_3_1_with_an_operation_id_per_operation():
    doc = load_doc()
    assert doc["openapi"].startswith("3.1")
    operations = [op for item in doc["paths"].values() for m, op in item.items() if m in METHODS]
    ids = [op["operationId"] for op in operations]
    assert len(ids) == len(set(ids)) == len(operations)
    assert all(op["responses"] for op in operations)


def test_every_problem_type_is_documented():
    problem = load_doc()["components"]["schemas"]["Problem"]
    assert set(problem["properties"]["type"]["enum"]) == {PROBLEM_BASE + s for s in PROBLEM_TYPES} | {"about:blank"}
    documented = {slug: (v["status"], v["title"]) for slug, v in problem["x-problem-types"].items()}
    assert documented == PROBLEM_TYPES


def test_every_reference_resolves():
    doc = load_doc()
    refs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    assert refs
    for ref in refs:
        target: object = doc
        for part in ref.removeprefix("#/").split("/"):
            assert isinstance(target, dict), ref
            assert part in target, ref
            target = target[part]


def test_path_parameters_are_declared():
    for path, item in load_doc()["paths"].items():
        if "{stream_id}" in path:
            assert any(p["name"] == "stream_id" and p["in"] == "path" for p in item["parameters"]), path


def test_problem_slugs_named_by_an_error_response_have_its_status():
    slug_in_ticks = re.compile(r"`([a-z]+(?:-[a-z]+)*)`")
    checked = 0
    for path, item in load_doc()["paths"].items():
        for method, op in item.items():
            if method not in METHODS:
                continue
            for code, response in op["responses"].items():
                if not code.startswith(("4", "5")) or "description" not in response:
                    continue
                for slug in slug_in_ticks.findall(response["description"]):
                    if slug in PROBLEM_TYPES:
                        checked += 1
                        assert PROBLEM_TYPES[slug][0] == int(code), (method, path, code, slug)
    assert checked


def test_sse_route_documents_transient_refusals_as_200_and_the_ui_route_as_503():
    paths = load_doc()["paths"]
    events = paths["/v1/streams/{stream_id}/events"]["get"]["responses"]
    assert "503" not in events  # EventSource gives up on a 503: publisher/api/events.py answers 200 + retry:
    assert "retry:" in events["200"]["description"]
    ui = paths["/v1/streams/{stream_id}/ui"]["get"]["responses"]
    named = set(re.findall(r"`([a-z-]+)`", ui["503"]["description"]))
    assert {"too-many-connections", "shutting-down", "redis-unavailable"} <= named


def test_demo_streams_403_names_the_slug_the_origin_check_raises():
    # the answer itself: tests/tools/test_demo_routes.py (type .../cross-origin)
    assert "`cross-origin`" in load_doc()["paths"]["/demo/streams"]["post"]["responses"]["403"]["description"]


def test_every_route_that_takes_a_credential_documents_the_400_of_a_repeated_authorization():
    # the answer itself: tests/publisher/test_edge_sockets.py::test_repeated_authorization_is_400_on_every_route
    checked = 0
    for path, item in load_doc()["paths"].items():
        for method, op in item.items():
            if method in METHODS and "401" in op["responses"]:
                checked += 1
                assert "400" in op["responses"], (method, path)
                description = op["responses"]["400"]["description"]
                assert "`invalid-field`" in description, (method, path)
                assert "`Authorization`" in description, (method, path)
    assert checked >= 6


def test_submit_request_providers_are_the_contracts() -> None:
    enum = load_doc()["components"]["schemas"]["SubmitRequest"]["properties"]["provider"]["enum"]
    assert enum == list(PROVIDERS)
