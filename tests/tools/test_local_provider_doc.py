"""docs/local-provider.md: its variables are real settings, and its commands work against an OpenAI-compatible server.

The model server is ``fanout upstream`` answering at a ``/v1`` root as Ollama does, with
no API key set (Ollama needs none); the job is the page's own ``--request`` body, on a
recorded Ollama case.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import msgspec

from publisher.settings import PublisherSettings
from tests.e2e.test_cli_messages import fanout
from tools.demo.stack import LocalStack
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "local-provider.md").read_text(encoding="utf-8")
OLLAMA_CASE = "ollama_parallel_calls_index_zero"
NO_KEYS = {"OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": "", "GEMINI_API_KEY": ""}
"""The page's setup: no provider key at all (Ollama needs none)."""
OTHER_VARIABLES = {"REDIS_URL", "OPENAI_API_KEY", "FANOUT_URL", "FANOUT_API_KEY"}
"""Read by the processes or the CLI directly, not settings fields."""


def test_every_variable_the_page_sets_is_a_setting_or_a_documented_variable() -> None:
    fields = {f"FANOUT_{field.name.upper()}" for cls in (WorkerSettings, PublisherSettings)
              for field in msgspec.structs.fields(cls)}
    named = set(re.findall(r"\b(?:FANOUT_[A-Z_]+|REDIS_URL|OPENAI_API_KEY)\b", PAGE))
    assert {"FANOUT_OPENAI_BASE_URL", "FANOUT_API_KEYS", "FANOUT_TOKEN_SECRET", "FANOUT_IDLE_TIMEOUT_S"} <= named
    assert named - fields <= OTHER_VARIABLES, named - fields - OTHER_VARIABLES


def test_the_pages_submit_command_runs_against_an_openai_compatible_server_without_a_key(
        single_redis_url: str) -> None:
    request = re.search(r"--request '(\{.*?\})'", PAGE)
    assert request is not None
    assert json.loads(request[1])["messages"]
    assert "export FANOUT_OPENAI_BASE_URL=http://127.0.0.1:11434/v1" in PAGE
    with LocalStack(single_redis_url, workers=1, delay_ms=1, env=NO_KEYS) as stack:
        assert stack.env()["FANOUT_OPENAI_BASE_URL"].endswith("/v1")  # an API root, as Ollama's
        done = fanout("submit", "--provider", "openai_chat", "--model", OLLAMA_CASE, "--request", request[1],
                      "--follow", "--format", "text",
                      env={"FANOUT_URL": stack.base_url, "FANOUT_API_KEY": stack.api_key})
        with urllib.request.urlopen(f"{stack.upstream_url}/_requests", timeout=10) as resp:
            (seen,) = json.loads(resp.read())
        warned = "no provider key is set" in stack.logs("worker-1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("── completed · finish_reason tool_calls")
    assert seen["path"] == "/v1/chat/completions"
    assert seen["auth_present"] is False  # no OPENAI_API_KEY: no Authorization header
    assert seen["body"]["model"] == OLLAMA_CASE
    assert seen["body"]["stream"] is True
    assert warned
