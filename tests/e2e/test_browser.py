"""The demo page in a real Chromium (Debian's, driven by Playwright): streams, drops, resumes.

The whole stack runs as real processes (upstream replaying a transcript, two workers, the
publisher). The page uses native ``EventSource``; a loopback proxy cuts its first
connection mid-stream, the browser reconnects by itself with ``Last-Event-ID``, and the
final page equals the transcript's golden result, no delta missing or doubled.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from publisher.client import FanoutClient
from publisher.stack import LocalStack
from schema.reducer import reduce
from tests.e2e.proxy import CuttingProxy
from worker.replay import replay_file

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("FANOUT_CHROMIUM", "/usr/bin/chromium")
CASE = ("anthropic", "anthropic", "thinking_with_signature")
TERMINAL = ("completed", "incomplete", "failed", "interrupted", "cancelled")

async_playwright = pytest.importorskip("playwright.async_api", reason="playwright is a dev dependency").async_playwright
pytestmark = pytest.mark.skipif(
    not (shutil.which(CHROMIUM) or Path(CHROMIUM).exists()),
    reason=f"no Chromium at {CHROMIUM}: install Debian's chromium package (.ci/run does) or set FANOUT_CHROMIUM",
)


@pytest.fixture(scope="module")
def stack(single_redis_url: str) -> Iterator[LocalStack]:
    with LocalStack(single_redis_url, workers=2, delay_ms=120, chunk_bytes=48) as running:
        yield running


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        yield browser
        await browser.close()


def golden_blocks(directory: str, case: str) -> list[str]:
    events, _ = replay_file(ROOT / "transcripts" / directory / f"{case}.sse")
    blocks = msgspec.to_builtins(reduce(events).blocks)
    return [b.get("text", b.get("arguments_text", "")) for b in blocks]


async def submit(stack: LocalStack, provider: str, case: str) -> tuple[str, str]:
    async with FanoutClient(stack.base_url, api_key=stack.api_key) as client:
        sub = await client.submit(provider=provider, model=case,
                                  request={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64})
    return sub.stream_id, sub.token


async def finished_state(page: Any) -> dict[str, Any]:
    await page.wait_for_function(
        f"window.fanoutDemo && {list(TERMINAL)!r}.includes(window.fanoutDemo.state.status)", timeout=30_000
    )
    state: dict[str, Any] = await page.evaluate(
        "({status: fanoutDemo.state.status, events: fanoutDemo.state.events, renders: fanoutDemo.state.renders,"
        " lastSeq: fanoutDemo.state.lastSeq, connections: fanoutDemo.state.connections, texts: fanoutDemo.text()})"
    )
    return state


async def test_page_resumes_after_network_cut_with_last_event_id(stack: LocalStack, browser: Any) -> None:
    provider, directory, case = CASE
    stream_id, token = await submit(stack, provider, case)
    async with CuttingProxy(stack.publisher_port, cut_after_events=4) as proxy:
        page = await browser.new_page()
        await page.goto(f"http://127.0.0.1:{proxy.port}/demo?stream_id={stream_id}&token={token}")
        state = await finished_state(page)
        body_text = await page.inner_text("#blocks")
    event_requests = [r for r in proxy.requests if "/events" in r.split("\r\n", 1)[0]]
    assert proxy.cuts == 1
    assert len(event_requests) >= 2, "the browser never reconnected"
    # The cut falls inside an HTTP chunk, whose tail the browser may drop: it resumes from
    # the last event it dispatched, one of the four relayed.
    resumed = [line for line in event_requests[1].lower().split("\r\n") if line.startswith("last-event-id:")]
    assert resumed, event_requests[1]
    assert 1 <= int(resumed[0].split(":")[1]) <= 4
    assert state["status"] == "completed"
    assert state["texts"] == golden_blocks(directory, case)
    assert state["events"] == state["lastSeq"], "an event was applied twice or skipped"
    for text in golden_blocks(directory, case):
        assert text.splitlines()[0] in body_text


async def test_drop_button_resumes_from_last_seq(stack: LocalStack, browser: Any) -> None:
    provider, directory, case = CASE
    stream_id, token = await submit(stack, provider, case)
    page = await browser.new_page()
    await page.goto(f"{stack.base_url}/demo?stream_id={stream_id}&token={token}")
    await page.wait_for_function("window.fanoutDemo.state.lastSeq >= 3", timeout=30_000)
    assert await page.evaluate("fanoutDemo.state.terminal") is None, "the stream ended before the drop"
    await page.click("#drop")
    state = await finished_state(page)
    assert state["connections"] >= 2
    assert state["status"] == "completed"
    assert state["texts"] == golden_blocks(directory, case)
    assert state["events"] == state["lastSeq"]


async def test_renders_at_most_once_per_frame_however_fast_deltas_arrive(redis_url: str, browser: Any) -> None:
    with LocalStack(redis_url, workers=1, delay_ms=0, chunk_bytes=4096) as fast:
        provider, directory, case = "openai_chat", "openai_chat", "reasoning_text_tool_call_blocks"
        stream_id, token = await submit(fast, provider, case)
        page = await browser.new_page()
        await page.goto(f"{fast.base_url}/demo?stream_id={stream_id}&token={token}")
        state = await finished_state(page)
    assert state["texts"] == golden_blocks(directory, case)
    assert state["renders"] < state["events"], state
