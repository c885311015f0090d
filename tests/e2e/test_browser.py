"""The demo page in a real Chromium (Debian's, driven by Playwright): start, stream, drop, resume.

The whole stack runs as real processes (upstream replaying transcripts, two workers, the
publisher in demo mode). A person's path is driven through the page itself: pick a
provider and a recorded case, start it (``POST /demo/streams``), watch it render, drop the
connection and see it resume from the last seq held. The page uses native
``EventSource``; a loopback proxy cuts a connection mid-stream, the browser reconnects by
itself with ``Last-Event-ID``, and the final page equals the transcript's golden result,
no delta missing or doubled. Model text containing HTML is shown, never executed.

Pages are opened with ``bypass_csp`` because Playwright's ``wait_for_function`` evaluates
strings, which the page's Content-Security-Policy forbids; the sanitizer is then the only
guard the unsafe-HTML test exercises (``tests/tools/test_demo_routes.py`` checks the
CSP header).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fanout_client import FanoutClient
from schema.contract import parse_event_id
from schema.keys import Keys
from schema.reducer import reduce
from tests.conftest import client_for
from tests.e2e.proxy import CuttingProxy
from tests.publisher.helpers import StreamWriter, block_start, delta, done, start, stop
from tools.demo.stack import LocalStack
from tools.replay import replay_file

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("FANOUT_CHROMIUM", "/usr/bin/chromium")
CASE = ("anthropic", "anthropic", "thinking_with_signature")
MARKDOWN_CASE = ("gemini", "gemini_sse", "thought_text_call_blocks")
UNSAFE_CASE = "model_writes_html"
TERMINAL = ("completed", "incomplete", "failed", "interrupted", "cancelled")
SCREENSHOTS = os.environ.get("FANOUT_SCREENSHOTS")
"""When set, a directory where the drop-and-resume test saves its page mid-stream and at the end."""

async_playwright = pytest.importorskip("playwright.async_api", reason="playwright is a dev dependency").async_playwright
pytestmark = pytest.mark.skipif(
    not (shutil.which(CHROMIUM) or Path(CHROMIUM).exists()),
    reason=f"no Chromium at {CHROMIUM}: install Debian's chromium package (.ci/run does) or set FANOUT_CHROMIUM",
)


def _chunk(content: str | None, finish: str | None = None) -> str:
    delta = {} if content is None else {"content": content}
    body = {"id": "chatcmpl-demo", "object": "chat.completion.chunk", "created": 1767225600, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {msgspec.json.encode(body).decode()}\n\n"


UNSAFE_DELTAS = (
    "**Bold** claim, then a list:\n\n- first item\n- second item\n\n",
    "<img src=x onerror=\"window.__pwned = 'img'\"> and ",
    "<script>window.__pwned = 'script'</script> and ",
    "[a link](javascript:window.__pwned='link') end.",
)


@pytest.fixture(scope="module")
def transcripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An extra transcript root (FANOUT_TRANSCRIPTS_DIR) with a Chat answer that writes Markdown and HTML."""
    root = tmp_path_factory.mktemp("transcripts")
    (root / "openai_chat").mkdir()
    body = _chunk("") + "".join(_chunk(d) for d in UNSAFE_DELTAS) + _chunk(None, "stop") + "data: [DONE]\n\n"
    (root / "openai_chat" / f"{UNSAFE_CASE}.sse").write_text(body, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def stack(single_redis_url: str, transcripts: Path) -> Iterator[LocalStack]:
    with LocalStack(single_redis_url, workers=2, delay_ms=120, chunk_bytes=48, slow_delay_ms=200, slow_pacing="chunk",
                    env={"FANOUT_TRANSCRIPTS_DIR": str(transcripts)}) as running:
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


async def new_page(browser: Any) -> Any:
    page = await browser.new_page(bypass_csp=True, viewport={"width": 1100, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    return page


def golden_blocks(directory: str, case: str) -> list[str]:
    events, _ = replay_file(ROOT / "transcripts" / directory / f"{case}.sse")
    blocks = msgspec.to_builtins(reduce(events).blocks)
    return [b.get("text", b.get("arguments_text", "")) for b in blocks]


async def submit(stack: LocalStack, provider: str, case: str) -> tuple[str, str]:
    async with FanoutClient(stack.base_url, api_key=stack.api_key) as client:
        sub = await client.submit(provider=provider, model=case,
                                  request={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64})
    return sub.stream_id, sub.token


async def start_from_page(page: Any, base_url: str, provider: str, case: str, *, slow: bool = False) -> None:
    """Open the page, pick the provider and case as a person would, and press Start."""
    await page.goto(f"{base_url}/demo")
    await page.wait_for_function(
        "document.querySelectorAll('#case option').length > 0 && !document.getElementById('start-button').disabled",
        timeout=30_000)
    await page.select_option("#provider", provider)
    await page.select_option("#case", case)
    if slow:
        await page.check("#slow")
    await page.click("#start-button")
    await page.wait_for_function("window.fanoutDemo.state.streamId !== null", timeout=30_000)


async def finished_state(page: Any) -> dict[str, Any]:
    await page.wait_for_function(
        f"window.fanoutDemo && {list(TERMINAL)!r}.includes(window.fanoutDemo.state.status)", timeout=60_000
    )
    await page.wait_for_function("!window.fanoutDemo.state.scheduled", timeout=5_000)  # last frame drawn
    state: dict[str, Any] = await page.evaluate(
        "({status: fanoutDemo.state.status, events: fanoutDemo.state.events, renders: fanoutDemo.state.renders,"
        " lastSeq: fanoutDemo.state.lastSeq, connections: fanoutDemo.state.connections, texts: fanoutDemo.text(),"
        " resumes: fanoutDemo.state.resumes, dropDisabled: document.getElementById('drop').disabled})"
    )
    return state


async def test_page_starts_a_recorded_case_and_renders_it_as_markdown(stack: LocalStack, browser: Any) -> None:
    provider, directory, case = MARKDOWN_CASE
    page = await new_page(browser)
    await start_from_page(page, stack.base_url, provider, case)
    state = await finished_state(page)
    assert state["status"] == "completed"
    assert state["texts"] == golden_blocks(directory, case)
    assert state["events"] == state["lastSeq"]
    assert state["dropDisabled"], "Drop must be disabled once the stream ended"
    # The reasoning opens with **Planning the lookup**: Markdown bold, not asterisks.
    assert await page.inner_text(".block[data-kind='reasoning'] .body strong") == "Planning the lookup"
    assert "**" not in await page.inner_text("#blocks")
    # The tool call shows its name and its arguments, parsed, once its block closed.
    assert await page.inner_text(".block[data-kind='tool_call'] .tool-name") == "get_weather"
    assert '"city": "Zürich"' in await page.inner_text(".block[data-kind='tool_call'] .args")
    assert "stream_id=" in page.url, "the page keeps the stream in its URL"
    assert await page.inner_text("#status") == "completed"
    assert page.errors == []


async def test_drop_resumes_from_last_seq_and_status_returns_to_streaming(stack: LocalStack, browser: Any) -> None:
    provider, directory, case = CASE
    async with CuttingProxy(stack.publisher_port, cut_after_events=0) as proxy:   # records requests only
        page = await new_page(browser)
        await start_from_page(page, f"http://127.0.0.1:{proxy.port}", provider, case, slow=True)
        await page.wait_for_function("window.fanoutDemo.state.lastSeq >= 3", timeout=30_000)
        assert await page.evaluate("fanoutDemo.state.terminal") is None, "the stream ended before the drop"
        await page.click("#drop")
        held = await page.evaluate("fanoutDemo.state.lastSeq")
        assert await page.evaluate("fanoutDemo.state.status") == "reconnecting"
        await page.wait_for_function("fanoutDemo.state.connections === 2", timeout=30_000)
        await page.wait_for_function("!window.fanoutDemo.state.scheduled", timeout=5_000)
        if SCREENSHOTS:
            await page.screenshot(path=f"{SCREENSHOTS}/demo-mid-stream.png", full_page=True)
        assert await page.evaluate("fanoutDemo.state.terminal") is None, "the stream ended before the reconnect"
        assert await page.inner_text("#status") == "streaming"
        assert await page.inner_text("#resumed") == f"resumed after seq {held}"
        assert not await page.is_disabled("#drop")
        state = await finished_state(page)
        log = await page.locator("#log li").all_text_contents()
        if SCREENSHOTS:
            await page.click("#stream summary.meta")  # open the connection log
            await page.screenshot(path=f"{SCREENSHOTS}/demo-end.png", full_page=True)
    event_requests = [r.split("\r\n", 1)[0] for r in proxy.requests if "/events" in r.split("\r\n", 1)[0]]
    assert len(event_requests) == 2, event_requests
    assert f"last_event_id={held}." in event_requests[1]  # the id held: <seq>.<epoch>
    assert state["resumes"] == [held]
    assert log == ["connection 1 open", f"seq 1 stream.start: {provider} slow-{case}",
                   f"dropped the connection after seq {held}; resuming from it",
                   f"connection 2 open: resumed after seq {held}", f"seq {state['lastSeq']} stream.done: completed"]
    assert state["status"] == "completed"
    assert state["texts"] == golden_blocks(directory, case)
    assert state["events"] == state["lastSeq"], "an event was applied twice or skipped"
    assert state["dropDisabled"]
    assert page.errors == []


async def test_model_html_is_shown_as_text_never_inserted_or_executed(stack: LocalStack, browser: Any) -> None:
    page = await new_page(browser)
    await start_from_page(page, stack.base_url, "openai_chat", UNSAFE_CASE)
    state = await finished_state(page)
    assert state["status"] == "completed"
    assert state["texts"] == ["".join(UNSAFE_DELTAS)]
    body = ".block[data-kind='text'] .body"
    assert await page.inner_text(f"{body} strong") == "Bold"
    assert await page.locator(f"{body} li").all_inner_texts() == ["first item", "second item"]
    assert await page.locator("#blocks img, #blocks script, #blocks [onerror]").count() == 0
    assert await page.evaluate("window.__pwned") is None
    hrefs = await page.locator(f"{body} a").evaluate_all("links => links.map((a) => a.getAttribute('href'))")
    assert all(not (h or "").lower().startswith("javascript:") for h in hrefs), hrefs
    shown = await page.inner_text(body)
    assert "<img src=x onerror=" in shown, "the model's HTML is shown as text"
    assert "<script>window.__pwned" in shown
    assert page.errors == []


async def test_page_resumes_after_network_cut_with_last_event_id(stack: LocalStack, browser: Any) -> None:
    provider, directory, case = CASE
    async with CuttingProxy(stack.publisher_port, cut_after_events=4) as proxy:
        page = await new_page(browser)  # started from the form: its history, event by event (no snapshot)
        await start_from_page(page, f"http://127.0.0.1:{proxy.port}", provider, case)
        state = await finished_state(page)
        body_text = await page.inner_text("#blocks")
    event_requests = [r for r in proxy.requests if "/events" in r.split("\r\n", 1)[0]]
    assert proxy.cuts == 1
    assert len(event_requests) >= 2, "the browser never reconnected"
    # The cut falls inside an HTTP chunk, whose tail the browser may drop: it resumes from
    # the last event it dispatched, one of the four relayed.
    resumed = [line for line in event_requests[1].lower().split("\r\n") if line.startswith("last-event-id:")]
    assert resumed, event_requests[1]
    seq, epoch = parse_event_id(resumed[0].split(":")[1].strip())
    assert 1 <= seq <= 4
    assert epoch is not None  # the browser sends back the id it held: <seq>.<epoch>
    assert state["resumes"] == [seq]
    assert state["status"] == "completed"
    assert state["texts"] == golden_blocks(directory, case)
    assert state["events"] == state["lastSeq"], "an event was applied twice or skipped"
    for text in golden_blocks(directory, case):
        assert text.splitlines()[0] in body_text


async def test_a_finished_stream_opened_by_link_arrives_as_one_snapshot(stack: LocalStack, browser: Any) -> None:
    provider, directory, case = MARKDOWN_CASE
    stream_id, token = await submit(stack, provider, case)
    await finished_state(await _opened(browser, stack, stream_id, token))  # let it finish, read once
    async with CuttingProxy(stack.publisher_port, cut_after_events=0) as proxy:   # records requests only
        page = await new_page(browser)
        await page.goto(f"http://127.0.0.1:{proxy.port}/demo?stream_id={stream_id}&token={token}")
        state = await finished_state(page)
        log = await page.locator("#log li").all_text_contents()
    event_requests = [r.split("\r\n", 1)[0] for r in proxy.requests if "/events" in r.split("\r\n", 1)[0]]
    assert len(event_requests) == 1, event_requests
    assert "snapshot=1" in event_requests[0]
    assert state["status"] == "completed"
    assert state["texts"] == golden_blocks(directory, case)
    assert state["events"] == state["lastSeq"]
    blocks = len(state["texts"])
    assert log == ["connection 1 open", f"seq {state['lastSeq']} stream.snapshot: {blocks} blocks, completed"]
    assert await page.inner_text(".block[data-kind='reasoning'] .body strong") == "Planning the lookup"
    assert '"city": "Zürich"' in await page.inner_text(".block[data-kind='tool_call'] .args")
    assert page.errors == []


async def test_a_running_stream_opened_by_link_gets_a_snapshot_then_its_live_events(stack: LocalStack,
                                                                                    browser: Any) -> None:
    provider, directory, case = CASE
    stream_id, token = await submit(stack, provider, "slow-" + case)
    first = await _opened(browser, stack, stream_id, token)
    await first.wait_for_function("window.fanoutDemo.state.lastSeq >= 4", timeout=30_000)
    page = await _opened(browser, stack, stream_id, token)  # a second tab, joining late
    state = await finished_state(page)
    log = await page.locator("#log li").all_text_contents()
    seq, kind = log[1].split()[1:3]
    assert kind == "stream.snapshot:", log
    assert int(seq) >= 4  # the late joiner got what was stored in one message
    assert state["status"] == "completed"
    assert state["texts"] == golden_blocks(directory, case)
    assert state["events"] == state["lastSeq"], "an event was applied twice or skipped"
    assert page.errors == []


async def _opened(browser: Any, stack: LocalStack, stream_id: str, token: str) -> Any:
    page = await new_page(browser)
    await page.goto(f"{stack.base_url}/demo?stream_id={stream_id}&token={token}")
    return page


async def test_drop_button_resumes_a_stream_opened_by_link(stack: LocalStack, browser: Any) -> None:
    provider, directory, case = CASE
    stream_id, token = await submit(stack, provider, "slow-" + case)
    page = await new_page(browser)
    await page.goto(f"{stack.base_url}/demo?stream_id={stream_id}&token={token}")
    await page.wait_for_function("window.fanoutDemo.state.lastSeq >= 3", timeout=30_000)
    assert await page.evaluate("fanoutDemo.state.terminal") is None, "the stream ended before the drop"
    await page.click("#drop")
    state = await finished_state(page)
    assert state["connections"] == 2
    assert state["status"] == "completed"
    assert state["texts"] == golden_blocks(directory, case)
    assert state["events"] == state["lastSeq"]


async def test_renders_at_most_once_per_frame_however_fast_deltas_arrive(redis_url: str, browser: Any) -> None:
    with LocalStack(redis_url, workers=1, delay_ms=0, chunk_bytes=4096) as fast:
        provider, directory, case = "openai_chat", "openai_chat", "reasoning_text_tool_call_blocks"
        stream_id, token = await submit(fast, provider, case)
        page = await new_page(browser)
        await page.goto(f"{fast.base_url}/demo?stream_id={stream_id}&token={token}")
        state = await finished_state(page)
    assert state["texts"] == golden_blocks(directory, case)
    assert state["renders"] < state["events"], state


async def test_a_stream_written_again_under_the_page_is_shown_again_from_its_start(stack: LocalStack,
                                                                                    browser: Any) -> None:
    """Redis restored from an older snapshot re-runs a job: the page drops what it showed and starts over."""
    provider, _directory, case = CASE
    stream_id, token = await submit(stack, provider, f"slow-{case}")
    page = await new_page(browser)
    await page.goto(f"{stack.base_url}/demo?stream_id={stream_id}&token={token}")
    await page.wait_for_function("window.fanoutDemo && window.fanoutDemo.state.lastSeq >= 3", timeout=30_000)
    first = await page.evaluate("fanoutDemo.state.lastId")
    redis = client_for(stack.redis_url)
    try:  # the stream's keys as a restore leaves them, then a new generation written from seq 1
        keys = Keys(stack.prefix)
        async with redis.pipeline(transaction=True) as pipe:  # at once: the worker of the first one is fenced out
            pipe.delete(keys.events(stream_id), keys.meta(stream_id))
            pipe.hset(keys.meta(stream_id), mapping={"state": "running", "last_seq": 0, "token": 99})
            await pipe.execute()
        again = StreamWriter(redis, keys, stream_id, epoch=b"5ec0nd5ec0")
        await again.append(start(stream_id), block_start(stream_id, 2, 0), delta(stream_id, 3, 0, "Second answer."),
                           stop(stream_id, 4, 0), done(stream_id, 5), full=True)
    finally:
        await redis.aclose()
    state = await finished_state(page)
    log = await page.locator("#log li").all_text_contents()
    assert first.split(".")[1] != "5ec0nd5ec0"
    assert state["status"] == "completed"
    assert state["texts"] == ["Second answer."]  # nothing of the first generation is left on the page
    assert any(line.startswith("history reset:") for line in log), log
    assert await page.evaluate("fanoutDemo.state.lastId") == "5.5ec0nd5ec0"
    assert "history reset 1\u00d7" in await page.inner_text("#resumed")
    assert page.errors == []
