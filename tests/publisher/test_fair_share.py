"""Fair shares: each credential's (or address's) limits at their edge, and others served meanwhile.

Real publisher, real Redis, real sockets. Exactly at a limit is served; one past is
answered ``too-many-requests``: on ``/events`` a 200 holding only a ``retry:`` hint and a
``busy`` comment (EventSource reconnects), elsewhere a 429 problem with ``Retry-After``.
Status requests and ``/readyz`` are held in flight by a Redis wrapper that makes one
command wait, so the places they hold can be counted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from publisher.settings import settings_from_env
from publisher.state import FAIR_SHARES, TELEMETRY
from schema.settings import SettingsError
from tests.publisher.helpers import (
    API_KEY,
    SECRET,
    SSEClient,
    StreamWriter,
    bearer,
    eventually,
    make_settings,
    start,
    text_stream,
    token_for,
)

PROBLEM = "application/problem+json"
TOO_MANY = "https://fanout.dev/problems/too-many-requests"


async def busy_messages(resp: aiohttp.ClientResponse) -> list[dict[str, str]]:
    """Read an SSE body to its end; return its messages."""
    client, messages = SSEClient(resp), []
    while (message := await client.message()) is not None:
        messages.append(message)
    return messages


async def open_events(http: aiohttp.ClientSession, url: str, credential: str) -> aiohttp.ClientResponse:
    """Open an SSE response and read its first event (so the reader is surely open)."""
    resp = await http.get(url, headers=bearer(credential))
    assert resp.status == 200
    assert (await SSEClient(resp).next_event())["id"] == "1"
    return resp


async def assert_too_many(resp: aiohttp.ClientResponse, setting: str, limit: int, retry_after_s: int) -> None:
    assert resp.status == 429
    assert resp.content_type == PROBLEM
    assert resp.headers["Retry-After"] == str(retry_after_s)
    body = await resp.json()
    assert (body["type"], body["status"], body["limit"]) == (TOO_MANY, 429, limit)
    assert body["title"] == "Too many requests for one credential"
    assert setting in body["detail"]


@pytest.mark.parametrize("kind", ["token", "key"])
async def test_open_event_streams_per_credential_at_the_limit_and_one_past(ctx, kind):
    limits = {"max_connections_per_token": 2} if kind == "token" else {"max_connections_per_key": 2}
    server = await ctx.start_app(make_settings(**limits, share_retry_after_s=3, busy_retry_after_s=1))
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    url = server.url(f"/v1/streams/{ctx.sid}/events")
    mine = token_for(ctx.sid) if kind == "token" else API_KEY
    other = token_for(ctx.sid, ttl_s=7200)  # another token of the same stream: another string
    held = [await open_events(ctx.http, url, mine) for _ in range(2)]  # exactly at the limit
    async with ctx.http.get(url, headers=bearer(mine)) as resp:  # one past: 200, a retry hint, the end
        assert (resp.status, resp.content_type) == (200, "text/event-stream")
        messages = await busy_messages(resp)
    assert 1500 <= int(messages[0]["retry"]) <= 4500  # FANOUT_SHARE_RETRY_AFTER_S (3 s), jittered by half
    assert "busy: too-many-requests" in messages[1]["comment"]
    assert not [m for m in messages if "id" in m or "data" in m]
    assert server.app[TELEMETRY].shares_refused == {"sse": 1, "status": 0}  # fanout.fair_share.refused
    held.append(await open_events(ctx.http, url, other))  # another credential is served meanwhile
    held.pop(0).close()
    await eventually(lambda: server.app[FAIR_SHARES].held("sse") == 2)  # the server saw the client leave
    held.append(await open_events(ctx.http, url, mine))  # the place is free again
    for resp in held:
        resp.close()


async def test_ui_and_events_count_together_and_ui_answers_429_past_the_limit(ctx):
    server = await ctx.start_app(make_settings(max_connections_per_token=2, share_retry_after_s=4))
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    token = token_for(ctx.sid)
    events = await open_events(ctx.http, server.url(f"/v1/streams/{ctx.sid}/events"), token)
    ui = await ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/ui"), headers=bearer(token))
    assert ui.status == 200
    await ui.content.readline()  # the first chunk: the response is open
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/ui"), headers=bearer(token)) as resp:
        await assert_too_many(resp, "FANOUT_MAX_CONNECTIONS_PER_TOKEN", 2, 4)
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), headers=bearer(token)) as resp:
        assert "busy: too-many-requests" in (await busy_messages(resp))[1]["comment"]
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/ui"), headers=bearer(API_KEY)) as resp:
        assert resp.status == 200  # the API key is another holder
    events.close()
    ui.close()


async def test_a_token_in_the_query_counts_as_the_same_token_in_the_header(ctx):
    server = await ctx.start_app(make_settings(max_connections_per_token=1))
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(start(ctx.sid))
    token = token_for(ctx.sid)
    held = await open_events(ctx.http, server.url(f"/v1/streams/{ctx.sid}/events"), token)
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/events"), params={"token": token}) as resp:
        assert "busy: too-many-requests" in (await busy_messages(resp))[1]["comment"]
    held.close()


class GatedRedis:
    """Forwards to the real client; the first ``XRANGE`` of ``key`` (or every ``PING``) waits for ``release``."""

    def __init__(self, inner: Any, key: str) -> None:
        self._inner, self._key = inner, key
        self.release = asyncio.Event()
        self.xranges: list[str] = []
        """The ``min`` of every XRANGE of ``key``."""
        self.log: list[tuple[str, str]] = []
        """``("start"|"end", key)`` of every XRANGE, in order."""
        self.pings = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def xrange(self, name, min="-", max="+", count=None):
        self.log.append(("start", name))
        if name == self._key:
            self.xranges.append(min)
            if len(self.xranges) == 1:
                await self.release.wait()
        result = await self._inner.xrange(name, min, max, count=count)
        self.log.append(("end", name))
        return result

    async def ping(self, **kwargs: Any) -> Any:
        self.pings += 1
        await self.release.wait()
        return await self._inner.ping(**kwargs)


@pytest.fixture
async def gated_server(ctx) -> Any:
    """Start a publisher whose Redis client is a :class:`GatedRedis`; the gate opens at teardown anyway."""
    gated: list[GatedRedis] = []

    async def make(**settings: Any) -> tuple[Any, GatedRedis]:
        def wrap(client: Any) -> GatedRedis:
            gated.append(GatedRedis(client, ctx.keys.events(ctx.sid)))
            return gated[-1]

        server = await ctx.start_app(make_settings(**settings), wrap_redis=wrap)
        return server, gated[-1]

    yield make
    for gate in gated:  # a failed test must not leave requests waiting on the gate
        gate.release.set()


@pytest.mark.parametrize("kind", ["token", "key"])
async def test_status_requests_in_flight_per_credential_at_the_limit_and_one_past(ctx, gated_server, kind):
    setting = "max_status_reads_per_token" if kind == "token" else "max_status_reads_per_key"
    server, gate = await gated_server(**{setting: 2}, share_retry_after_s=5)
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*text_stream(ctx.sid, 3))
    url = server.url(f"/v1/streams/{ctx.sid}")
    mine = token_for(ctx.sid) if kind == "token" else API_KEY
    in_flight = [asyncio.create_task(ctx.http.get(url, headers=bearer(mine))) for _ in range(2)]
    await eventually(lambda: server.app[FAIR_SHARES].held("status") == 2)  # both wait for the one read
    async with ctx.http.get(url, headers=bearer(mine)) as resp:  # one past
        await assert_too_many(resp, f"FANOUT_{setting.upper()}", 2, 5)
    assert server.app[TELEMETRY].shares_refused == {"sse": 0, "status": 1}
    other = token_for(ctx.sid, ttl_s=7200) if kind == "token" else token_for(ctx.sid, "internal")
    other_scope = asyncio.create_task(ctx.http.get(url, headers=bearer(other)))
    await eventually(lambda: server.app[FAIR_SHARES].held("status") == 3)  # another credential holds a place
    gate.release.set()
    bodies = []
    for task in [*in_flight, other_scope]:
        async with await task as resp:
            assert resp.status == 200  # exactly at the limit: served
            bodies.append(await resp.json())
    assert bodies[0] == bodies[1]
    assert bodies[0]["result"]["status"] == "completed"
    assert server.app[FAIR_SHARES].held("status") == 0


async def test_a_status_request_refused_for_its_place_takes_nothing_from_the_pace(ctx, gated_server):
    # 0.01 a second: the bucket refills nothing that matters while the test runs, with no hand clock
    server, gate = await gated_server(max_status_reads_per_token=1, status_read_burst_per_token=2,
                                      status_read_rate_per_token=0.01)
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*text_stream(ctx.sid, 3))
    url, token = server.url(f"/v1/streams/{ctx.sid}"), token_for(ctx.sid)
    in_flight = asyncio.create_task(ctx.http.get(url, headers=bearer(token)))  # takes 1 of 2
    await eventually(lambda: server.app[FAIR_SHARES].held("status") == 1)
    async with ctx.http.get(url, headers=bearer(token)) as resp:  # refused for its place, before the bucket
        assert "FANOUT_MAX_STATUS_READS_PER_TOKEN" in (await resp.json())["detail"]
    gate.release.set()
    async with await in_flight as resp:
        assert resp.status == 200
    async with ctx.http.get(url, headers=bearer(token)) as resp:
        assert resp.status == 200  # the second of 2: the refusal took none
    async with ctx.http.get(url, headers=bearer(token)) as resp:
        assert resp.status == 429
        assert "FANOUT_STATUS_READ_BURST_PER_TOKEN" in (await resp.json())["detail"]


async def test_readyz_in_flight_per_address_at_the_limit_and_one_past_whatever_credential_it_carries(ctx, gated_server):
    server, gate = await gated_server(max_status_reads_per_address=2, share_retry_after_s=2)
    url = server.url("/readyz")
    in_flight = [asyncio.create_task(ctx.http.get(url)),
                 asyncio.create_task(ctx.http.get(url, headers=bearer("not-a-key")))]  # never verified: the address
    await eventually(lambda: gate.pings == 2)
    async with ctx.http.get(url, headers=bearer(token_for(ctx.sid))) as resp:
        await assert_too_many(resp, "FANOUT_MAX_STATUS_READS_PER_ADDRESS", 2, 2)
    gate.release.set()
    for task in in_flight:
        async with await task as resp:
            assert resp.status == 200


@pytest.mark.parametrize(("trusted", "separate"), [([], False), (["127.0.0.0/8"], True)])
async def test_forwarded_addresses_count_apart_only_behind_a_trusted_proxy(ctx, gated_server, trusted, separate):
    server, gate = await gated_server(max_status_reads_per_address=1, trusted_proxies=trusted)
    url = server.url("/readyz")
    first = asyncio.create_task(ctx.http.get(url, headers={"X-Forwarded-For": "203.0.113.9, 10.0.0.1"}))
    await eventually(lambda: gate.pings == 1)
    # the same proxy (127.0.0.1) forwards another client; 10.0.0.2 is not trusted, so it is the client
    second = asyncio.create_task(ctx.http.get(url, headers={"X-Forwarded-For": "10.0.0.2"}))
    if separate:
        await eventually(lambda: gate.pings == 2)
        gate.release.set()
        async with await second as resp:
            assert resp.status == 200
    else:
        async with await second as resp:  # X-Forwarded-For ignored: both are 127.0.0.1
            assert resp.status == 429
        gate.release.set()
    async with await first as resp:
        assert resp.status == 200


def test_a_trusted_proxy_that_is_no_address_is_refused_at_start():
    env = {"FANOUT_TOKEN_SECRET": SECRET, "FANOUT_TRUSTED_PROXIES": "10.0.0.0/8,proxy.local"}
    with pytest.raises(SettingsError, match=r"FANOUT_TRUSTED_PROXIES entry 'proxy\.local'"):
        settings_from_env(env)
    assert settings_from_env({**env, "FANOUT_TRUSTED_PROXIES": "10.0.0.0/8, ::1"}).trusted_proxies == [
        "10.0.0.0/8", "::1"]


async def test_durable_catch_up_reads_hold_a_status_read_place(ctx, gated_server):
    server, gate = await gated_server(max_status_reads_per_token=1, share_retry_after_s=5)
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*text_stream(ctx.sid, 3))
    url, token = server.url(f"/v1/streams/{ctx.sid}/durable?offset=-1"), token_for(ctx.sid)
    in_flight = asyncio.create_task(ctx.http.get(url, headers=bearer(token)))
    await eventually(lambda: server.app[FAIR_SHARES].held("status") == 1)  # waits for its read
    async with ctx.http.get(url, headers=bearer(token)) as resp:  # one past
        await assert_too_many(resp, "FANOUT_MAX_STATUS_READS_PER_TOKEN", 1, 5)
    gate.release.set()
    async with await in_flight as resp:
        assert resp.status == 200
        assert [item["seq"] for item in await resp.json()] == list(range(1, 8))  # 3 deltas: 7 events
    assert server.app[FAIR_SHARES].held("status") == 0
