"""The fake provider's background mode (tools/fake_background.py), on real sockets: kept responses, replay, cancel."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import msgspec

from tests.worker.support import fake_upstream
from tools.fake_background import DRIFT_TEXT, EXPIRED_MESSAGE
from tools.upstream import ServerConfig

CASE = "simple_text_mixed_scripts"


def _events(body: bytes) -> list[dict[str, Any]]:
    return [msgspec.json.decode(line[6:]) for line in body.splitlines() if line.startswith(b"data: ")]


async def _create(http: aiohttp.ClientSession, base: str, model: str) -> list[dict[str, Any]]:
    body = {"model": model, "input": "hi", "stream": True, "background": True, "store": True}
    async with http.post(f"{base}/v1/responses", json=body) as response:
        assert response.status == 200
        return _events(await response.read())


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with http.get(url) as response:
        return response.status, await response.read()


async def test_a_kept_response_replays_from_the_start_and_after_a_cursor() -> None:
    async with fake_upstream(ServerConfig(delay_ms=1)) as (base, state), aiohttp.ClientSession() as http:
        first = await _create(http, base, CASE)
        rid = first[0]["response"]["id"]
        status, whole = await _get(http, f"{base}/v1/responses/{rid}?stream=true")
        _, after = await _get(http, f"{base}/v1/responses/{rid}?stream=true&starting_after=4")
    assert [e["sequence_number"] for e in first] == list(range(len(first)))
    assert all(e["response"]["id"] == rid for e in first if "response" in e)
    assert status == 200
    assert _events(whole) == first  # the same events, from sequence_number 0
    assert _events(after) == first[5:]
    assert state.background.replays == [(rid, None), (rid, 4)]


async def test_cancel_ends_generation_with_response_cancelled_and_is_idempotent() -> None:
    async with fake_upstream(ServerConfig(delay_ms=1, slow_delay_ms=10_000)) as (base, state), \
            aiohttp.ClientSession() as http:
        body = {"model": f"slow-{CASE}", "input": "hi", "stream": True, "background": True}
        async with http.post(f"{base}/v1/responses", json=body) as response:
            first = msgspec.json.decode(re.search(rb"data: (.*)\n", await response.content.readuntil(b"\n\n"))[1])
        rid = first["response"]["id"]
        answers = []
        for _ in range(2):
            async with http.post(f"{base}/v1/responses/{rid}/cancel") as response:
                answers.append((response.status, await response.json()))
        _, replay = await _get(http, f"{base}/v1/responses/{rid}?stream=true")
    assert answers == [(200, {"id": rid, "object": "response", "status": "cancelled"})] * 2
    assert state.background.cancelled == [rid, rid]
    events = _events(replay)
    assert events[-1]["type"] == "response.cancelled"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_unknown_expired_and_drifting_responses() -> None:
    async with fake_upstream(ServerConfig(delay_ms=1)) as (base, _state), aiohttp.ClientSession() as http:
        unknown = await _get(http, f"{base}/v1/responses/resp_nothing?stream=true")
        expired_id = (await _create(http, base, f"expire-{CASE}"))[0]["response"]["id"]
        expired = await _get(http, f"{base}/v1/responses/{expired_id}?stream=true")
        drifting = await _create(http, base, f"drift-{CASE}")
        _, replay = await _get(http, f"{base}/v1/responses/{drifting[0]['response']['id']}?stream=true")
    assert unknown[0] == 404
    assert expired[0] == 400
    assert EXPIRED_MESSAGE in expired[1].decode()
    deltas = [(a.get("delta"), b.get("delta")) for a, b in zip(drifting, _events(replay), strict=True)
              if a["type"] == "response.output_text.delta"]
    assert deltas
    assert all(replayed == DRIFT_TEXT + created for created, replayed in deltas)
