"""Every named limit at its edge: exactly at the limit passes, one past fails."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.publisher.helpers import API_KEY, SSEClient, StreamWriter, bearer, make_settings, start

PROBLEM = "application/problem+json"
LIMIT = 300


def body_of_size(size: int) -> bytes:
    base = {"provider": "openai_chat", "model": "m", "request": {"pad": ""}}
    raw = json.dumps(base, separators=(",", ":")).encode()
    return json.dumps({**base, "request": {"pad": "p" * (size - len(raw))}}, separators=(",", ":")).encode()


@pytest.mark.parametrize(("size", "status"), [(LIMIT, 201), (LIMIT + 1, 413)])
async def test_request_body_size_limit(start_app, http, size, status):
    server = await start_app(make_settings(max_body_bytes=LIMIT))
    body = body_of_size(size)
    assert len(body) == size
    headers = {**bearer(API_KEY), "Content-Type": "application/json"}
    async with http.post(server.url("/v1/streams"), data=body, headers=headers) as resp:
        assert resp.status == status
        if status == 413:
            assert resp.content_type == PROBLEM
            assert (await resp.json())["type"] == "https://fanout.dev/problems/body-too-large"


@pytest.mark.parametrize(("size", "status"), [(LIMIT, 201), (LIMIT + 1, 413)])
async def test_request_body_size_limit_without_content_length(start_app, http, size, status):
    server = await start_app(make_settings(max_body_bytes=LIMIT))
    body = body_of_size(size)

    async def chunks():
        for i in range(0, len(body), 64):
            yield body[i:i + 64]

    headers = {**bearer(API_KEY), "Content-Type": "application/json"}
    async with http.post(server.url("/v1/streams"), data=chunks(), headers=headers) as resp:
        assert resp.request_info.headers.get("Transfer-Encoding") == "chunked"
        assert resp.status == status


async def test_open_sse_connections_limit(ctx):
    server = await ctx.start_app(make_settings(max_connections=2, busy_retry_after_s=3))
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    url, headers = server.url(f"/v1/streams/{ctx.sid}/events"), bearer(API_KEY)
    open_responses = []
    for _ in range(2):  # exactly at the limit
        resp = await ctx.http.get(url, headers=headers)
        assert resp.status == 200
        assert (await SSEClient(resp).next_event())["id"] == "1"
        open_responses.append(resp)
    async with ctx.http.get(url, headers=headers) as resp:  # one past: 200, a retry hint, the end
        assert resp.status == 200
        assert resp.content_type == "text/event-stream"
        messages = []
        while (message := await SSEClient(resp).message()) is not None:
            messages.append(message)
        assert 1500 <= int(messages[0]["retry"]) <= 4500  # 3 s, jittered by half
        assert "too-many-connections" in messages[1]["comment"]
        assert not [m for m in messages if "id" in m or "data" in m]
    async with ctx.http.get(server.url("/healthz")) as resp:  # other routes are not counted
        assert resp.status == 200
    open_responses.pop().close()
    gate_free = False
    for _ in range(500):  # the server notices the closed connection
        resp = await ctx.http.get(url, headers=headers)
        if resp.status == 200:
            gate_free = True
            open_responses.append(resp)
            break
        resp.close()
        await asyncio.sleep(0.01)
    assert gate_free
    for resp in open_responses:
        resp.close()


@pytest.mark.parametrize(("length", "status"), [(128, 201), (129, 400)])
async def test_stream_id_length_on_submit(server, http, length, status):
    body = {"provider": "openai_chat", "model": "m", "request": {}, "stream_id": "a" * length}
    async with http.post(server.url("/v1/streams"), json=body, headers=bearer(API_KEY)) as resp:
        assert resp.status == status


@pytest.mark.parametrize(("length", "status"), [(128, 200), (129, 404)])
@pytest.mark.parametrize("route", ["", "/events"])
async def test_stream_id_length_on_read_routes(ctx, length, status, route):
    sid = "b" * length
    await StreamWriter(ctx.redis, ctx.keys, sid).append(start(sid))
    async with ctx.http.get(ctx.server.url(f"/v1/streams/{sid}{route}"), headers=bearer(API_KEY)) as resp:
        assert resp.status == status
        if status == 404:
            assert resp.content_type == PROBLEM


@pytest.mark.parametrize(("length", "status"), [(128, 202), (129, 404)])
async def test_stream_id_length_on_cancel(ctx, length, status):
    sid = "c" * length
    await StreamWriter(ctx.redis, ctx.keys, sid).append(start(sid))
    async with ctx.http.post(ctx.server.url(f"/v1/streams/{sid}/cancel"), headers=bearer(API_KEY)) as resp:
        assert resp.status == status
