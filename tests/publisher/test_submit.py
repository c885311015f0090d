"""POST /v1/streams: validation problems, meta + job per schema.keys, idempotent stream ids."""

from __future__ import annotations

import logging
import time

import pytest

from publisher.api.tokens import verify
from schema.job import job_decoder
from schema.keys import JOB_FIELD
from schema.logs import logfmt_pairs
from tests.publisher.helpers import API_KEY, SECRET, StreamWriter, bearer

pytestmark = pytest.mark.topologies

PROBLEM = "application/problem+json"
BODY = {"provider": "openai_chat", "model": "gpt-x", "request": {"messages": [{"role": "user", "content": "hi"}]}}


async def submit(http, server, body, headers=None):
    return await http.post(server.url("/v1/streams"), json=body, headers=headers or bearer(API_KEY))


async def test_submit_creates_meta_and_enqueues_job(ctx):
    body = {**BODY, "metadata": {"user": "u1"}, "reasoning_visibility": "internal"}
    before_s = int(time.time())
    async with await submit(ctx.http, ctx.server, body) as resp:
        assert resp.status == 201
        answer = await resp.json()
        assert resp.headers["Location"] == answer["status_url"]
    sid = answer["stream_id"]
    assert sid.startswith("st_")
    assert answer["events_url"] == f"/v1/streams/{sid}/events"
    assert answer["status_url"] == f"/v1/streams/{sid}"
    assert answer["cancel_url"] == f"/v1/streams/{sid}/cancel"
    assert answer["token_scope"] == "public"
    assert before_s + 3600 <= answer["token_expires_at"] <= int(time.time()) + 3600
    claims = verify(SECRET, answer["token"], time.time())
    assert (claims.sid, claims.scp, claims.exp) == (sid, "public", answer["token_expires_at"])

    meta = {k.decode(): v.decode() for k, v in (await ctx.redis.hgetall(ctx.keys.meta(sid))).items()}
    assert meta["state"] == "queued"
    assert meta["provider"] == "openai_chat"
    assert meta["model"] == "gpt-x"
    assert meta["last_seq"] == "0"
    assert len(meta["body_hash"]) == 64
    assert int(meta["created_ms"]) >= before_s * 1000
    jobs = await ctx.redis.xrange(ctx.keys.jobs_shard(0))
    assert len(jobs) == 1
    assert meta["job_id"] == ctx.keys.job_ref(ctx.keys.jobs_shard(0), jobs[0][0].decode())
    job = job_decoder.decode(jobs[0][1][JOB_FIELD])
    assert job.stream_id == sid
    assert job.provider == "openai_chat"
    assert job.request == BODY["request"]
    assert job.metadata == {"user": "u1"}
    assert job.reasoning_visibility == "internal"
    assert job.created_ms == int(meta["created_ms"])


async def test_generated_stream_ids_are_unique(server, http):
    seen = set()
    for _ in range(5):
        async with await submit(http, server, BODY) as resp:
            seen.add((await resp.json())["stream_id"])
    assert len(seen) == 5


@pytest.mark.parametrize("headers", [{}, bearer("wrong-key"), {"Authorization": "Basic abc"}, bearer("")])
async def test_submit_requires_api_key(ctx, headers):
    async with await ctx.http.post(ctx.server.url("/v1/streams"), json=BODY, headers=headers) as resp:
        assert resp.status == 401
        assert resp.content_type == PROBLEM
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await resp.json())["type"] == "https://fanout.dev/problems/unauthorized"
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 0


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"provider": "openai"}, "provider"),
        ({"provider": None}, "provider"),
        ({"model": ""}, "model"),
        ({"model": 5}, "model"),
        ({"model": "m" * 257}, "model"),
        ({"model": "gpt\n4"}, "model"),
        ({"model": "gpt\x004"}, "model"),
        ({"model": " gpt-4"}, "model"),
        ({"request": []}, "request"),
        ({"request": "hi"}, "request"),
        ({"stream_id": "has space"}, "stream_id"),
        ({"stream_id": "a" * 129}, "stream_id"),
        ({"stream_id": ""}, "stream_id"),
        ({"metadata": [1]}, "metadata"),
        ({"reasoning_visibility": "secret"}, "reasoning_visibility"),
        ({"streamid": "x"}, "streamid"),
    ],
)
async def test_submit_rejects_each_bad_field(ctx, change, field):
    async with await submit(ctx.http, ctx.server, {**BODY, **change}) as resp:
        assert resp.status == 400
        assert resp.content_type == PROBLEM
        problem = await resp.json()
    assert problem["type"] == "https://fanout.dev/problems/invalid-field"
    assert problem["title"] == "Invalid field"
    assert problem["status"] == 400
    assert field in problem["detail"]
    assert [error["field"] for error in problem["errors"]] == [field]
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 0


