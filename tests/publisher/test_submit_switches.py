"""POST /v1/streams refuses a ``request.model`` or ``request.stream`` the worker would silently override."""

from __future__ import annotations

import pytest

from publisher.api.validation import MODEL_IN_REQUEST
from tests.publisher.helpers import API_KEY, bearer

BODY = {"provider": "openai_chat", "model": "gpt-x", "request": {"messages": [{"role": "user", "content": "hi"}]}}
INVALID_FIELD = "https://fanout.dev/problems/invalid-field"


async def post(ctx, body):
    async with ctx.http.post(ctx.server.url("/v1/streams"), json=body, headers=bearer(API_KEY)) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses", "anthropic", "gemini"])
async def test_a_request_model_that_disagrees_with_model_is_400_naming_request_model(ctx, provider):
    body = {**BODY, "provider": provider, "request": {"messages": [], "model": "gpt-y"}}
    status, problem = await post(ctx, body)
    assert status == 400
    assert problem["type"] == INVALID_FIELD
    (error,) = problem["errors"]
    assert error["field"] == "request.model"
    assert '"gpt-y" disagrees with the top-level model "gpt-x"' in error["detail"]
    assert "request.model" in problem["detail"]
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 0


async def test_a_request_model_equal_to_model_is_accepted(ctx):
    status, _ = await post(ctx, {**BODY, "request": {"messages": [], "model": "gpt-x"}})
    assert status == 201
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 1


@pytest.mark.parametrize("value", [False, None, "yes", 1])
async def test_a_request_stream_other_than_true_is_400_naming_request_stream(ctx, value):
    status, problem = await post(ctx, {**BODY, "request": {"messages": [], "stream": value}})
    assert status == 400
    (error,) = problem["errors"]
    assert error["field"] == "request.stream"
    assert "fanout always streams" in error["detail"]
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 0


async def test_request_stream_true_is_accepted(ctx):
    status, _ = await post(ctx, {**BODY, "request": {"messages": [], "stream": True}})
    assert status == 201


async def test_request_model_without_a_top_level_model_says_where_model_goes(ctx):
    body = {"provider": "anthropic", "request": {"model": "claude-x", "messages": []}}
    status, problem = await post(ctx, body)
    assert status == 400
    assert problem["errors"] == [{"field": "model", "detail": MODEL_IN_REQUEST}]
    assert "top level" in MODEL_IN_REQUEST
    assert "move it out" in MODEL_IN_REQUEST


async def test_a_missing_model_without_request_model_stays_is_required(ctx):
    status, problem = await post(ctx, {"provider": "anthropic", "request": {"messages": []}})
    assert status == 400
    assert problem["errors"] == [{"field": "model", "detail": "is required"}]
