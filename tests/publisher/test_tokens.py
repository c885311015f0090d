"""Read tokens: signing, scope, expiry, header vs query, never logged; the secret is required."""

from __future__ import annotations

import logging
import time

import pytest

from publisher.api.tokens import TokenExpiredError, TokenInvalidError, issue, verify
from publisher.app import create_app
from publisher.settings import PublisherSettings, settings_from_env
from schema.settings import SettingsError
from tests.publisher.helpers import API_KEY, SECRET, SSEClient, StreamWriter, bearer, ids, text_stream, token_for

PROBLEM_BASE = "https://fanout.dev/problems/"


# --- the token format -------------------------------------------------------------------------

def test_token_round_trip():
    token = issue(SECRET, "st_1", "internal", 2_000_000_000)
    claims = verify(SECRET, token, 1_999_999_999)
    assert (claims.sid, claims.scp, claims.exp) == ("st_1", "internal", 2_000_000_000)
    assert token.startswith("v1.")


def test_token_expires_at_its_exp_second():
    token = issue(SECRET, "st_1", "public", 1000)
    verify(SECRET, token, 999.999)
    with pytest.raises(TokenExpiredError):
        verify(SECRET, token, 1000)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-2] + ("A" if t[-2] != "A" else "B") + t[-1],   # signature changed
        lambda t: t.replace("v1.", "v2.", 1),                        # unknown version
        lambda t: "v1." + t.split(".")[1][:-1] + "." + t.split(".")[2],  # payload changed
        lambda t: t.split(".")[0] + "." + t.split(".")[1],             # no signature
        lambda t: "garbage",
        lambda t: t + "é",
    ],
)
def test_tampered_token_is_invalid(mangle):
    with pytest.raises(TokenInvalidError):
        verify(SECRET, mangle(issue(SECRET, "st_1", "public", 2_000_000_000)), 0)


def test_token_signed_with_another_secret_is_invalid():
    with pytest.raises(TokenInvalidError):
        verify(SECRET, issue("another-secret-" + "y" * 40, "st_1", "public", 2_000_000_000), 0)


# --- over HTTP --------------------------------------------------------------------------------

async def _stream(redis_client, keys, sid):
    await StreamWriter(redis_client, keys, sid).append(*text_stream(sid, 1))


async def _status_and_type(http, url, headers=None):
    async with http.get(url, headers=headers or {}) as resp:
        body = await resp.json(content_type=None) if resp.status != 200 else None
        return resp.status, (body or {}).get("type", "").removeprefix(PROBLEM_BASE), resp.headers


@pytest.mark.parametrize("route", ["/events", ""])
async def test_token_by_header_or_query_reads_the_stream(ctx, route):
    await _stream(ctx.redis, ctx.keys, ctx.sid)
    url = ctx.server.url(f"/v1/streams/{ctx.sid}{route}")
    assert (await _status_and_type(ctx.http, url, bearer(token_for(ctx.sid))))[0] == 200
    assert (await _status_and_type(ctx.http, f"{url}?token={token_for(ctx.sid)}"))[0] == 200


async def test_api_key_reads_any_stream_but_only_from_the_header(ctx):
    await _stream(ctx.redis, ctx.keys, ctx.sid)
    url = ctx.server.url(f"/v1/streams/{ctx.sid}/events")
    assert (await _status_and_type(ctx.http, url, bearer(API_KEY)))[0] == 200
    assert (await _status_and_type(ctx.http, f"{url}?token={API_KEY}"))[:2] == (401, "invalid-token")


@pytest.mark.parametrize(
    ("credential", "status", "slug"),
    [
        (lambda sid: token_for("st_other"), 403, "forbidden"),
        (lambda sid: token_for(sid, ttl_s=-1), 401, "token-expired"),
        (lambda sid: token_for(sid, secret="z" * 40), 401, "invalid-token"),
        (lambda sid: token_for(sid)[:-3] + "abc", 401, "invalid-token"),
        (lambda sid: None, 401, "unauthorized"),
        (lambda sid: "not-an-api-key", 401, "unauthorized"),
    ],
)
@pytest.mark.parametrize("how", ["header", "query"])
async def test_refused_credentials(ctx, credential, status, slug, how):
    await _stream(ctx.redis, ctx.keys, ctx.sid)
    secret = credential(ctx.sid)
    url, headers = ctx.server.url(f"/v1/streams/{ctx.sid}/events"), {}
    if secret is not None and how == "header":
        headers = bearer(secret)
    elif secret is not None:
        url += f"?token={secret}"
        if slug == "unauthorized":  # a non-token in the query is judged as a token
            slug = "invalid-token"
    got_status, got_slug, got_headers = await _status_and_type(ctx.http, url, headers)
    assert (got_status, got_slug) == (status, slug)
    if status == 401:
        assert got_headers["WWW-Authenticate"].startswith("Bearer")


