"""One worker, one upstreams file: OpenAI, a second OpenAI-compatible server, Azure, Vertex (Gemini and
Claude) and Bedrock (invoke and Converse) on real sockets, each stream equal to its golden; auth checked by
the fake cloud (Azure api-key, Google tokens from a real google-auth exchange, SigV4 verified by botocore,
a Bedrock API key); no secret in Redis, the logs or the errors."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from schema.contract import StreamError, decode_event
from schema.job import Job
from schema.keys import Keys
from schema.upstreams import Upstreams
from schema.upstreams_file import parse_upstreams
from schema.validate import validate
from tests.worker.cloud_support import (
    AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY,
    AZURE_KEY,
    BEDROCK_API_KEY,
    OPENAI_KEY,
    SECRETS,
    fake_cloud,
    new_key,
    public_pem,
    write_service_account,
)
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
from tools.fake_cloud import CloudConfig, CloudState
from tools.replay import replay_file
from tools.upstream import DEFAULT_ROOTS, ServerConfig
from worker.upstream import Credentials

pytestmark = pytest.mark.topologies

TRANSCRIPTS = DEFAULT_ROOTS[0]
ANTHROPIC_REQUEST = {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
CONVERSE_REQUEST = {"messages": [{"role": "user", "content": [{"text": "hi"}]}]}
GEMINI_REQUEST = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
PROFILE = "arn:aws:bedrock:us-east-1:123456789012:inference-profile"


def upstreams_file(openai: str, vllm: str, cloud: str) -> str:
    vertex = f"{cloud}/v1/projects/fake-project/locations/us-central1"
    return f"""
[endpoints.openai]
api = ["openai_chat", "openai_responses"]
url = "{openai}/v1"
auth = "bearer"
secret_env = "OPENAI_API_KEY"

[endpoints.vllm]
api = "openai_chat"
url = "{vllm}/v1"
auth = "none"

[endpoints.azure-east]
api = ["openai_chat", "openai_responses"]
platform = "azure"
url = "{cloud}/openai/v1"
auth = "api-key"
secret_env = "AZURE_OPENAI_KEY"

[endpoints.vertex]
api = ["gemini", "anthropic"]
platform = "vertex"
url = "{vertex}"
auth = "google"

[endpoints.vertex-array]
api = "gemini"
platform = "vertex"
url = "{vertex}"
auth = "google"
framing = "json_array"

[endpoints.bedrock]
api = ["anthropic", "bedrock_converse"]
platform = "bedrock"
url = "{cloud}"
region = "us-east-1"
auth = "aws"

[endpoints.bedrock-key]
api = "anthropic"
platform = "bedrock"
url = "{cloud}"
region = "us-east-1"
auth = "aws"
secret_env = "BEDROCK_API_KEY"

