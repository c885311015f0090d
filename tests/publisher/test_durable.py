"""``/v1/streams/{id}/durable`` catch-up reads, HEAD and refused writes, on a real server and a real Redis."""

from __future__ import annotations

import json
from typing import Any

import pytest

from publisher.wire.durable import CACHEABLE, format_offset
from schema.contract import encode_event
from tests.publisher.conftest import Ctx
from tests.publisher.helpers import (
    API_KEY,
    StreamWriter,
    bearer,
    block_start,
    delta,
    make_settings,
    start,
    stop,
    text_stream,
    token_for,
)

EPOCH = b"k3x9q2m0ab"


def durable(ctx: Ctx, query: str = "", sid: str | None = None) -> str:
    return ctx.server.url(f"/v1/streams/{sid or ctx.sid}/durable{query}")


def auth(ctx: Ctx, sid: str | None = None, scope: Any = "public") -> dict[str, str]:
    return bearer(token_for(sid or ctx.sid, scope))


async def stored(ctx: Ctx, events: list[Any], *, epoch: bytes = EPOCH) -> StreamWriter:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=epoch)
    await writer.meta()
    await writer.append(*events, notify=False)
    return writer


async def test_a_catch_up_read_from_the_start_is_every_event_as_a_json_array(ctx: Ctx) -> None:
    events = text_stream(ctx.sid, 3)
    await stored(ctx, events)
    async with ctx.http.get(durable(ctx, "?offset=-1"), headers=auth(ctx)) as response:
        assert response.status == 200
        body = await response.json()
        headers = response.headers
    assert body == [json.loads(encode_event(event)) for event in events]
    assert headers["Content-Type"] == "application/json"
    assert headers["Stream-Next-Offset"] == format_offset(len(events), EPOCH.decode())
    assert headers["Stream-Up-To-Date"] == "true"
    assert headers["Stream-Closed"] == "true"
    assert headers["Cache-Control"] == "no-store"  # the start of a stream can be written again
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Cross-Origin-Resource-Policy"] == "same-origin"
    assert headers["ETag"].endswith(':c"')


async def test_every_answer_varies_with_the_credential_that_decides_its_projection(ctx: Ctx) -> None:
    await stored(ctx, text_stream(ctx.sid, 2))
    after_one = format_offset(1, EPOCH.decode())
    for query in ("?offset=-1", f"?offset={after_one}", "?offset=now"):
        for headers in (auth(ctx), bearer(API_KEY)):
            async with ctx.http.get(durable(ctx, query), headers=headers) as response:
                assert response.status == 200, query
                assert response.headers["Vary"] == "Authorization", query
    async with ctx.http.head(durable(ctx), headers=auth(ctx)) as response:
        assert response.headers["Vary"] == "Authorization"


async def test_an_offset_without_its_generation_is_read_but_never_cached(ctx: Ctx) -> None:
    await stored(ctx, text_stream(ctx.sid, 2))
    bare, pinned = format_offset(1, None), format_offset(1, EPOCH.decode())
    async with ctx.http.get(durable(ctx, f"?offset={bare}"), headers=auth(ctx)) as response:
        assert response.status == 200
        assert [item["seq"] for item in await response.json()] == list(range(2, 7))  # 2 deltas: 6 events
        assert response.headers["Cache-Control"] == "no-store"  # after a history reset it is another generation's
    async with ctx.http.get(durable(ctx, f"?offset={pinned}"), headers=auth(ctx)) as response:
        assert response.status == 200
        assert response.headers["Cache-Control"] == CACHEABLE


async def test_a_stream_longer_than_a_page_is_read_in_chunks_and_later_chunks_are_cacheable(ctx: Ctx) -> None:
    server = await ctx.start_app(make_settings(read_page=4))
    events = text_stream(ctx.sid, 6)  # 10 events
    await stored(ctx, events)
    offset, seen, chunks = "-1", [], []
    while True:
        async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/durable?offset={offset}"),
                                headers=auth(ctx)) as response:
            assert response.status == 200
            seen += [item["seq"] for item in await response.json()]
            chunks.append((offset, response.headers["Cache-Control"], "Stream-Up-To-Date" in response.headers))
            offset = response.headers["Stream-Next-Offset"]
            if "Stream-Closed" in response.headers:
                break
    assert seen == list(range(1, 11))
    assert [up for _, _, up in chunks] == [False, False, True]
    assert [cache for _, cache, _ in chunks] == ["no-store", CACHEABLE, CACHEABLE]