async def test_header_credential_wins_over_query(ctx):
    await _stream(ctx.redis, ctx.keys, ctx.sid)
    url = ctx.server.url(f"/v1/streams/{ctx.sid}/events?token={token_for(ctx.sid)}")
    assert (await _status_and_type(ctx.http, url, bearer(token_for("st_other"))))[:2] == (403, "forbidden")


async def test_mint_token_renews_and_grants_internal_scope(ctx):
    await _stream(ctx.redis, ctx.keys, ctx.sid)
    url = ctx.server.url(f"/v1/streams/{ctx.sid}/tokens")
    async with ctx.http.post(url, json={"scope": "internal"}, headers=bearer(API_KEY)) as resp:
        assert resp.status == 201
        answer = await resp.json()
    assert answer["token_scope"] == "internal"
    assert verify(SECRET, answer["token"], time.time()).scp == "internal"
    async with ctx.http.post(url, headers=bearer(API_KEY)) as resp:
        assert (await resp.json())["token_scope"] == "public"
    async with ctx.http.post(url, json={"scope": "root"}, headers=bearer(API_KEY)) as resp:
        assert resp.status == 400
        problem = await resp.json()
        assert problem["detail"] == "the body takes one field, scope: 'public' or 'internal'"  # not msgspec's words
        assert problem["errors"][0]["field"] == "scope"
    async with ctx.http.post(url, json={"scope": "internal"}, headers=bearer(token_for(ctx.sid, "internal"))) as resp:
        assert resp.status == 401
    async with ctx.http.post(ctx.server.url("/v1/streams/st_none/tokens"), headers=bearer(API_KEY)) as resp:
        assert resp.status == 404


async def test_access_log_never_prints_the_token(ctx, caplog):
    await _stream(ctx.redis, ctx.keys, ctx.sid)
    token = token_for(ctx.sid)
    with caplog.at_level(logging.DEBUG):
        async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}/events?last_event_id=2&token={token}")) as resp:
            assert ids(await SSEClient(resp).events())[0] == 3
        async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}"), headers=bearer(token)) as resp:
            assert resp.status == 200
        async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}?token={token}x")) as resp:
            assert resp.status == 401
        async with ctx.http.get(ctx.server.url(f"/v1/streams/{ctx.sid}?api_key={API_KEY}&key={API_KEY}"),
                                headers=bearer(token)) as resp:  # parameters the API never reads
            assert resp.status == 200
    access = [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]
    assert any("token=***" in line and "last_event_id=2" in line for line in access)
    assert any("api_key=***&key=***" in line for line in access)
    assert len(access) == 4
    assert all(token not in record.getMessage() for record in caplog.records)
    assert all(API_KEY not in record.getMessage() for record in caplog.records)


# --- the secret -------------------------------------------------------------------------------

def test_app_refuses_to_start_without_a_secret():
    with pytest.raises(SettingsError, match="FANOUT_TOKEN_SECRET"):
        create_app(PublisherSettings(api_keys=[API_KEY]))
    with pytest.raises(SettingsError, match="at least"):
        create_app(PublisherSettings(api_keys=[API_KEY], token_secret="short"))


def test_dev_mode_generates_a_secret_with_a_loud_warning(caplog):
    with caplog.at_level(logging.WARNING):
        settings = settings_from_env({"FANOUT_DEV": "1", "FANOUT_API_KEYS": "a,b"})
    assert len(settings.token_secret) >= 32
    assert settings.api_keys == ["a", "b"]
    assert any("NOT verify on any other publisher" in r.getMessage() for r in caplog.records)
    assert settings_from_env({"FANOUT_DEV": "1"}).token_secret != settings.token_secret
