"""The Python client and the submit/tail/demo commands against the whole stack as real processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from fanout_client import FanoutClient, PublisherUnreachableError, StreamUnavailableError
from fanout_client.reconnect import backoff_s
from schema.contract import StreamDone, is_terminal, parse_event_id
from schema.reducer import reduce
from schema.validate import validate
from tests.conftest import TOPOLOGIES
from tests.e2e.proxy import CuttingProxy
from tools.demo.stack import LocalStack, free_port
from tools.replay import replay_file

ROOT = Path(__file__).resolve().parents[2]
CASE = ("openai_chat", "openai_chat", "reasoning_text_tool_call_blocks")


@pytest.fixture(scope="module", params=TOPOLOGIES)
def stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    """The local stack (2 workers, 1 publisher) on a single node, then on the test cluster."""
    cluster = request.param == "cluster"
    url = request.getfixturevalue("cluster_redis_url" if cluster else "single_redis_url")
    with LocalStack(url, workers=2, delay_ms=30, chunk_bytes=64,
                    env={"FANOUT_SSE_RETRY_MS": "200", "FANOUT_REDIS_CLUSTER": "1" if cluster else "0",
                         "FANOUT_JOB_SHARDS": "4"}) as running:
        yield running


def golden(directory: str, case: str) -> dict[str, object]:
    events, _ = replay_file(ROOT / "transcripts" / directory / f"{case}.sse")
    return comparable(events)


def comparable(events: list) -> dict[str, object]:  # type: ignore[type-arg]
    result = msgspec.to_builtins(reduce(events))
    return {k: result[k] for k in ("status", "finish_reason", "blocks", "usage")}


async def test_client_follows_a_stream_to_its_golden_result(stack: LocalStack) -> None:
    provider, directory, case = CASE
    async with FanoutClient(stack.base_url, api_key=stack.api_key) as client:
        sub = await client.submit(provider=provider, model=case, request={"messages": []})
        events = [e async for e in client.events(sub.stream_id, token=sub.token)]
    assert sub.token_scope == "public"
    assert validate(events) == []
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert comparable(events) == golden(directory, case)


async def test_client_resumes_by_itself_after_a_cut_without_loss_or_repeat(stack: LocalStack) -> None:
    provider, directory, case = CASE
    async with FanoutClient(stack.base_url, api_key=stack.api_key) as client:
        sub = await client.submit(provider=provider, model=case, request={"messages": []})
    async with CuttingProxy(stack.publisher_port, cut_after_events=3) as proxy, \
            FanoutClient(f"http://127.0.0.1:{proxy.port}", api_key=stack.api_key) as client:
        events = [e async for e in client.events(sub.stream_id, token=sub.token)]
        assert client.reconnects >= 1
    heads = [r.lower() for r in proxy.requests if "/events" in r.split("\r\n", 1)[0]]
    resumed = [line for line in heads[1].split("\r\n") if line.startswith("last-event-id:")]
    assert resumed, heads[1]
    seq, epoch = parse_event_id(resumed[0].split(":")[1].strip())
    assert 1 <= seq <= 3  # the last event received before the cut, with its generation
    assert epoch == events[0].epoch
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert comparable(events) == golden(directory, case)


async def test_client_stops_at_once_on_204_after_the_end(stack: LocalStack) -> None:
    provider, _, case = CASE
    async with FanoutClient(stack.base_url, api_key=stack.api_key) as client:
        sub = await client.submit(provider=provider, model=case, request={"messages": []})
        events = [e async for e in client.events(sub.stream_id, token=sub.token)]
        assert is_terminal(events[-1])
        again = [e async for e in client.events(sub.stream_id, token=sub.token, last_event_id=events[-1].seq)]
        tail = [e async for e in client.events(sub.stream_id, token=sub.token, last_event_id=events[-3].seq)]
    assert again == []
    assert client.reconnects == 0
    assert [e.seq for e in tail] == [events[-2].seq, events[-1].seq]
    assert isinstance(tail[-1], StreamDone)


async def test_client_raises_on_unknown_stream(stack: LocalStack) -> None:
    async with FanoutClient(stack.base_url, api_key=stack.api_key) as client:
        with pytest.raises(StreamUnavailableError) as info:
            _ = [e async for e in client.events("st_never_submitted")]
    assert info.value.status == 404


async def test_result_helper_assembles_the_stream(stack: LocalStack) -> None:
    provider, directory, case = CASE
    async with FanoutClient(stack.base_url, api_key=stack.api_key) as client:
        sub = await client.submit(provider=provider, model=case, request={"messages": []})
        result = await client.result(sub.stream_id, token=sub.token)
    got = msgspec.to_builtins(result)
    assert {k: got[k] for k in ("status", "finish_reason", "blocks", "usage")} == golden(directory, case)


async def test_client_raises_at_once_when_the_first_connection_is_refused() -> None:
    async with FanoutClient(f"http://127.0.0.1:{free_port()}", max_reconnects=3) as client:
        with pytest.raises(PublisherUnreachableError) as info:
            _ = [e async for e in client.events("st_x")]
        assert client.reconnects == 0
    assert "connection refused" in info.value.message


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "ftp://host", "http://[::1"])
def test_client_refuses_a_base_url_that_is_not_http(url: str) -> None:
    with pytest.raises(ValueError, match="URL"):
        FanoutClient(url)


async def test_client_says_the_base_url_must_not_end_in_v1(stack: LocalStack) -> None:
    async with FanoutClient(f"{stack.base_url}/v1", api_key=stack.api_key) as client:
        with pytest.raises(StreamUnavailableError) as info:
            await client.submit(provider="anthropic", model="m", request={})
    assert info.value.status == 404
    assert "without /v1" in info.value.message


def test_backoff_honours_retry_hint_then_grows_with_jitter() -> None:
    assert backoff_s(200, 1) == 0.2
    assert 0.2 <= backoff_s(200, 2) <= 0.4
    assert backoff_s(200, 30) <= 30.0


def _fanout(stack: LocalStack, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FANOUT_URL": stack.base_url, "FANOUT_API_KEY": stack.api_key}
    return subprocess.run([sys.executable, "-m", "fanout_cli", *args], input=stdin, capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=60, check=False)


def test_submit_follow_prints_every_event_then_tail_result_assembles(stack: LocalStack) -> None:
    provider, directory, case = CASE
    done = _fanout(stack, "submit", "--provider", provider, "--model", case, "--request", "-", "--follow",
                   stdin=json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    submission = json.loads(lines[0])
    assert submission["token_scope"] == "public"  # every field of the publisher's answer
    events = [json.loads(line) for line in lines[1:]]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["type"] == "stream.done"
    tail = _fanout(stack, "tail", submission["stream_id"], "--result")
    assert tail.returncode == 0, tail.stderr
    result = json.loads(tail.stdout)
    assert {k: result[k] for k in ("status", "finish_reason", "blocks", "usage")} == golden(directory, case)


async def test_tail_result_reads_a_snapshot_not_the_history(stack: LocalStack) -> None:
    provider, directory, case = CASE
    done = _fanout(stack, "submit", "--provider", provider, "--model", case, "--request", "-", "--follow",
                   stdin="{}")
    stream_id = json.loads(done.stdout.splitlines()[0])["stream_id"]
    async with CuttingProxy(stack.publisher_port, cut_after_events=0) as proxy:   # records requests only
        env = {**os.environ, "FANOUT_URL": f"http://127.0.0.1:{proxy.port}", "FANOUT_API_KEY": stack.api_key}
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "fanout_cli", "tail", stream_id, "--result",
                                                    env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err
    requests = [r.split("\r\n", 1)[0] for r in proxy.requests if "/events" in r.split("\r\n", 1)[0]]
    assert len(requests) == 1, requests
    assert "snapshot=1" in requests[0]
    result = json.loads(out)
    assert {k: result[k] for k in ("status", "finish_reason", "blocks", "usage")} == golden(directory, case)


def test_tail_from_last_event_id_prints_only_the_rest(stack: LocalStack) -> None:
    provider, _, case = CASE
    done = _fanout(stack, "submit", "--provider", provider, "--model", case, "--request", "-", "--follow",
                   stdin="{}")
    submission = json.loads(done.stdout.splitlines()[0])
    total = len(done.stdout.splitlines()) - 1
    tail = _fanout(stack, "tail", submission["stream_id"], "--last-event-id", "5")
    assert [json.loads(line)["seq"] for line in tail.stdout.splitlines()] == list(range(6, total + 1))


def test_submit_with_bad_request_file_says_why(stack: LocalStack) -> None:
    bad = _fanout(stack, "submit", "--provider", "anthropic", "--model", "m", "--request", "-", stdin="[1]")
    assert bad.returncode == 2
    assert "JSON object" in bad.stderr


def test_demo_exits_zero_with_summary_table(redis_url: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url}
    demo = subprocess.run([sys.executable, "-m", "fanout_cli", "demo", "--delay-ms", "5"], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "9/9 streams match their golden results" in demo.stdout
    assert "resumed @" in demo.stdout
    for provider in ("openai_chat", "openai_responses", "anthropic", "gemini"):
        assert provider in demo.stdout


def test_follow_exits_3_when_the_stream_fails(stack: LocalStack) -> None:
    done = _fanout(stack, "submit", "--provider", "anthropic", "--model", "error_after_partial_text",
                   "--request", "-", "--follow", stdin="{}")
    assert done.returncode == 3, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["type"] == "stream.error"


def test_demo_stops_every_process_on_sigterm(redis_url: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    demo = subprocess.Popen([sys.executable, "-m", "fanout_cli", "demo", "--delay-ms", "1", "--keep-running"],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert demo.stdout is not None
        lines = []
        for line in demo.stdout:
            lines.append(line)
            if "the stack is still running" in line:  # printed once the demo streams are done
                break
        publisher_url = next(line.split()[-1] for line in lines if "publisher:" in line)
        port = int(publisher_url.rsplit(":", 1)[1])
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=60) == 0  # the stop a user asks for; the demo itself matched
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        if demo.stdout is not None:
            demo.stdout.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
