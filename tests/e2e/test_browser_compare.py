"""The demo page in a real Chromium: why it cannot follow a stream, and the four protocols side by side.

Runs on the same stack and browser fixtures as ``test_browser.py`` (real processes, Debian's
Chromium through Playwright). Every protocol this publisher serves must show the same
answer as the golden transcript; a protocol a publisher does not serve (an older one, here
a loopback proxy that answers ``/agui`` and ``/durable`` with the publisher's own
no-such-route ``404``) must say "not available on this server".
"""

# ruff: noqa: F811 - the fixtures imported from test_browser.py are redefined as test parameters by name
from __future__ import annotations

import asyncio
import re
from typing import Any

import msgspec

from fanout_client import FanoutClient
from publisher.api.problems import NO_ROUTE, ProblemError
from schema.keys import Keys
from schema.reducer import reduce
from tests.conftest import client_for
from tests.e2e.proxy import CuttingProxy, _one_request_per_connection
from tests.e2e.test_browser import (  # noqa: F401 - fixtures used by name
    ROOT,
    browser,
    new_page,
    pytestmark,
    stack,
    submit,
    transcripts,
)
from tools.demo.stack import LocalStack
from tools.replay import replay_file

CASE = ("anthropic", "anthropic", "thinking_with_signature")
ANSWER_KINDS = ("text", "refusal")
PROTOCOLS = ("events", "ui", "agui", "durable")
LATER_PROTOCOLS = re.compile(rb"^GET /v1/streams/[^/ ]+/(agui|durable)[? ]")


