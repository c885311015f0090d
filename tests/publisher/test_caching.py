"""Finished streams are immutable: a strong ``ETag``, ``Cache-Control`` until the TTL, ``304`` (real sockets)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.publisher.conftest import Ctx
from tests.publisher.helpers import (
    API_KEY,
    StreamWriter,
    bearer,
    make_settings,
    start,
    text_stream,
    token_for,
)

pytestmark = pytest.mark.topologies

ROUTES = ("/events", "/events?snapshot=1", "/ui", "")
"""Every route of a stream that serves its content (``""``: the status route)."""


def url(ctx: Ctx, route: str, sid: str | None = None) -> str:
    return ctx.server.url(f"/v1/streams/{sid or ctx.sid}{route}")


async def get(ctx: Ctx, route: str, headers: dict[str, str] | None = None,
              sid: str | None = None) -> tuple[int, CIMultiDict[str], bytes]:
    sid = sid or ctx.sid
    async with ctx.http.get(url(ctx, route, sid), headers={**bearer(token_for(sid)), **(headers or {})}) as resp:
        return resp.status, resp.headers.copy(), await resp.read()


async def finished(ctx: Ctx, ttl_s: int | None = 600, epoch: bytes = b"e1") -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=epoch)
    await writer.meta()
    await writer.append(*text_stream(ctx.sid, 3))
    if ttl_s is not None:
        await ctx.redis.expire(ctx.keys.meta(ctx.sid), ttl_s)
        await ctx.redis.expire(ctx.keys.events(ctx.sid), ttl_s)


@pytest.mark.parametrize("route", ROUTES)
async def test_a_finished_stream_answers_a_strong_etag_private_until_its_ttl(ctx: Ctx, route: str) -> None:
    await finished(ctx, ttl_s=600)
    status, headers, body = await get(ctx, route)
    assert status == 200
    tag = headers["ETag"]
    assert tag[0] == tag[-1] == '"'  # strong: no W/ prefix
    control = [part.strip() for part in headers["Cache-Control"].split(",")]
    assert control[0] == "private"
    assert 590 <= int(control[1].removeprefix("max-age=")) <= 600
    assert "Authorization" in headers["Vary"]
    assert ("Last-Event-ID" in headers["Vary"]) == route.startswith("/events")
    again = await get(ctx, route)
    assert (again[1]["ETag"], again[2]) == (tag, body)  # strong: the same bytes every time


@pytest.mark.parametrize("route", ROUTES)
async def test_if_none_match_of_a_finished_stream_gets_304_without_a_body(ctx: Ctx, route: str) -> None:
    await finished(ctx)
    tag = (await get(ctx, route))[1]["ETag"]
    for condition in (tag, f"W/{tag}", f'"other", {tag}', "*"):
        status, headers, body = await get(ctx, route, {"If-None-Match": condition})
        assert (status, body) == (304, b""), condition
        assert headers["ETag"] == tag
        assert headers["Cache-Control"].startswith("private, max-age=")
    status, _, body = await get(ctx, route, {"If-None-Match": '"other"'})
    assert status == 200
    assert body


@pytest.mark.parametrize("route", ["/events", "/events?snapshot=1", ""])
async def test_a_running_stream_is_no_store_and_ignores_if_none_match(ctx: Ctx, route: str) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(start(ctx.sid))
    async with ctx.http.get(url(ctx, route), headers={**bearer(token_for(ctx.sid)), "If-None-Match": "*"}) as resp:
        assert resp.status == 200
        assert resp.headers["Cache-Control"].split(",")[0] == "no-store"
        assert "ETag" not in resp.headers


async def test_ui_of_a_running_stream_is_no_store(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid)
    await writer.meta()
    await writer.append(start(ctx.sid))
    async with ctx.http.get(url(ctx, "/ui"), headers={**bearer(token_for(ctx.sid)), "If-None-Match": "*"}) as resp:
        assert resp.status == 200
        assert resp.headers["Cache-Control"] == "no-store, no-transform"
        assert "ETag" not in resp.headers


async def test_each_representation_has_its_own_tag(ctx: Ctx) -> None:
    await finished(ctx)
    tags = {(await get(ctx, "/events", {"Last-Event-ID": position}))[1]["ETag"] for position in ("", "2", "3")}
    tags.add((await get(ctx, "/events", bearer(API_KEY)))[1]["ETag"])  # the internal projection
    tags |= {(await get(ctx, route))[1]["ETag"] for route in ROUTES}
    tags.add((await get(ctx, "?epoch=e1"))[1]["ETag"])
    assert len(tags) == 8
    assert (await get(ctx, "/events", {"Last-Event-ID": "2.e1"}))[1]["ETag"] == \
        (await get(ctx, "/events", {"Last-Event-ID": "2"}))[1]["ETag"]  # the same bytes


async def test_the_tag_changes_when_the_stream_is_written_again_as_another_generation(ctx: Ctx) -> None:
    await finished(ctx, epoch=b"e1")
    old = {route: (await get(ctx, route))[1]["ETag"] for route in ROUTES}
    await ctx.redis.delete(ctx.keys.events(ctx.sid), ctx.keys.meta(ctx.sid))
    await finished(ctx, epoch=b"e2")
    for route, tag in old.items():
        status, headers, _ = await get(ctx, route, {"If-None-Match": tag})
        assert status == 200, route
        assert headers["ETag"] != tag


async def test_a_stream_without_a_ttl_gets_the_configured_max_age(ctx: Ctx) -> None:
    await finished(ctx, ttl_s=None)
    assert (await get(ctx, "/events"))[1]["Cache-Control"] == "private, max-age=86400, no-transform"


async def test_finished_max_age_0_turns_caching_off(ctx: Ctx) -> None:
    server = await ctx.start_app(make_settings(finished_max_age_s=0))
    await finished(ctx)
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"),
                            headers={**bearer(token_for(ctx.sid)), "If-None-Match": "*"}) as resp:
        assert resp.status == 200
        assert resp.headers["Cache-Control"] == "no-store, no-transform"
        assert "ETag" not in resp.headers


class FailingReads:
    """Forwards to the real client; every XRANGE after the first fails as a lost connection would."""

    def __init__(self, inner: Any) -> None:
        self._inner, self.calls = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def xrange(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls > 1:
            raise RedisConnectionError("connection lost")
        return await self._inner.xrange(*args, **kwargs)


@pytest.mark.parametrize("route", ["/events", "/ui"])
async def test_a_finished_stream_response_cut_by_a_storage_error_is_aborted_not_ended(ctx: Ctx, route: str) -> None:
    """A cache must never keep a partial body under a strong tag: the chunked body is not terminated."""
    server = await ctx.start_app(make_settings(read_first_page=2, read_page=2, read_ahead_hold_ms=0),
                                 wrap_redis=FailingReads)
    await finished(ctx)
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}{route}"), headers=bearer(token_for(ctx.sid))) as resp:
        assert resp.status == 200
        assert "ETag" in resp.headers
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()


async def test_the_304_check_follows_authorization(ctx: Ctx) -> None:
    await finished(ctx)
    tag = (await get(ctx, "/events"))[1]["ETag"]
    async with ctx.http.get(url(ctx, "/events"), headers={"If-None-Match": tag}) as resp:
        assert resp.status == 401
    async with ctx.http.get(url(ctx, "/events"),
                            headers={**bearer(token_for("st_other")), "If-None-Match": tag}) as resp:
        assert resp.status == 403



async def test_a_cross_origin_page_may_revalidate_and_reads_the_tag(ctx: Ctx) -> None:
    origin = "https://app.example"
    server = await ctx.start_app(make_settings(cors_origins=[origin]))
    await finished(ctx)
    preflight = {"Origin": origin, "Access-Control-Request-Method": "GET",
                 "Access-Control-Request-Headers": "authorization, if-none-match"}
    async with ctx.http.options(server.url(f"/v1/streams/{ctx.sid}"), headers=preflight) as resp:
        allowed = {h.strip().lower() for h in resp.headers["Access-Control-Allow-Headers"].split(",")}
        assert "if-none-match" in allowed
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}"),
                            headers={**bearer(token_for(ctx.sid)), "Origin": origin}) as resp:
        assert "ETag" in resp.headers["Access-Control-Expose-Headers"]
        assert {"Authorization", "Origin"} <= {v.strip() for value in resp.headers.getall("Vary")
                                                for v in value.split(",")}