async def test_a_read_at_the_tail_of_a_running_stream_is_empty_and_up_to_date_not_closed(ctx: Ctx) -> None:
    await stored(ctx, [start(ctx.sid), block_start(ctx.sid, 2, 0)])
    tail = format_offset(2, EPOCH.decode())
    async with ctx.http.get(durable(ctx, f"?offset={tail}"), headers=auth(ctx)) as response:
        assert response.status == 200
        assert await response.json() == []
        assert response.headers["Stream-Next-Offset"] == tail
        assert response.headers["Stream-Up-To-Date"] == "true"
        assert response.headers["Cache-Control"] == "no-store"  # the tail moves
        assert "Stream-Closed" not in response.headers


async def test_a_read_at_the_end_of_an_ended_stream_is_eof(ctx: Ctx) -> None:
    events = text_stream(ctx.sid, 1)
    await stored(ctx, events)
    end = format_offset(len(events), EPOCH.decode())
    async with ctx.http.get(durable(ctx, f"?offset={end}"), headers=auth(ctx)) as response:
        assert response.status == 200
        assert await response.json() == []
        assert response.headers["Stream-Closed"] == "true"


async def test_offset_now_is_the_tail_with_no_messages_and_no_store(ctx: Ctx) -> None:
    await stored(ctx, [start(ctx.sid), block_start(ctx.sid, 2, 0), delta(ctx.sid, 3, 0)])
    async with ctx.http.get(durable(ctx, "?offset=now"), headers=auth(ctx)) as response:
        assert response.status == 200
        assert await response.json() == []
        assert response.headers["Stream-Next-Offset"] == format_offset(3, EPOCH.decode())
        assert response.headers["Cache-Control"] == "no-store"
        assert "ETag" not in response.headers


async def test_a_queued_stream_reads_empty_from_the_beginning(ctx: Ctx) -> None:
    await StreamWriter(ctx.redis, ctx.keys, ctx.sid).meta(state="queued")
    async with ctx.http.get(durable(ctx), headers=auth(ctx)) as response:
        assert response.status == 200
        assert await response.json() == []
        assert response.headers["Stream-Next-Offset"] == format_offset(0, None)
        assert response.headers["Stream-Up-To-Date"] == "true"


@pytest.mark.parametrize("query", ["?offset=", "?offset=0,1", "?offset=0%201", "?offset=17", "?offset=-1&offset=-1",
                                   "?live=long-poll", "?live=sse", "?offset=-1&live=poll",
                                   f"?offset={'0' * 16}.NOT"])
async def test_a_malformed_read_is_400(ctx: Ctx, query: str) -> None:
    await stored(ctx, text_stream(ctx.sid, 1))
    async with ctx.http.get(durable(ctx, query), headers=auth(ctx)) as response:
        assert response.status == 400
        problem = await response.json(content_type=None)
        assert problem["type"].rsplit("/", 1)[1] in ("invalid-position", "invalid-field")
        assert response.headers["X-Content-Type-Options"] == "nosniff"


async def test_an_unknown_stream_is_404_and_a_missing_credential_401(ctx: Ctx) -> None:
    async with ctx.http.get(durable(ctx, "?offset=-1"), headers=auth(ctx)) as response:
        assert response.status == 404
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Cross-Origin-Resource-Policy"] == "same-origin"
    async with ctx.http.get(durable(ctx, "?offset=-1")) as response:
        assert response.status == 401


async def test_an_offset_of_expired_history_is_410_and_its_last_offset_eof(ctx: Ctx) -> None:
    writer = await stored(ctx, text_stream(ctx.sid, 1))
    await writer.expire(5)
    async with ctx.http.get(durable(ctx, "?offset=-1"), headers=auth(ctx)) as response:
        assert response.status == 410
        assert (await response.json(content_type=None))["type"].endswith("/history-expired")
    async with ctx.http.get(durable(ctx, f"?offset={format_offset(5, None)}"), headers=auth(ctx)) as response:
        assert response.status == 200
        assert response.headers["Stream-Closed"] == "true"


async def test_an_offset_of_another_generation_is_410_history_reset(ctx: Ctx) -> None:
    await stored(ctx, text_stream(ctx.sid, 1))
    async with ctx.http.get(durable(ctx, f"?offset={format_offset(2, 'older')}"), headers=auth(ctx)) as response:
        assert response.status == 410
        assert (await response.json(content_type=None))["type"].endswith("/history-reset")


async def test_an_offset_past_the_top_is_410_and_one_before_trimmed_history_too(ctx: Ctx) -> None:
    writer = StreamWriter(ctx.redis, ctx.keys, ctx.sid, epoch=EPOCH)
    await writer.meta()
    await writer.append(*text_stream(ctx.sid, 4)[:6], notify=False, maxlen=3)
    async with ctx.http.get(durable(ctx, f"?offset={format_offset(9, EPOCH.decode())}"),
                            headers=auth(ctx)) as response:
        assert response.status == 410
        assert (await response.json(content_type=None))["type"].endswith("/position-ahead")
    async with ctx.http.get(durable(ctx, f"?offset={format_offset(1, EPOCH.decode())}"),
                            headers=auth(ctx)) as response:
        assert response.status == 410
        assert (await response.json(content_type=None))["type"].endswith("/history-trimmed")


