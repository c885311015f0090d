"""Status reads paced per credential: the bucket's edge, its refill, others served, bounded memory.

Real publisher, real Redis, real sockets. Each server's status-read buckets get a clock the
test steps by hand (``RateBuckets.clock``), so a bucket holds exactly what the test says
whatever the machine's load: the request at the burst is served, the next is a 429 whose
``Retry-After`` is the wait until the bucket holds one again, rounded up.
"""

from __future__ import annotations

from typing import Any

import pytest

from publisher.api.fair_share import FairShares
from publisher.api.status_rate import RateBuckets, retry_after_s
from publisher.settings import settings_from_env
from publisher.state import FAIR_SHARES, TELEMETRY
from schema.settings import SettingsError
from tests.publisher.helpers import API_KEY, StreamWriter, bearer, make_settings, text_stream, token_for

TOO_MANY = "https://fanout.dev/problems/too-many-requests"


class Clock:
    """Monotonic seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def paced_server(ctx: Any, **settings: Any) -> tuple[Any, Clock, str]:
    """Start a publisher, its buckets on a hand clock; store a finished stream; return its status URL."""
    server = await ctx.start_app(make_settings(**settings))
    clock = Clock()
    for buckets in server.app[FAIR_SHARES].paces.values():
        buckets.clock = clock
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).append(*text_stream(ctx.sid, 3))
    return server, clock, server.url(f"/v1/streams/{ctx.sid}")


async def status_of(ctx: Any, url: str, credential: str) -> tuple[int, str | None, dict[str, Any]]:
    """GET the status; return the HTTP status, the ``Retry-After`` header and the JSON body."""
    async with ctx.http.get(url, headers=bearer(credential)) as resp:
        return resp.status, resp.headers.get("Retry-After"), await resp.json(content_type=None)


async def test_a_token_makes_its_burst_then_gets_429_with_the_wait_until_its_bucket_refills(ctx):
    server, clock, url = await paced_server(ctx, status_read_rate_per_token=0.5, status_read_burst_per_token=3)
    token = token_for(ctx.sid)
    for _ in range(3):  # exactly the burst: served
        status, retry, body = await status_of(ctx, url, token)
        assert (status, retry, body["result"]["status"]) == (200, None, "completed")
    status, retry, body = await status_of(ctx, url, token)  # one past: empty bucket, 1 request back in 2 s
    assert (status, retry) == (429, "2")
    assert (body["type"], body["status"], body["limit"]) == (TOO_MANY, 429, 3)
    assert "FANOUT_STATUS_READ_BURST_PER_TOKEN" in body["detail"]
    assert "FANOUT_STATUS_READ_RATE_PER_TOKEN" in body["detail"]
    assert token not in body["detail"]
    assert server.app[TELEMETRY].shares_refused["status"] == 1  # fanout.fair_share.refused{route=status}
    assert server.app[FAIR_SHARES].held("status") == 0  # the refusal gave its place back
    clock.now += 1.0  # half a request back: still refused, 1 s to go
    assert (await status_of(ctx, url, token))[:2] == (429, "1")
    clock.now += 1.0  # one request back: served, then refused again
    assert (await status_of(ctx, url, token))[:2] == (200, None)
    assert (await status_of(ctx, url, token))[:2] == (429, "2")


async def test_other_credentials_are_served_while_one_token_is_paced(ctx):
    _, _, url = await paced_server(ctx, status_read_rate_per_token=0.5, status_read_burst_per_token=1)
    token, other = token_for(ctx.sid), token_for(ctx.sid, ttl_s=7200)  # two strings: two tokens
    assert (await status_of(ctx, url, token))[0] == 200
    assert (await status_of(ctx, url, token))[0] == 429
    assert (await status_of(ctx, url, other))[0] == 200  # another token has its own bucket
    for _ in range(20):  # an API key is not paced by default (FANOUT_STATUS_READ_RATE_PER_KEY = 0)
        assert (await status_of(ctx, url, API_KEY))[0] == 200
    async with ctx.http.get(url, params={"token": token}) as resp:  # the same token in the query: the same bucket
        assert resp.status == 429


async def test_a_fractional_wait_is_rounded_up_to_whole_seconds(ctx):
    _, clock, url = await paced_server(ctx, status_read_rate_per_token=4.0, status_read_burst_per_token=1)
    token = token_for(ctx.sid)
    assert (await status_of(ctx, url, token))[0] == 200
    assert (await status_of(ctx, url, token))[:2] == (429, "1")  # 0.25 s to wait: Retry-After 1
    clock.now += 0.25
    assert (await status_of(ctx, url, token))[0] == 200


async def test_an_api_key_is_paced_when_its_rate_is_set(ctx):
    _, clock, url = await paced_server(ctx, status_read_rate_per_key=0.25, status_read_burst_per_key=2)
    assert [(await status_of(ctx, url, API_KEY))[0] for _ in range(2)] == [200, 200]
    status, retry, body = await status_of(ctx, url, API_KEY)
    assert (status, retry, body["limit"]) == (429, "4", 2)
    assert "FANOUT_STATUS_READ_RATE_PER_KEY" in body["detail"]
    assert API_KEY not in body["detail"]
    clock.now += 4.0
    assert (await status_of(ctx, url, API_KEY))[0] == 200


async def test_a_rate_of_zero_paces_nothing_and_keeps_no_bucket(ctx):
    server, _, url = await paced_server(ctx, status_read_rate_per_token=0.0, status_read_burst_per_token=1)
    token = token_for(ctx.sid)
    for _ in range(15):
        assert (await status_of(ctx, url, token))[0] == 200
    assert len(server.app[FAIR_SHARES].paces["token"]) == 0


async def test_the_events_route_takes_nothing_from_the_status_bucket(ctx):
    _, _, url = await paced_server(ctx, status_read_rate_per_token=0.5, status_read_burst_per_token=1)
    token = token_for(ctx.sid)
    assert (await status_of(ctx, url, token))[0] == 200
    for _ in range(3):
        async with ctx.http.get(f"{url}/events", headers=bearer(token)) as resp:
            assert resp.status == 200
            assert b"stream.done" in await resp.read()
    assert (await status_of(ctx, url, token))[0] == 429  # the bucket is still the status route's alone


def test_a_refilled_bucket_is_dropped_when_seen():
    clock = Clock()
    buckets = RateBuckets(rate=2.0, burst=4, max_buckets=100, clock=clock)
    assert buckets.take(b"a") == 0.0
    clock.now += 1.9  # not yet full again (4 requests take 2 s to refill)
    assert buckets.take(b"b") == 0.0
    assert len(buckets) == 2
    clock.now += 0.1  # a's bucket is full: dropped, as a fresh one would be the same
    assert buckets.take(b"c") == 0.0
    assert len(buckets) == 2


def test_past_the_bucket_limit_the_least_recently_used_is_dropped():
    clock = Clock()
    buckets = RateBuckets(rate=1.0, burst=1, max_buckets=2, clock=clock)
    for who in (b"a", b"b"):
        assert buckets.take(who) == 0.0
    assert buckets.take(b"a") == 1.0  # refused: still the newest two, a touched last
    assert buckets.take(b"c") == 0.0  # a third: b (least recently used) goes
    assert len(buckets) == 2
    assert buckets.take(b"b") == 0.0  # b forgot: a fresh bucket
    assert buckets.take(b"c") == 1.0  # c kept: still empty


def test_retry_after_is_whole_seconds_rounded_up_and_at_least_one():
    assert [retry_after_s(s) for s in (0.001, 1.0, 1.01, 29.5)] == [1, 1, 2, 30]


def test_the_rate_settings_are_read_from_the_environment_and_checked():
    env = {"FANOUT_DEV": "1", "FANOUT_STATUS_READ_RATE_PER_TOKEN": "0.5", "FANOUT_STATUS_READ_BURST_PER_TOKEN": "7",
           "FANOUT_STATUS_READ_RATE_PER_KEY": "3", "FANOUT_STATUS_READ_BUCKETS": "10"}
    settings = settings_from_env(env)
    paces = FairShares(settings).paces
    assert (paces["token"].rate, paces["token"].burst, paces["key"].rate) == (0.5, 7, 3.0)
    with pytest.raises(SettingsError, match="FANOUT_STATUS_READ_RATE_PER_TOKEN"):
        settings_from_env({"FANOUT_DEV": "1", "FANOUT_STATUS_READ_RATE_PER_TOKEN": "-1"})
    with pytest.raises(SettingsError, match="FANOUT_STATUS_READ_BURST_PER_TOKEN"):
        settings_from_env({"FANOUT_DEV": "1", "FANOUT_STATUS_READ_BURST_PER_TOKEN": "0"})
