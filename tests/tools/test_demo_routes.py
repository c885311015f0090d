"""The demo routes on a real publisher and Redis: off by default, cases listed, jobs submitted for the page."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from tests.publisher.conftest import Ctx
from tests.publisher.helpers import bearer, make_settings
from tools.demo.cases import catalogue
from tools.demo.routes import ASSETS, PAGE_CSP, install

CASE = "thinking_with_signature"


@pytest.fixture
async def demo(ctx: Ctx) -> str:
    """Base URL of a publisher in demo mode."""
    server = await ctx.start_app(make_settings(demo_page=True), plugins={"demo": install})
    return server.base_url


@pytest.mark.parametrize(("method", "path"), [("GET", "/demo"), ("GET", "/demo/cases"),
                                              ("POST", "/demo/streams"), ("GET", "/demo/assets/demo.js")])
async def test_demo_routes_are_off_by_default(ctx: Ctx, method: str, path: str) -> None:
    async with ctx.http.request(method, ctx.server.url(path), json={"provider": "anthropic", "case": CASE}) as resp:
        assert resp.status == 404


async def test_demo_page_is_served_under_a_strict_content_security_policy(ctx: Ctx, demo: str) -> None:
    async with ctx.http.get(f"{demo}/demo") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Security-Policy"] == PAGE_CSP
        page = await resp.text()
    assert "script-src 'self'" in PAGE_CSP
    assert "'unsafe-inline'" not in PAGE_CSP
    assert "<script>" not in page, "no inline script: the CSP forbids it"
    for name in ("demo.js", "demo.css", "marked.umd.js", "purify.min.js"):
        assert f"/demo/assets/{name}" in page


async def test_demo_assets_serves_only_its_list(ctx: Ctx, demo: str) -> None:
    for name, path in ASSETS.items():
        async with ctx.http.get(f"{demo}/demo/assets/{name}") as resp:
            assert resp.status == 200, name
            assert await resp.read() == path.read_bytes()
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
    for name in ("demo.html", "README.md", "marked.LICENSE", "..%2Fdemo_routes.py"):
        async with ctx.http.get(f"{demo}/demo/assets/{name}") as resp:
            assert resp.status == 404, name


async def test_demo_cases_lists_what_the_fake_upstream_serves(
    ctx: Ctx, demo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "openai_chat").mkdir()
    (tmp_path / "openai_chat" / "my_own_case.sse").write_bytes(b"data: [DONE]\n\n")
    monkeypatch.setenv("FANOUT_TRANSCRIPTS_DIR", str(tmp_path))
    async with ctx.http.get(f"{demo}/demo/cases") as resp:
        assert resp.status == 200
        body = await resp.json()
    providers = {p["provider"]: p for p in body["providers"]}
    assert set(providers) == {"openai_chat", "openai_responses", "anthropic", "gemini"}
    assert providers["gemini"]["directory"] == "gemini_sse"
    anthropic = {c["case"]: c for c in providers["anthropic"]["cases"]}
    assert anthropic[CASE]["terminal"] == "completed / stop"  # from transcripts/anthropic/INDEX.md
    assert "signature_delta" in anthropic[CASE]["about"]
    chat = {c["case"] for c in providers["openai_chat"]["cases"]}
    assert "my_own_case" in chat
    assert "simple_text_greek_usage_chunk" in chat
    assert body["roots"][0] == str(tmp_path)
    assert body == msgspec.to_builtins({"providers": catalogue({"FANOUT_TRANSCRIPTS_DIR": str(tmp_path)}),
                                        "slow_prefix": "slow-", "roots": body["roots"]})


async def test_demo_start_submits_the_case_and_answers_a_read_token(ctx: Ctx, demo: str) -> None:
    async with ctx.http.post(f"{demo}/demo/streams", json={"provider": "anthropic", "case": CASE},
                             headers={"Origin": demo}) as resp:
        assert resp.status == 201, await resp.text()
        body = await resp.json()
    assert body["model"] == CASE
    assert body["token_scope"] == "public"
    meta = await ctx.redis.hgetall(ctx.keys.meta(body["stream_id"]))
    assert meta[b"provider"] == b"anthropic"
    assert meta[b"model"] == CASE.encode()
    async with ctx.http.get(f"{demo}/v1/streams/{body['stream_id']}", headers=bearer(body["token"])) as resp:
        assert resp.status == 200
        assert (await resp.json())["state"] == "queued"


async def test_demo_start_slow_submits_the_slow_model(ctx: Ctx, demo: str) -> None:
    async with ctx.http.post(f"{demo}/demo/streams", json={"provider": "gemini", "case": "thought_text_call_blocks",
                                                           "slow": True}, headers={"Origin": demo}) as resp:
        assert resp.status == 201, await resp.text()
        body = await resp.json()
    assert body["model"] == "slow-thought_text_call_blocks"
    assert await ctx.redis.hget(ctx.keys.meta(body["stream_id"]), "model") == b"slow-thought_text_call_blocks"


@pytest.mark.parametrize(("payload", "field"), [
    ({"provider": "anthropic", "case": "claude-sonnet-4-5"}, "case"),
    ({"provider": "anthropic", "case": "../../etc/passwd"}, "case"),
    ({"provider": "mistral", "case": CASE}, "provider"),
    ({"provider": "anthropic", "case": CASE, "slow": "yes"}, "slow"),
    ({"provider": "anthropic", "case": CASE, "model": "x"}, "model"),
    ({"provider": "anthropic"}, "case"),
])
async def test_demo_start_refuses_anything_but_a_listed_case(ctx: Ctx, demo: str, payload: dict, field: str) -> None:
    async with ctx.http.post(f"{demo}/demo/streams", json=payload, headers={"Origin": demo}) as resp:
        assert resp.status == 400
        problem = await resp.json()
    assert problem["type"].endswith("/invalid-field")
    assert [e["field"] for e in problem["errors"]] == [field]
    if field == "case" and "case" in payload:
        assert "GET /demo/cases" in problem["detail"]


async def test_demo_start_names_the_providers_for_a_directory_name(ctx: Ctx, demo: str) -> None:
    payload = {"provider": "gemini_sse", "case": "thought_text_call_blocks"}
    async with ctx.http.post(f"{demo}/demo/streams", json=payload, headers={"Origin": demo}) as resp:
        assert resp.status == 400
        problem = await resp.json()
    assert "openai_chat, openai_responses, anthropic, gemini" in problem["errors"][0]["detail"]


async def test_demo_start_refuses_a_body_that_is_not_an_object(ctx: Ctx, demo: str) -> None:
    async with ctx.http.post(f"{demo}/demo/streams", data=b"[1]", headers={"Origin": demo}) as resp:
        assert resp.status == 400
        assert (await resp.json())["type"].endswith("/invalid-body")


async def test_demo_start_without_origin_says_the_request_sent_none(ctx: Ctx, demo: str) -> None:
    """A ``curl`` without ``Origin`` is refused, and the detail says it was this request that sent none."""
    async with ctx.http.post(f"{demo}/demo/streams", json={"provider": "anthropic", "case": CASE},
                             skip_auto_headers=["Origin"]) as resp:
        assert resp.status == 403
        problem = await resp.json()
    assert "(this request sent no Origin header)" in problem["detail"]


async def test_demo_start_refuses_another_origin(ctx: Ctx, demo: str) -> None:
    headers = {"Origin": "https://evil.example"}
    async with ctx.http.post(f"{demo}/demo/streams", json={"provider": "anthropic", "case": CASE},
                             headers=headers) as resp:
        assert resp.status == 403
        problem = await resp.json()
        assert "POST /v1/streams" in problem["detail"]
        assert "(this request sent Origin 'https://evil.example')" in problem["detail"]
        assert (problem["type"], problem["title"]) == ("https://fanout.dev/problems/cross-origin",
                                                       "Request from another origin")
    async with ctx.http.post(f"{demo}/demo/streams", json={"provider": "anthropic", "case": CASE},
                             headers={"Origin": demo}) as resp:
        assert resp.status == 201


async def test_demo_start_refuses_no_origin_and_a_rebound_host_name(ctx: Ctx, demo: str) -> None:
    body = {"provider": "anthropic", "case": CASE}
    async with ctx.http.post(f"{demo}/demo/streams", json=body) as resp:
        assert resp.status == 403  # no Origin: not the page's fetch
    port = demo.rsplit(":", 1)[1]
    rebound = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    async with ctx.http.post(f"{demo}/demo/streams", json=body, headers=rebound) as resp:
        assert resp.status == 403  # a DNS-rebinding page: Origin and Host agree, but name a foreign host
    async with ctx.http.post(f"{demo}/demo/streams", json=body,
                             headers={"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}) as resp:
        assert resp.status == 201