[models."claude-on-bedrock"]
endpoints = ["bedrock"]
upstream_model = {{ bedrock = "text_metrics_on_message_stop" }}
"""


def golden(path: Path) -> list[dict[str, Any]]:
    """``<case>.events.jsonl`` beside the body, else its offline replay (as the transcript tests do)."""
    expected = path.parent / f"{path.name.split('.')[0]}.events.jsonl"
    if expected.exists():
        lines = [line for line in expected.read_bytes().split(b"\n") if line]
        return strip_volatile([e for e in map(decode_event, lines) if e is not None])
    return strip_volatile(replay_file(path)[0])


def cases(directory: str, suffix: str) -> list[Path]:
    return sorted((TRANSCRIPTS / directory).glob(f"*{suffix}"))


PLAN: list[tuple[str, str, str, dict[str, Any], Path]] = [
    ("openai", "openai_chat", "arguments_before_name", {}, TRANSCRIPTS / "openai_chat/arguments_before_name.sse"),
    ("vllm", "openai_chat", "content_after_finish_reason_continues", {},
     TRANSCRIPTS / "openai_chat/content_after_finish_reason_continues.sse"),
    *[("azure-east", "openai_chat", p.stem, {}, p) for p in cases("openai_chat", ".sse")
      if p.stem.startswith("azure")],
    *[("azure-east", "openai_responses", p.stem, {"input": "hi"}, p) for p in cases("openai_responses", ".sse")
      if p.stem.startswith("azure")],
    *[("vertex", "gemini", p.stem, GEMINI_REQUEST, p) for p in cases("gemini_sse", ".sse")
      if p.stem.startswith("vertex")],
    ("vertex-array", "gemini", "array_closed_without_finish_reason", GEMINI_REQUEST,
     TRANSCRIPTS / "gemini_json_array/array_closed_without_finish_reason.sse"),
    ("vertex", "anthropic", "thinking_with_signature", ANTHROPIC_REQUEST,
     TRANSCRIPTS / "anthropic/thinking_with_signature.sse"),
    *[("bedrock", "anthropic", p.stem, ANTHROPIC_REQUEST, p) for p in cases("bedrock_invoke", ".eventstream")],
    *[("bedrock", "bedrock_converse", p.stem, CONVERSE_REQUEST, p) for p in cases("bedrock_converse", ".eventstream")],
    ("bedrock-key", "anthropic", "text_metrics_on_message_stop", ANTHROPIC_REQUEST,
     TRANSCRIPTS / "bedrock_invoke/text_metrics_on_message_stop.eventstream"),
    # an inference-profile ARN: its '/' goes percent-encoded into the path the signature covers
    ("bedrock", "anthropic", f"{PROFILE}/tool_use_metrics_on_message_delta", ANTHROPIC_REQUEST,
     TRANSCRIPTS / "bedrock_invoke/tool_use_metrics_on_message_delta.eventstream"),
]
"""(endpoint, provider, case, request, transcript) of each job the one worker serves."""


@pytest.fixture
def cloud_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """AWS test credentials and a service account in the process environment (what google-auth and botocore read)."""
    key = new_key()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET_ACCESS_KEY)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return {"key": key, "account": tmp_path / "service-account.json", "monkeypatch": monkeypatch}


def answered_by(stored: list[Any], endpoint: str, sent_model: str) -> list[dict[str, Any]]:
    """The events without their volatile fields, once the terminal's ``endpoint`` (contract 1.1) is checked.

    A ``stream.done`` whose provider named no model names the model sent (``sent_model``);
    it reads as the golden's ``None`` here.
    """
    assert stored[-1].endpoint == endpoint
    events = [{k: v for k, v in event.items() if k != "endpoint"} for event in strip_volatile(stored)]
    for event in events:
        if event["type"] == "stream.done" and event["model"] == sent_model:
            event["model"] = None
    return events


def cloud_config(env: dict[str, Any]) -> CloudConfig:
    return CloudConfig(azure_key=AZURE_KEY, google_public_key_pem=public_pem(env["key"]),
                       aws_access_key_id=AWS_ACCESS_KEY_ID, aws_secret_access_key=AWS_SECRET_ACCESS_KEY,
                       bedrock_api_key=BEDROCK_API_KEY, token_ttl_s=env.get("token_ttl_s", 3600))


def credentials() -> Credentials:
    return Credentials(environ={"OPENAI_API_KEY": OPENAI_KEY, "AZURE_OPENAI_KEY": AZURE_KEY,
                                "BEDROCK_API_KEY": BEDROCK_API_KEY})


async def run_jobs(env: dict[str, Any], redis_url: str, keys: Keys, redis: aioredis.Redis,  # noqa: PLR0917
                   jobs: list[Job], text: Any = upstreams_file) -> tuple[CloudState, list[list[Any]], list[str]]:
    """Serve ``jobs`` with one worker over the fake providers; return the cloud state, events, upstream paths."""
    async with fake_upstream(ServerConfig(chunk_bytes=29, delay_ms=0)) as (openai, _), \
            fake_upstream(ServerConfig(chunk_bytes=31, delay_ms=0)) as (vllm, _), \
            fake_cloud(cloud_config(env)) as (cloud, state):
        write_service_account(env["account"], env["key"], f"{cloud}/token")
        env["monkeypatch"].setenv("GOOGLE_APPLICATION_CREDENTIALS", str(env["account"]))
        upstreams: Upstreams = parse_upstreams(text(openai, vllm, cloud), "upstreams.toml")
        settings = settings_for(openai, redis_url, keys, max_retries=0, concurrency=16)
        async with running_worker(settings, keys, credentials=credentials(), upstreams=upstreams):
            for job in jobs:
                await submit(redis, keys, job)
            for job in jobs:
                await wait_done(redis, keys, job.stream_id)
        paths = [r["path"] for r in await recorded(openai)] + [r["path"] for r in await recorded(vllm)]
    events = [await stored_events(redis, keys, job.stream_id) for job in jobs]
    return state, events, paths


async def test_one_worker_serves_every_cloud_from_one_upstreams_file(
        cloud_env: dict[str, Any], redis_url: str, keys: Keys, redis_client: aioredis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    jobs = [make_job(provider, case, endpoint=endpoint, request=request)
            for endpoint, provider, case, request, _ in PLAN]
    state, events, paths = await run_jobs(cloud_env, redis_url, keys, redis_client, jobs)
    for (endpoint, _provider, case, _request, path), stored in zip(PLAN, events, strict=True):
        assert answered_by(stored, endpoint, case) == golden(path), (endpoint, case)
        assert validate(stored) == [], (endpoint, case)
    verdicts = {(r["path"].split("/")[1], r["auth"]) for r in state.requests}
    assert verdicts == {("openai", "api-key"), ("v1", "google"), ("model", "sigv4"), ("model", "api-key")}
    assert state.token_requests == 1  # one refresh, under the lock, for every concurrent Vertex job
    assert sorted(paths) == ["/v1/chat/completions"] * 2
    signed = {r["path"] for r in state.requests if r["auth"] == "sigv4"}
    assert f"/model/{PROFILE}%2Ftool_use_metrics_on_message_delta/invoke-with-response-stream" in signed
    await assert_no_secret(redis_client, keys, caplog.text, state)


async def test_a_route_sends_its_upstream_model_to_its_endpoint(
        cloud_env: dict[str, Any], redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    job = make_job("anthropic", "claude-on-bedrock", request=ANTHROPIC_REQUEST)
    state, (stored,), _ = await run_jobs(cloud_env, redis_url, keys, redis_client, [job])
    assert state.requests[0]["path"] == "/model/text_metrics_on_message_stop/invoke-with-response-stream"
    expected = golden(TRANSCRIPTS / "bedrock_invoke/text_metrics_on_message_stop.eventstream")
    assert answered_by(stored, "bedrock", "text_metrics_on_message_stop") == expected


async def test_a_google_token_inside_the_refresh_margin_is_refreshed_before_use(
        cloud_env: dict[str, Any], redis_url: str, keys: Keys, redis_client: aioredis.Redis) -> None:
    # google-auth calls a token expired 3 min 45 s before its end: a 200 s token is refreshed for each job
    cloud_env["token_ttl_s"] = 200
    cloud_env["monkeypatch"].setenv("GOOGLE_CLOUD_QUOTA_PROJECT", "fake-quota-project")
    jobs = [make_job("gemini", "vertex_jailbreak_block_reason", endpoint="vertex", request=GEMINI_REQUEST)
            for _ in range(3)]
    state, events, _ = await run_jobs(cloud_env, redis_url, keys, redis_client, jobs)
    assert state.token_requests == 3
    assert [r["auth"] for r in state.requests] == ["google"] * 3
    assert {r["headers"].get("x-goog-user-project") for r in state.requests} == {"fake-quota-project"}
    expected = golden(TRANSCRIPTS / "gemini_sse/vertex_jailbreak_block_reason.sse")
    assert all(answered_by(stored, "vertex", "vertex_jailbreak_block_reason") == expected for stored in events)


def wrong_keys(openai: str, vllm: str, cloud: str) -> str:
    return upstreams_file(openai, vllm, cloud).replace('secret_env = "AZURE_OPENAI_KEY"',
                                                       'secret_env = "WRONG_AZURE_KEY"')


async def test_a_refused_credential_ends_authentication_without_the_secret(
        cloud_env: dict[str, Any], redis_url: str, keys: Keys, redis_client: aioredis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    cloud_env["monkeypatch"].setenv("AWS_SECRET_ACCESS_KEY", "a-wrong-aws-secret-key-000000000000")
    jobs = [make_job("openai_chat", "azure_empty_first_chunk", endpoint="azure-east"),
            make_job("anthropic", "text_metrics_on_message_stop", endpoint="bedrock", request=ANTHROPIC_REQUEST)]
    state, events, _ = await run_jobs(cloud_env, redis_url, keys, redis_client, jobs, wrong_keys)
    azure, bedrock = (stored[-1] for stored in events)
    assert isinstance(azure, StreamError)
    assert isinstance(bedrock, StreamError)
    assert azure.error.category == "authentication"
    assert azure.error.message == ("provider answered HTTP 401: Access denied due to invalid subscription key or "
                                   "wrong API endpoint.")
    assert (bedrock.error.category, bedrock.error.provider_code) == ("permission", "InvalidSignatureException")
    assert sorted(r["auth"] for r in state.requests) == ["refused", "refused-signature"]
    await assert_no_secret(redis_client, keys, caplog.text, state)


async def assert_no_secret(redis: aioredis.Redis, keys: Keys, log_text: str, state: CloudState) -> None:
    """No secret (nor an issued access token) in any Redis value under the test's prefix, nor in the logs."""
    stored = b""
    async for key in redis.scan_iter(match=f"{keys.prefix}*"):
        kind = (await redis.type(key)).decode()
        if kind == "stream":
            stored += repr(await redis.xrange(key)).encode()
        elif kind == "hash":
            stored += repr(await redis.hgetall(key)).encode()
        elif kind == "string":
            stored += await redis.get(key) or b""
    assert stored, "nothing stored: the check would pass vacuously"
    for secret in (*SECRETS, *state.tokens):
        assert secret.encode() not in stored, "a secret reached Redis"
        assert secret not in log_text, "a secret reached the logs"
