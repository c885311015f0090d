"""CORS from FANOUT_CORS_ORIGINS: preflight, simple and streaming responses, wildcard."""

from __future__ import annotations

import pytest

from tests.publisher.helpers import API_KEY, SSEClient, StreamWriter, bearer, make_settings, start, token_for

ORIGIN = "https://app.example"


async def preflight(http, server, path, origin=ORIGIN, method="GET"):
    headers = {"Origin": origin, "Access-Control-Request-Method": method,
               "Access-Control-Request-Headers": "authorization, last-event-id"}
    return await http.options(server.url(path), headers=headers)


async def test_preflight_of_an_allowed_origin(start_app, http):
    server = await start_app(make_settings(cors_origins=[ORIGIN, "https://other.example"]))
    async with await preflight(http, server, "/v1/streams/st_1/events") as resp:
        assert resp.status == 204
        assert resp.headers["Access-Control-Allow-Origin"] == ORIGIN
        assert "Origin" in resp.headers.getall("Vary")
        allowed = {h.strip().lower() for h in resp.headers["Access-Control-Allow-Headers"].split(",")}
        assert {"authorization", "last-event-id", "content-type"} <= allowed
        assert {"GET", "POST"} <= {m.strip() for m in resp.headers["Access-Control-Allow-Methods"].split(",")}
        assert int(resp.headers["Access-Control-Max-Age"]) > 0
    async with await preflight(http, server, "/v1/streams", method="POST") as resp:
        assert resp.status == 204
        assert resp.headers["Access-Control-Allow-Origin"] == ORIGIN


async def test_preflight_of_another_origin_grants_nothing(start_app, http):
    server = await start_app(make_settings(cors_origins=[ORIGIN]))
    async with await preflight(http, server, "/v1/streams", origin="https://evil.example", method="POST") as resp:
        assert "Access-Control-Allow-Origin" not in resp.headers
        assert "Access-Control-Allow-Headers" not in resp.headers


async def test_preflight_of_an_unknown_path_is_404(start_app, http):
    server = await start_app(make_settings(cors_origins=["*"]))
    async with await preflight(http, server, "/nope") as resp:
        assert resp.status == 404


async def test_no_cors_configured_grants_nothing(ctx):
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    async with await preflight(ctx.http, ctx.server, "/v1/streams") as resp:
        assert "Access-Control-Allow-Origin" not in resp.headers
    headers = {"Origin": ORIGIN, **bearer(API_KEY)}
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}"), headers=headers) as resp:
        assert resp.status == 200
        assert "Access-Control-Allow-Origin" not in resp.headers


@pytest.mark.parametrize(("origins", "expected"), [([ORIGIN], ORIGIN), (["*"], "*")])
async def test_event_stream_and_problem_responses_carry_cors_headers(ctx, origins, expected):
    server = await ctx.start_app(make_settings(cors_origins=origins))
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    url = server.url(f"/v1/streams/{ctx.sid}/events?token={token_for(ctx.sid)}")
    async with ctx.http.get(url, headers={"Origin": ORIGIN}) as resp:
        assert resp.status == 200
        assert resp.headers["Access-Control-Allow-Origin"] == expected
        assert (await SSEClient(resp).next_event())["id"] == "1"
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers={"Origin": ORIGIN}) as resp:
        assert resp.status == 401
        assert resp.headers["Access-Control-Allow-Origin"] == expected
        assert "WWW-Authenticate" in resp.headers["Access-Control-Expose-Headers"]
