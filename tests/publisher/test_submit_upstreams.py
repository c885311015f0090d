"""POST /v1/streams with an upstreams file: ``endpoint`` and routes checked, 400 naming provider and endpoint."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from publisher.api.validation import Submission
from schema.job import job_decoder
from schema.keys import JOB_FIELD
from schema.upstreams_file import parse_upstreams
from tests.publisher.helpers import API_KEY, bearer

pytestmark = pytest.mark.topologies

FILE = """
[endpoints.vllm]
api = "openai_chat"
url = "http://127.0.0.1:9/v1"
auth = "none"

[endpoints.claude]
api = "anthropic"
url = "http://127.0.0.1:9"
auth = "x-api-key"
secret_env = "ANTHROPIC_API_KEY"

[models."gpt-4o"]
endpoints = ["vllm"]
"""
UPSTREAMS = parse_upstreams(FILE, "upstreams.toml")
REQUEST = {"messages": [{"role": "user", "content": "hi"}]}


async def post(ctx, server, body):
    async with ctx.http.post(server.url("/v1/streams"), json=body, headers=bearer(API_KEY)) as resp:
        return resp.status, await resp.json()


async def test_a_named_endpoint_is_carried_by_the_job(ctx):
    server = await ctx.start_app(upstreams=UPSTREAMS)
    status, answer = await post(ctx, server, {"provider": "openai_chat", "model": "llama", "endpoint": "vllm",
                                              "request": REQUEST})
    assert status == 201
    entries = await ctx.redis.xrange(ctx.keys.jobs_shard(0))
    job = job_decoder.decode(entries[-1][1][JOB_FIELD])
    assert (job.stream_id, job.endpoint, job.model) == (answer["stream_id"], "vllm", "llama")


async def test_a_model_matching_a_route_needs_no_endpoint(ctx):
    server = await ctx.start_app(upstreams=UPSTREAMS)
    status, _ = await post(ctx, server, {"provider": "openai_chat", "model": "gpt-4o", "request": REQUEST})
    assert status == 201


async def test_a_provider_the_endpoint_does_not_speak_is_400_naming_both(ctx):
    server = await ctx.start_app(upstreams=UPSTREAMS)
    status, problem = await post(ctx, server, {"provider": "gemini", "model": "m", "endpoint": "claude",
                                               "request": REQUEST})
    assert status == 400
    assert problem["errors"] == [{"field": "endpoint", "detail":
                                  "provider 'gemini' is not spoken by endpoint 'claude', which speaks anthropic"}]
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 0


async def test_an_unknown_endpoint_is_400_listing_the_known_ones(ctx):
    server = await ctx.start_app(upstreams=UPSTREAMS)
    status, problem = await post(ctx, server, {"provider": "openai_chat", "model": "m", "endpoint": "nope",
                                               "request": REQUEST})
    assert status == 400
    assert problem["errors"][0]["detail"] == "unknown endpoint 'nope'; endpoints: vllm, claude; routes: gpt-4o"


async def test_with_a_file_a_model_that_is_no_route_and_no_endpoint_is_400(ctx):
    server = await ctx.start_app(upstreams=UPSTREAMS)
    status, problem = await post(ctx, server, {"provider": "openai_chat", "model": "other", "request": REQUEST})
    assert status == 400
    assert problem["errors"][0]["field"] == "model"
    assert "'other' is not a route" in problem["errors"][0]["detail"]


async def test_a_malformed_endpoint_name_is_an_invalid_field(ctx):
    status, problem = await post(ctx, ctx.server, {"provider": "openai_chat", "model": "m", "endpoint": "a b",
                                                   "request": REQUEST})
    assert status == 400
    assert problem["errors"][0]["field"] == "endpoint"


async def test_without_a_file_todays_jobs_are_accepted(ctx):
    status, _ = await post(ctx, ctx.server, {"provider": "anthropic", "model": "claude-x", "request": REQUEST})
    assert status == 201


def test_the_body_hash_of_a_job_without_endpoint_is_unchanged() -> None:
    sub = Submission(provider="openai_chat", model="m", request=REQUEST, metadata={"a": 1})
    # what the hash was before endpoints: the Struct's fields, stream_id null, keys sorted
    before = {"provider": "openai_chat", "model": "m", "request": REQUEST, "stream_id": None, "metadata": {"a": 1},
              "reasoning_visibility": "public"}
    assert sub.body_hash() == hashlib.sha256(msgspec.json.encode(before, order="sorted")).hexdigest()
    assert msgspec.structs.replace(sub, endpoint="vllm").body_hash() != sub.body_hash()
