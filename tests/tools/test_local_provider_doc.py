"""docs/local-provider.md: its variables are real settings, its upstreams file parses, and its commands work.

The model servers are ``fanout upstream`` answering at a ``/v1`` root as Ollama and vLLM do,
with no key (``auth = "none"``); the page's own upstreams file, with only the addresses
and model names swapped for that server and its recorded Ollama and vLLM cases, is what
the worker and publisher read; the page's own ``fanout submit`` commands run against them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from publisher.settings import PublisherSettings
from tests.e2e.test_cli_messages import fanout
from tools.demo.stack import LocalStack
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "local-provider.md").read_text(encoding="utf-8")
OLLAMA_CASE = "ollama_parallel_calls_index_zero"
VLLM_CASE = "vllm_repeated_tool_id_and_name"
OTHER_VARIABLES = {"REDIS_URL", "OPENAI_API_KEY", "FANOUT_URL", "FANOUT_API_KEY"}
"""Read by the processes or the CLI directly, not settings fields."""


def page_toml() -> str:
    (block,) = re.findall(r"```toml\n(.*?)```", PAGE, flags=re.DOTALL)
    return str(block)


def submit_commands() -> list[list[str]]:
    """The page's ``fanout submit`` commands, as argument lists (line continuations joined)."""
    text = PAGE.replace("\\\n", " ")
    return [["submit", *re.findall(r"'[^']*'|\S+", line.split("fanout submit", 1)[1])]
            for line in text.splitlines() if line.startswith("fanout submit")]


def unquote(args: list[str]) -> list[str]:
    return [a[1:-1] if a.startswith("'") else a for a in args]


@pytest.fixture(scope="module")
def stack(single_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    running = LocalStack(single_redis_url, workers=1, delay_ms=1)
    toml = (page_toml().replace("http://127.0.0.1:11434/v1", f"{running.upstream_url}/v1")
            .replace("http://127.0.0.1:8000/v1", f"{running.upstream_url}/v1")
            .replace("qwen2.5:0.5b", OLLAMA_CASE))
    path = tmp_path_factory.mktemp("local") / "local.toml"
    path.write_text(toml, encoding="utf-8")
    running.extra_env = {"FANOUT_UPSTREAMS_FILE": str(path), "OPENAI_API_KEY": ""}
    with running:
        yield running


def test_every_variable_the_page_sets_is_a_setting_or_a_documented_variable() -> None:
    fields = {f"FANOUT_{field.name.upper()}" for cls in (WorkerSettings, PublisherSettings)
              for field in msgspec.structs.fields(cls)}
    named = set(re.findall(r"\b(?:FANOUT_[A-Z_]+|REDIS_URL|OPENAI_API_KEY)\b", PAGE))
    assert {"FANOUT_UPSTREAMS_FILE", "FANOUT_API_KEYS", "FANOUT_TOKEN_SECRET", "FANOUT_IDLE_TIMEOUT_S"} <= named
    assert named - fields <= OTHER_VARIABLES, named - fields - OTHER_VARIABLES


def test_the_pages_upstreams_file_is_what_fanout_upstreams_lists(stack: LocalStack) -> None:
    parsed = tomllib.loads(page_toml())
    assert {name: e["auth"] for name, e in parsed["endpoints"].items()} == {"ollama": "none", "vllm": "none"}
    done = subprocess.run([sys.executable, "-m", "fanout_cli", "upstreams", "--json"], capture_output=True, text=True,
                          env=stack.env(), cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert {"ollama", "vllm", "local-small"} <= set(re.findall(r'"([a-z-]+)"', done.stdout))


def test_the_pages_submit_commands_complete_through_an_endpoint_and_a_route(stack: LocalStack) -> None:
    by_endpoint, by_route = submit_commands()
    assert by_endpoint[by_endpoint.index("--endpoint") + 1] == "ollama"
    assert by_route[by_route.index("--model") + 1] == "local-small"
    by_endpoint[by_endpoint.index("--model") + 1] = OLLAMA_CASE  # the recorded Ollama answer stands for the model
    env = {"FANOUT_URL": stack.base_url, "FANOUT_API_KEY": stack.api_key}
    for args in (by_endpoint, by_route):
        done = fanout(*unquote(args), "--format", "text", env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1].startswith("── completed · finish_reason tool_calls")
    with urllib.request.urlopen(f"{stack.upstream_url}/_requests", timeout=10) as resp:
        seen = json.loads(resp.read())
    assert [(r["path"], r["body"]["model"], r["auth_present"]) for r in seen] == [
        ("/v1/chat/completions", OLLAMA_CASE, False)] * 2  # auth = "none": no Authorization header


def test_the_vllm_endpoint_of_the_page_streams_too(stack: LocalStack) -> None:
    done = fanout("submit", "--provider", "openai_chat", "--endpoint", "vllm", "--model", VLLM_CASE,
                  "--request", '{"messages": []}', "--format", "text", "--follow",
                  env={"FANOUT_URL": stack.base_url, "FANOUT_API_KEY": stack.api_key})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("── completed")