async def test_a_matching_if_none_match_is_304(ctx: Ctx) -> None:
    await stored(ctx, text_stream(ctx.sid, 1))
    query = f"?offset={format_offset(1, EPOCH.decode())}"
    async with ctx.http.get(durable(ctx, query), headers=auth(ctx)) as response:
        tag = response.headers["ETag"]
    async with ctx.http.get(durable(ctx, query), headers={**auth(ctx), "If-None-Match": tag}) as response:
        assert response.status == 304
        assert await response.read() == b""
    async with ctx.http.get(durable(ctx, query), headers={**auth(ctx, scope="internal"), "If-None-Match": tag}) as r:
        assert r.status == 200  # another scope reads another body


async def test_public_readers_do_not_get_internal_reasoning_even_when_resuming_inside_it(ctx: Ctx) -> None:
    sid = ctx.sid
    events = [start(sid), block_start(sid, 2, 0, "reasoning", visibility="internal"),
              delta(sid, 3, 0, "secret", kind="reasoning"), delta(sid, 4, 0, "more", kind="reasoning"),
              stop(sid, 5, 0, kind="reasoning"), block_start(sid, 6, 1), delta(sid, 7, 1, "hi"), stop(sid, 8, 1)]
    await stored(ctx, events)
    for offset, scope, expected in [("-1", "public", [1, 6, 7, 8]), ("-1", "internal", list(range(1, 9))),
                                    (format_offset(3, EPOCH.decode()), "public", [6, 7, 8])]:
        async with ctx.http.get(durable(ctx, f"?offset={offset}"), headers=auth(ctx, scope=scope)) as response:
            assert [item["seq"] for item in await response.json()] == expected
            assert response.headers["Stream-Next-Offset"] == format_offset(8, EPOCH.decode())


async def test_head_gives_the_tail_offset_and_closure(ctx: Ctx) -> None:
    events = text_stream(ctx.sid, 1)
    await stored(ctx, events)
    async with ctx.http.head(durable(ctx), headers=auth(ctx)) as response:
        assert response.status == 200
        assert response.headers["Stream-Next-Offset"] == format_offset(len(events), EPOCH.decode())
        assert response.headers["Stream-Closed"] == "true"
        assert response.headers["Cache-Control"] == "no-store"
    async with ctx.http.head(durable(ctx, sid="st_unknown"), headers=bearer(API_KEY)) as response:
        assert response.status == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
async def test_writes_are_refused_with_405(ctx: Ctx, method: str) -> None:
    await stored(ctx, text_stream(ctx.sid, 1))
    async with ctx.http.request(method, durable(ctx), headers=bearer(API_KEY), data=b'[{"x":1}]') as response:
        assert response.status == 405
        assert response.headers["Allow"] == "GET, HEAD, OPTIONS"
        assert "workers only" in (await response.json(content_type=None))["detail"]
    async with ctx.http.get(durable(ctx), headers=auth(ctx)) as response:
        assert len(await response.json()) == 5  # nothing was written


async def test_cors_exposes_the_protocol_headers_and_allows_if_none_match(ctx: Ctx) -> None:
    server = await ctx.start_app(make_settings(cors_origins=["*"]))
    await stored(ctx, text_stream(ctx.sid, 1))
    origin = {"Origin": "https://app.example"}
    async with ctx.http.get(server.url(f"/v1/streams/{ctx.sid}/durable"), headers={**auth(ctx), **origin}) as r:
        exposed = {name.strip() for name in r.headers["Access-Control-Expose-Headers"].split(",")}
    assert {"Stream-Next-Offset", "Stream-Cursor", "Stream-Up-To-Date", "Stream-Closed", "ETag"} <= exposed
    preflight = {**origin, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "if-none-match"}
    async with ctx.http.options(server.url(f"/v1/streams/{ctx.sid}/durable"), headers=preflight) as r:
        assert r.status == 204
        assert "If-None-Match" in r.headers["Access-Control-Allow-Headers"]


async def test_a_plain_options_names_the_methods_served(ctx: Ctx) -> None:
    await stored(ctx, text_stream(ctx.sid, 1))
    async with ctx.http.options(durable(ctx)) as response:  # no Access-Control-Request-Method: not a preflight
        assert response.status == 204
        assert response.headers["Allow"] == "GET, HEAD, OPTIONS"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
