"""The whole stack as processes with an upstreams file: `fanout submit --endpoint`, a route, a 400 naming both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.demo.stack import LocalStack

ROOT = Path(__file__).resolve().parents[2]
CASE = "reasoning_text_tool_call_blocks"


@pytest.fixture(scope="module")
def stack(single_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """One worker and one publisher reading the same upstreams file, whose endpoint is the stack's fake provider."""
    running = LocalStack(single_redis_url, workers=1, delay_ms=5, chunk_bytes=64)
    path = tmp_path_factory.mktemp("upstreams") / "upstreams.toml"
    path.write_text(f"""
[endpoints.local]
api = "openai_chat"
url = "{running.upstream_url}/v1"
auth = "none"

[models."house-model"]
endpoints = ["local"]
upstream_model = {{ local = "{CASE}" }}
""")
    running.extra_env = {"FANOUT_UPSTREAMS_FILE": str(path)}
    with running:
        yield running


def fanout(stack: LocalStack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FANOUT_URL": stack.base_url, "FANOUT_API_KEY": stack.api_key}
    return subprocess.run([sys.executable, "-m", "fanout_cli", *args], input='{"messages": []}', capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=60, check=False)


def events_of(done: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()[1:]]


def test_submit_to_a_named_endpoint_streams_the_case(stack: LocalStack) -> None:
    events = events_of(fanout(stack, "submit", "--provider", "openai_chat", "--model", CASE, "--endpoint", "local",
                              "--request", "-", "--follow"))
    assert events[0]["model"] == CASE
    assert events[-1]["type"] == "stream.done"


def test_a_route_sends_its_upstream_model(stack: LocalStack) -> None:
    events = events_of(fanout(stack, "submit", "--provider", "openai_chat", "--model", "house-model",
                              "--request", "-", "--follow"))
    assert events[-1]["type"] == "stream.done"
    assert [e["type"] for e in events].count("block.start") >= 2  # the case's blocks, not an error


def test_a_provider_the_endpoint_does_not_speak_is_refused_naming_both(stack: LocalStack) -> None:
    done = fanout(stack, "submit", "--provider", "anthropic", "--model", "m", "--endpoint", "local", "--request", "-")
    assert done.returncode == 1
    assert "provider 'anthropic' is not spoken by endpoint 'local', which speaks openai_chat" in done.stderr
    assert "Traceback" not in done.stderr
