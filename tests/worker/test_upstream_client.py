"""The upstream client: request shapes, HTTP error mapping, and the retry rules, on real sockets."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
import redis.asyncio as aioredis

from schema.contract import BlockDelta, StreamDone, StreamError, StreamStart
from schema.errors import FanoutError, UpstreamHTTPError, UpstreamProtocolError
from schema.keys import Keys
from tests.worker.support import (
    fake_upstream,
    make_job,
    recorded,
    running_worker,
    settings_for,
    stored_events,
    strip_volatile,
    submit,
    wait_done,
)
from tools.replay import replay_file
from tools.upstream import DEFAULT_ROOTS, ServerConfig, fingerprint
from worker.settings import WorkerSettings
from worker.upstream import (
    Credentials,
    UpstreamTransportError,
    build_request,
    credentials_from_env,
    new_session,
    open_stream,
    read_chunk,
)
from worker.upstream_errors import http_error, parse_retry_after

KEYS = Credentials(openai="sk-live-abcdefgh12345678", anthropic="sk-ant-secret-0001",
                   gemini="AIzaSySecretSecretSecret00")


async def _open_error(base: str, provider: str, model: str, **settings: Any) -> UpstreamHTTPError:
    config = WorkerSettings(openai_base_url=f"{base}/v1", anthropic_base_url=base, gemini_base_url=base, **settings)
    request = build_request(make_job(provider, model), config, KEYS)
    async with new_session(config) as session:
        with pytest.raises(UpstreamHTTPError) as caught:
            await open_stream(session, request)
    return caught.value


EXPECTED_SHAPES = {
    "openai_chat": ("/v1/chat/completions", {}, {"authorization"},
                    {"model": "m1", "stream": True, "stream_options": {"include_usage": True}}),
    "openai_responses": ("/v1/responses", {}, {"authorization"}, {"model": "m1", "stream": True}),
    "anthropic": ("/v1/messages", {}, {"x-api-key", "anthropic-version"}, {"model": "m1", "stream": True}),
    "gemini": ("/v1beta/models/m1:streamGenerateContent", {"alt": "sse"}, {"x-goog-api-key"}, {}),
}


@pytest.mark.parametrize("provider", sorted(EXPECTED_SHAPES))
async def test_request_shape_per_provider(provider: str) -> None:
    path, query, auth_names, switches = EXPECTED_SHAPES[provider]
    native = {"messages": [{"role": "user", "content": "secret prompt"}], "max_tokens": 5, "stream": False}
    async with fake_upstream() as (base, _state):
        config = WorkerSettings(openai_base_url=f"{base}/v1", anthropic_base_url=base, gemini_base_url=base)
        request = build_request(make_job(provider, "m1", request=native), config, KEYS)
        async with new_session(config) as session:
            with pytest.raises(UpstreamHTTPError):  # m1 is no transcript: the fake answers 404
                await open_stream(session, request)
        (seen,) = await recorded(base)
    headers = {k.lower(): v for k, v in seen["headers"].items()}
    assert (seen["method"], seen["path"], seen["query"]) == ("POST", path, query)
    assert seen["auth_present"] is True
    assert auth_names <= set(headers)
    assert all(headers[name] == "***" for name in auth_names - {"anthropic-version"})
    assert headers["accept"] == "text/event-stream"
    assert headers["accept-encoding"] == "identity"
    assert headers["content-type"] == "application/json"
    if provider == "anthropic":
        assert headers["anthropic-version"] == "2023-06-01"
    expected_secret = {"openai_chat": ("authorization", f"Bearer {KEYS.key('openai')}"),
                       "openai_responses": ("authorization", f"Bearer {KEYS.key('openai')}"),
                       "anthropic": ("x-api-key", KEYS.key("anthropic")),
                       "gemini": ("x-goog-api-key", KEYS.key("gemini"))}[provider]
    assert seen["auth_fingerprints"] == {expected_secret[0]: fingerprint(expected_secret[1])}
    body = seen["body"]
    assert body["messages"] == native["messages"]
    if provider == "gemini":
        assert "model" not in body
        assert "stream" not in body
    else:
        assert {k: body[k] for k in switches} == switches
    assert "sk-live" not in repr(request)
    assert "sk-live" not in repr(KEYS)


async def test_gemini_json_array_request_has_no_alt_and_accepts_json() -> None:
    async with fake_upstream() as (base, _state):
        config = WorkerSettings(gemini_base_url=base, gemini_framing="json_array")
        request = build_request(make_job("gemini", "simple_text"), config, KEYS)
        assert request.framing == "json_array"
        async with new_session(config) as session:
            response = await open_stream(session, request)
            body = b""
            while chunk := await read_chunk(response):
                body += chunk
            response.release()
        (seen,) = await recorded(base)
    assert seen["query"] == {}
    assert seen["headers"]["Accept"] == "application/json"
    assert body.lstrip().startswith(b"[")


async def test_missing_key_sends_no_credential() -> None:
    async with fake_upstream() as (base, _state):
        config = WorkerSettings(openai_base_url=f"{base}/v1")
        request = build_request(make_job("openai_chat", "m1"), config, Credentials())
        async with new_session(config) as session:
            with pytest.raises(UpstreamHTTPError):
                await open_stream(session, request)
        (seen,) = await recorded(base)
    assert seen["auth_present"] is False


async def test_http_429_maps_rate_limited_with_retry_after() -> None:
    async with fake_upstream() as (base, _state):
        error = await _open_error(base, "openai_chat", "status-429")
    assert (error.status, error.category, error.retryable) == (429, "rate_limited", True)
    assert error.retry_after_s == 1.0
    assert error.provider_code == "rate_limit_exceeded"


STATUS_CASES = [
    (429, "rate_limited", True), (500, "upstream_error", True), (502, "upstream_error", True),
    (504, "upstream_error", True), (503, "upstream_overloaded", True), (529, "upstream_overloaded", True),
    (401, "authentication", False), (403, "permission", False), (404, "not_found", False),
    (400, "invalid_request", False), (422, "invalid_request", False),
]
PROVIDER_CODES = {
    "anthropic": {429: "rate_limit_error", 529: "overloaded_error", 401: "authentication_error",
                  403: "permission_error", 404: "not_found_error", 400: "invalid_request_error", 500: "api_error"},
    "gemini": {429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
               404: "NOT_FOUND", 400: "INVALID_ARGUMENT", 500: "INTERNAL", 504: "DEADLINE_EXCEEDED"},
    "openai_chat": {500: "server_error", 400: "invalid_request_error", 429: "rate_limit_exceeded"},
}


@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses", "anthropic", "gemini"])
@pytest.mark.parametrize(("status", "category", "retryable"), STATUS_CASES)
async def test_each_status_maps_category(provider: str, status: int, category: str, retryable: bool) -> None:
    async with fake_upstream() as (base, _state):
        error = await _open_error(base, provider, f"status-{status}")
    assert (error.status, error.category, error.retryable) == (status, category, retryable)
    assert error.message.startswith(f"provider answered HTTP {status}")
    expected_code = PROVIDER_CODES.get(provider, {}).get(status)
    if expected_code:
        assert error.provider_code == expected_code


@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses", "anthropic", "gemini"])
async def test_context_too_long_400_maps_context_length_exceeded(provider: str) -> None:
    async with fake_upstream() as (base, _state):
        error = await _open_error(base, provider, "context-too-long")
    assert (error.status, error.category, error.retryable) == (400, "context_length_exceeded", False)


def test_error_body_codes_and_context_detection() -> None:
    openai = b'{"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}'
    assert http_error("openai_chat", 400, {}, openai).category == "context_length_exceeded"
    assert http_error("openai_chat", 400, {}, openai).provider_code == "context_length_exceeded"
    plain = b'{"error":{"message":"bad","type":"invalid_request_error","code":null}}'
    assert http_error("openai_responses", 400, {}, plain).provider_code == "invalid_request_error"
    gemini = b'[{"error":{"code":400,"message":"The input token count (9) exceeds the maximum number of tokens '
    gemini += b'allowed (8).","status":"INVALID_ARGUMENT"}}]'
    error = http_error("gemini", 400, {}, gemini)
    assert (error.category, error.provider_code) == ("context_length_exceeded", "INVALID_ARGUMENT")
    assert http_error("anthropic", 503, {}, b"<html>busy</html>").category == "upstream_overloaded"
    assert http_error("openai_chat", 418, {}, b"").category == "invalid_request"
    assert http_error("openai_chat", 599, {}, b"").retryable is True


def test_retry_after_seconds_date_and_ms() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after({"Retry-After": "7"}, now=now) == 7.0
    assert parse_retry_after({"retry-after": "Thu, 01 Jan 2026 12:00:30 GMT"}, now=now) == 30.0
    assert parse_retry_after({"Retry-After": "Thu, 01 Jan 2026 11:00:00 GMT"}, now=now) == 0.0
    assert parse_retry_after({"retry-after-ms": "250", "Retry-After": "9"}, now=now) == 0.25
    assert parse_retry_after({"Retry-After": "soon"}, now=now) is None
    assert parse_retry_after({}, now=now) is None


async def test_connection_refused_is_transport_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    config = WorkerSettings(openai_base_url=f"http://127.0.0.1:{port}/v1")
    async with new_session(config) as session:
        with pytest.raises(UpstreamTransportError) as caught:
            await open_stream(session, build_request(make_job("openai_chat", "m"), config, KEYS))
    assert (caught.value.category, caught.value.retryable) == ("transport", True)
    assert "127.0.0.1" not in caught.value.message


# -- retries through the worker ------------------------------------------------------------------


async def test_retry_before_first_delta_only(redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys, max_retries=2), keys):
            job = make_job("openai_chat", "fail2-simple_text_cyrillic_usage_chunk")
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
        requests = await recorded(base)
    assert len(requests) == 3  # two 503s, then the stream
    events = await stored_events(redis_client, keys, job.stream_id)
    assert sum(isinstance(e, StreamStart) for e in events) == 1  # the retry did not repeat stream.start
    golden, _ = replay_file(DEFAULT_ROOTS[1] / "openai_chat" / "simple_text_cyrillic_usage_chunk.sse")
    assert strip_volatile(events) == strip_volatile(golden)
    assert isinstance(events[-1], StreamDone)


async def test_no_retry_after_output_stored(redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys, max_retries=2), keys):
            job = make_job("openai_chat", "connection_dropped_mid_line")
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
        requests = await recorded(base)
    assert len(requests) == 1
    events = await stored_events(redis_client, keys, job.stream_id)
    assert any(isinstance(e, BlockDelta) for e in events)
    last = events[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category, last.error.retryable) == ("interrupted", "transport", True)


async def test_in_body_error_before_output_is_retried(redis_url: str, keys: Keys,
                                                      redis_client: aioredis.Redis) -> None:
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys, max_retries=1), keys):
            job = make_job("anthropic", "error_before_message_start")
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
        requests = await recorded(base)
    assert len(requests) == 2
    events = await stored_events(redis_client, keys, job.stream_id)
    assert [type(e).__name__ for e in events] == ["StreamStart", "StreamError"]
    assert [e.seq for e in events] == [1, 2]


async def test_retries_are_bounded_and_last_error_stored(redis_url: str, keys: Keys,
                                                         redis_client: aioredis.Redis) -> None:
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys, max_retries=2), keys):
            job = make_job("gemini", "status-503")
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
        requests = await recorded(base)
    assert len(requests) == 3
    events = await stored_events(redis_client, keys, job.stream_id)
    assert [e.seq for e in events] == [1, 2]
    last = events[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category, last.error.provider_code) == ("failed", "upstream_overloaded",
                                                                            "UNAVAILABLE")


async def test_non_retryable_status_is_not_retried(redis_url: str, keys: Keys,
                                                   redis_client: aioredis.Redis) -> None:
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys, max_retries=2), keys):
            job = make_job("openai_responses", "status-400")
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
        assert len(await recorded(base)) == 1


async def test_retry_honours_retry_after_up_to_the_cap(redis_url: str, keys: Keys,
                                                       redis_client: aioredis.Redis) -> None:
    # The fake answers 429 with Retry-After: 1; the cap (0.3 s) is what the worker waits, and the
    # jittered backoff alone would wait at most backoff_max_s (0.01 s).
    async with fake_upstream() as (base, _state):
        settings = settings_for(base, redis_url, keys, max_retries=1, retry_after_max_s=0.3, backoff_max_s=0.01)
        async with running_worker(settings, keys):
            job = make_job("anthropic", "status-429")
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
        first, second = await recorded(base)
    assert second["received_s"] - first["received_s"] >= 0.3


async def test_fake_upstream_serves_case_after_failures(redis_url: str) -> None:
    async with fake_upstream(ServerConfig(delay_ms=0)) as (base, state):
        config = WorkerSettings(anthropic_base_url=base)
        request = build_request(make_job("anthropic", "fail1-simple_text_ping_and_padding"), config, KEYS)
        async with new_session(config) as session:
            with pytest.raises(UpstreamHTTPError):
                await open_stream(session, request)
            response = await open_stream(session, request)
            assert response.status == 200
            response.close()
        assert state.seen["fail1-simple_text_ping_and_padding"] == 2


def test_credentials_come_from_the_environment_and_never_show() -> None:
    credentials = credentials_from_env({"OPENAI_API_KEY": "sk-abc12345678", "GEMINI_API_KEY": "AIzaXYZ"})
    assert credentials.key("openai") == "sk-abc12345678"
    assert credentials.key("anthropic") == ""
    assert repr(credentials) == "Credentials(openai=set, anthropic=unset, gemini=set)"


# -- bodies the worker refuses ----------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai_chat", "anthropic", "gemini"])
async def test_compressed_stream_is_refused_failed_protocol_and_not_retried(
        provider: str, redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    case = {"openai_chat": "simple_text_cyrillic_usage_chunk", "anthropic": "simple_text_ping_and_padding",
            "gemini": "simple_text_crlf"}[provider]
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys, max_retries=2), keys):
            job = make_job(provider, f"gzip-{case}")
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
        requests = await recorded(base)
    assert len(requests) == 1
    assert requests[0]["headers"]["Accept-Encoding"] == "identity"
    events = await stored_events(redis_client, keys, job.stream_id)
    assert [type(e).__name__ for e in events] == ["StreamStart", "StreamError"]
    last = events[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category, last.error.retryable) == ("failed", "protocol", False)
    assert "Content-Encoding: gzip" in last.error.message
    assert "not to compress" in last.error.message


async def test_open_stream_refuses_any_encoding_but_identity() -> None:
    async with fake_upstream() as (base, _state):
        config = WorkerSettings(anthropic_base_url=base)
        request = build_request(make_job("anthropic", "gzip-simple_text_ping_and_padding"), config, KEYS)
        async with new_session(config) as session:
            with pytest.raises(UpstreamProtocolError) as caught:
                await open_stream(session, request)
    assert caught.value.category == "protocol"
    assert "Content-Encoding: gzip" in caught.value.message


async def test_compressed_error_body_is_never_decompressed() -> None:
    # Were the session decompressing, the provider's message would be read out of the body.
    async with fake_upstream() as (base, _state):
        error = await _open_error(base, "anthropic", "gzip-status-403")
    assert (error.status, error.category, error.retryable) == (403, "permission", False)
    assert error.message == "provider answered HTTP 403"
    assert error.provider_code is None


@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses", "anthropic", "gemini"])
async def test_random_bytes_body_is_failed_protocol_and_not_retried(
        provider: str, redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys, max_retries=2), keys):
            job = make_job(provider, "garbage")
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
        requests = await recorded(base)
    assert len(requests) == 1
    last = (await stored_events(redis_client, keys, job.stream_id))[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category, last.error.retryable) == ("failed", "protocol", False)
    assert last.error.message.startswith("upstream body is not an SSE stream: it is not UTF-8 text")


async def test_random_bytes_json_array_body_is_failed_protocol_and_not_retried(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async with fake_upstream() as (base, _state):
        settings = settings_for(base, redis_url, keys, max_retries=2, gemini_framing="json_array")
        async with running_worker(settings, keys):
            job = make_job("gemini", "garbage")
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
        requests = await recorded(base)
    assert len(requests) == 1
    last = (await stored_events(redis_client, keys, job.stream_id))[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category, last.error.retryable) == ("failed", "protocol", False)
    assert last.error.message == "malformed JSON array: expected '[' before '[', got b'V' at byte 0"


@pytest.mark.parametrize("options", ["x", [1, 2], 5])
def test_build_request_refuses_a_chat_stream_options_that_is_not_an_object(options: object) -> None:
    job = make_job("openai_chat", "m1", request={"messages": [], "stream_options": options})
    with pytest.raises(FanoutError) as caught:
        build_request(job, WorkerSettings(), KEYS)
    assert (caught.value.category, caught.value.retryable) == ("invalid_request", False)
    assert "request.stream_options must be a JSON object" in caught.value.message


def test_build_request_keeps_the_callers_stream_options_and_adds_usage() -> None:
    job = make_job("openai_chat", "m1", request={"messages": [], "stream_options": {"include_obfuscation": False}})
    body = msgspec.json.decode(build_request(job, WorkerSettings(), KEYS).body)
    assert body["stream_options"] == {"include_obfuscation": False, "include_usage": True}


async def test_job_with_a_bad_stream_options_ends_invalid_request_without_calling_the_provider(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys, max_retries=2), keys):
            job = make_job("openai_chat", "simple_text_cyrillic_usage_chunk",
                           request={"messages": [], "stream_options": [1, 2]})
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
        assert await recorded(base) == []
    events = await stored_events(redis_client, keys, job.stream_id)
    assert [type(e).__name__ for e in events] == ["StreamStart", "StreamError"]
    last = events[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category, last.error.retryable) == ("failed", "invalid_request", False)
    assert "request.stream_options" in last.error.message


async def test_bedrock_converse_job_ends_invalid_request_without_calling_any_provider(
        redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    # The adapter exists; no worker route does until Bedrock endpoints are configured.
    async with fake_upstream() as (base, _state):
        async with running_worker(settings_for(base, redis_url, keys, max_retries=2), keys):
            job = make_job("bedrock_converse", "anthropic.claude-sonnet-4-5",
                           request={"messages": [{"role": "user", "content": [{"text": "hi"}]}]})
            await submit(redis_client, keys, job)
            await wait_done(redis_client, keys, job.stream_id)
        assert await recorded(base) == []
    events = await stored_events(redis_client, keys, job.stream_id)
    last = events[-1]
    assert isinstance(last, StreamError)
    assert (last.status, last.error.category, last.error.retryable) == ("failed", "invalid_request", False)
    assert last.error.message == ("no endpoint serves this job: no endpoint serves provider 'bedrock_converse' "
                                  "without an upstreams file (FANOUT_UPSTREAMS_FILE); endpoints: openai, anthropic, "
                                  "gemini; routes: none")