@pytest.mark.parametrize("options", ["x", [1, 2], 5, True])
async def test_submit_rejects_a_chat_stream_options_that_is_not_an_object(ctx, options):
    body = {**BODY, "provider": "openai_chat", "request": {"messages": [], "stream_options": options}}
    async with await submit(ctx.http, ctx.server, body) as resp:
        assert resp.status == 400
        problem = await resp.json()
    assert problem["type"] == "https://fanout.dev/problems/invalid-field"
    assert "request.stream_options" in problem["detail"]
    assert problem["errors"] == [{"field": "request.stream_options",
                                  "detail": 'must be a JSON object (or absent), such as {"include_usage": true}'}]
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 0


@pytest.mark.parametrize("options", [None, {}, {"include_usage": False}])
async def test_submit_accepts_a_chat_stream_options_object_or_null(ctx, options):
    body = {**BODY, "provider": "openai_chat", "request": {"messages": [], "stream_options": options}}
    async with await submit(ctx.http, ctx.server, body) as resp:
        assert resp.status == 201
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 1


async def test_submit_names_every_bad_and_missing_field_at_once(server, http):
    async with await submit(http, server, {"provider": "x", "extra": 1}) as resp:
        assert resp.status == 400
        problem = await resp.json()
    fields = {error["field"]: error["detail"] for error in problem["errors"]}
    assert fields == {"extra": "unknown field", "provider": fields["provider"], "model": "is required",
                      "request": "is required"}


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"\"text\"", b"", b"\xff\xfe"])
async def test_submit_rejects_a_body_that_is_not_a_json_object(server, http, raw):
    headers = {**bearer(API_KEY), "Content-Type": "application/json"}
    async with await http.post(server.url("/v1/streams"), data=raw, headers=headers) as resp:
        assert resp.status == 400
        assert resp.content_type == PROBLEM
        assert (await resp.json())["type"] == "https://fanout.dev/problems/invalid-body"


async def test_submit_with_no_body_says_the_body_is_empty(server, http):
    async with await http.post(server.url("/v1/streams"), headers=bearer(API_KEY)) as resp:
        assert resp.status == 400
        assert (await resp.json())["detail"].startswith("the body is empty")


async def test_same_stream_id_same_body_is_idempotent(ctx):
    body = {**BODY, "stream_id": "client-chosen_1"}
    answers = []
    for reordered in (body, dict(reversed(list(body.items())))):
        async with await submit(ctx.http, ctx.server, reordered) as resp:
            assert resp.status == 201
            answers.append(await resp.json())
    strip = [{k: v for k, v in a.items() if k not in ("token", "token_expires_at")} for a in answers]
    assert strip[0] == strip[1]
    assert answers[0]["stream_id"] == "client-chosen_1"
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 1


async def test_orphaned_queued_meta_is_enqueued_again_on_resubmission(ctx):
    body = {**BODY, "stream_id": "orphaned"}
    async with await submit(ctx.http, ctx.server, body) as resp:
        assert resp.status == 201
    # a publisher that died between the meta and the XADD leaves this behind:
    await ctx.redis.delete(ctx.keys.jobs_shard(0))
    await ctx.redis.hdel(ctx.keys.meta("orphaned"), "job_id")
    async with await submit(ctx.http, ctx.server, body) as resp:
        assert resp.status == 201
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 0, (
        "a fresh queued meta may still be enqueuing: no second job")
    await ctx.redis.hset(ctx.keys.meta("orphaned"), "created_ms", str(int(time.time() * 1000) - 31_000))
    async with await submit(ctx.http, ctx.server, body) as resp:
        assert resp.status == 201
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 1
    assert await ctx.redis.hget(ctx.keys.meta("orphaned"), "job_id")
    async with await submit(ctx.http, ctx.server, body) as resp:
        assert resp.status == 201
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 1


async def test_same_stream_id_different_body_is_409(ctx):
    async with await submit(ctx.http, ctx.server, {**BODY, "stream_id": "dup"}) as resp:
        assert resp.status == 201
    async with await submit(ctx.http, ctx.server, {**BODY, "stream_id": "dup", "model": "other"}) as resp:
        assert resp.status == 409
        assert resp.content_type == PROBLEM
        assert (await resp.json())["type"] == "https://fanout.dev/problems/stream-id-conflict"
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 1


async def test_stream_id_of_an_expired_stream_is_409(ctx):
    await StreamWriter(ctx.redis, ctx.keys, "old").expire(9)
    async with await submit(ctx.http, ctx.server, {**BODY, "stream_id": "old"}) as resp:
        assert resp.status == 409
    assert await ctx.redis.xlen(ctx.keys.jobs_shard(0)) == 0


async def test_the_submission_log_line_keeps_a_model_with_spaces_one_value(ctx, caplog):
    """A model name is the caller's text: ``gpt level=ERROR`` must not add a ``level`` field to the line."""
    with caplog.at_level(logging.INFO, logger="publisher.api.submit"):
        resp = await submit(ctx.http, ctx.server, {**BODY, "model": 'gpt level=ERROR logger=x "q"'})
        assert resp.status == 201
        stream_id = (await resp.json())["stream_id"]
    [message] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("event=submitted ")]
    assert logfmt_pairs(message) == {"event": "submitted", "stream_id": stream_id, "provider": "openai_chat",
                                     "model": 'gpt level=ERROR logger=x "q"'}