class OlderPublisher(CuttingProxy):
    """Forwards to the publisher, except ``/agui`` and ``/durable``: answered as by a publisher without them."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port, cut_after_events=0)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        head = await client_r.readuntil(b"\r\n\r\n")
        if LATER_PROTOCOLS.match(head):
            body = ProblemError("not-found", NO_ROUTE).response().body
            assert isinstance(body, bytes)
            client_w.write(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/problem+json\r\n"
                           b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
            await client_w.drain()
            client_w.close()
            return
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        up_w.write(_one_request_per_connection(head))
        tasks = [asyncio.create_task(self._pipe(client_r, up_w)), asyncio.create_task(self._pipe(up_r, client_w))]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for writer in (client_w, up_w):
            writer.close()


def golden_answer(directory: str, case: str) -> str:
    events, _ = replay_file(ROOT / "transcripts" / directory / f"{case}.sse")
    blocks = msgspec.to_builtins(reduce(events).blocks)
    return "\n\n".join(b["text"] for b in sorted(blocks, key=lambda b: b["index"]) if b["kind"] in ANSWER_KINDS)


async def status_and_reason(page: Any, status: str) -> tuple[str, str]:
    try:
        await page.wait_for_function(f"document.getElementById('status').textContent === {status!r}",
                                     timeout=30_000)
    except Exception:
        shown = await page.evaluate("[fanoutDemo.state.status, fanoutDemo.state.reason, fanoutDemo.state.log]")
        raise AssertionError(f"status never became {status!r}: {shown}") from None
    assert await page.is_visible("#reason"), "the reason is shown beside the status, not only in the log"
    return await page.inner_text("#status"), await page.inner_text("#reason")


async def test_an_unknown_stream_is_named_in_the_status(stack: LocalStack, browser: Any) -> None:
    provider, _directory, case = CASE
    stream_id, token = await submit(stack, provider, case)
    async with FanoutClient(stack.base_url, api_key=stack.api_key) as client:
        await client.result(stream_id)  # ended, then gone: its token is good, the stream unknown
    redis = client_for(stack.redis_url)
    try:
        keys = Keys(stack.prefix)
        await redis.delete(keys.events(stream_id), keys.meta(stream_id), keys.tomb(stream_id))
    finally:
        await redis.aclose()
    page = await new_page(browser)
    await page.goto(f"{stack.base_url}/demo?stream_id={stream_id}&token={token}")
    _, reason = await status_and_reason(page, "unknown stream")
    assert "no such stream" in reason
    assert not await page.is_visible("#log")  # the connection log stays collapsed: the status said it
    assert page.errors == []


async def test_a_refused_token_is_named_in_the_status(stack: LocalStack, browser: Any) -> None:
    provider, _directory, case = CASE
    stream_id, _token = await submit(stack, provider, case)
    page = await new_page(browser)
    await page.goto(f"{stack.base_url}/demo?stream_id={stream_id}&token=v1.not-a-token")
    _, reason = await status_and_reason(page, "token refused")
    assert "read token" in reason
    assert page.errors == []


async def test_a_link_without_a_token_says_so(stack: LocalStack, browser: Any) -> None:
    provider, _directory, case = CASE
    stream_id, _token = await submit(stack, provider, case)
    page = await new_page(browser)
    await page.goto(f"{stack.base_url}/demo?stream_id={stream_id}")
    _, reason = await status_and_reason(page, "no token")
    assert "&token=" in reason
    assert await page.evaluate("fanoutDemo.state.connections") == 0
    assert page.errors == []


async def compared(page: Any, base_url: str, stream_id: str, token: str) -> dict[str, Any]:
    """Open the stream, press *Compare protocols*, and return every column once each ended or is unavailable."""
    await page.goto(f"{base_url}/demo?stream_id={stream_id}&token={token}")
    await page.wait_for_function("!document.getElementById('compare-button').disabled", timeout=30_000)
    await page.click("#compare-button")
    await page.wait_for_function(
        "Object.keys(fanoutCompare.columns()).length === 4 &&"
        " Object.values(fanoutCompare.columns()).every(c => ['ended', 'unavailable'].includes(c.state))",
        timeout=60_000)
    columns: dict[str, Any] = await page.evaluate("fanoutCompare.columns()")
    return columns


async def test_the_four_protocols_show_one_answer_side_by_side(stack: LocalStack, browser: Any) -> None:
    provider, directory, case = CASE
    stream_id, token = await submit(stack, provider, case)
    page = await new_page(browser)
    columns = await compared(page, stack.base_url, stream_id, token)
    answer = golden_answer(directory, case)
    assert answer
    assert {name: (c["state"], c["text"]) for name, c in columns.items()} == dict.fromkeys(PROTOCOLS,
                                                                                              ("ended", answer))
    assert columns["events"]["end"] == "completed, finish_reason stop"
    assert columns["ui"]["end"] == "finish, finishReason stop"
    assert columns["agui"]["end"] == "RUN_FINISHED"
    for name in PROTOCOLS:
        assert answer.splitlines()[0] in await page.inner_text(f".protocol[data-protocol='{name}'] .protocol-answer")
    assert page.errors == []


async def test_a_protocol_the_publisher_does_not_serve_says_so(stack: LocalStack, browser: Any) -> None:
    provider, directory, case = CASE
    stream_id, token = await submit(stack, provider, case)
    async with OlderPublisher(stack.publisher_port) as older:
        page = await new_page(browser)
        columns = await compared(page, f"http://127.0.0.1:{older.port}", stream_id, token)
        shown = {name: await page.inner_text(f".protocol[data-protocol='{name}'] .protocol-state")
                 for name in ("agui", "durable")}
    answer = golden_answer(directory, case)
    assert {name: c["state"] for name, c in columns.items()} == {"events": "ended", "ui": "ended",
                                                                 "agui": "unavailable", "durable": "unavailable"}
    assert columns["events"]["text"] == columns["ui"]["text"] == answer
    assert shown == dict.fromkeys(("agui", "durable"), "not available on this server")
    assert page.errors == []


async def test_compare_follows_the_next_stream_started_from_the_page(stack: LocalStack, browser: Any) -> None:
    provider, directory, case = CASE
    first, token = await submit(stack, provider, case)
    page = await new_page(browser)
    await page.goto(f"{stack.base_url}/demo?stream_id={first}&token={token}&compare=1")
    await page.wait_for_function("Object.keys(fanoutCompare.columns()).length === 4", timeout=30_000)
    await page.wait_for_function("document.querySelectorAll('#case option').length > 0", timeout=30_000)
    await page.select_option("#provider", provider)
    await page.select_option("#case", case)
    await page.click("#start-button")
    await page.wait_for_function(f"fanoutDemo.state.streamId !== {first!r}", timeout=30_000)
    await page.wait_for_function("fanoutCompare.columns().events.state === 'ended'", timeout=60_000)
    columns = await page.evaluate("fanoutCompare.columns()")
    assert columns["events"]["text"] == golden_answer(directory, case)
    assert "compare=1" in page.url
    assert page.errors == []
