"""``fanout upstreams``; ``fanout worker`` and ``fanout publisher`` refusing a bad upstreams file (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD = """
[endpoints.vllm]
api = "openai_chat"
url = "http://vllm.internal:8000/v1"
auth = "none"

[endpoints.azure-east]
api = ["openai_chat", "openai_responses"]
platform = "azure"
url = "https://myres.openai.azure.com/openai/v1"
auth = "api-key"
secret_env = "AZURE_OPENAI_KEY"

[models."gpt-4o"]
endpoints = ["azure-east", "vllm"]
upstream_model = { azure-east = "gpt4o-prod" }
"""
SECRET = "azure-secret-value-1234567890"


def fanout(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_") and k != "AZURE_OPENAI_KEY"}
    return subprocess.run([sys.executable, "-m", "fanout_cli", *args], capture_output=True, text=True,
                          env={**base, **env}, cwd=ROOT, timeout=60, check=False)


def test_upstreams_lists_endpoints_and_routes_without_secrets(tmp_path: Path) -> None:
    path = tmp_path / "upstreams.toml"
    path.write_text(GOOD)
    done = fanout("upstreams", env={"FANOUT_UPSTREAMS_FILE": str(path), "AZURE_OPENAI_KEY": SECRET})
    assert done.returncode == 0, done.stderr
    assert "azure-east  openai_chat/openai_responses  azure     api-key  https://myres.openai.azure.com/openai/v1" \
        in done.stdout
    assert "env AZURE_OPENAI_KEY" in done.stdout
    assert "gpt-4o: azure-east (gpt4o-prod), vllm (gpt-4o)" in done.stdout
    assert SECRET not in done.stdout + done.stderr


def test_upstreams_json_has_the_same_listing(tmp_path: Path) -> None:
    path = tmp_path / "upstreams.toml"
    path.write_text(GOOD)
    done = fanout("upstreams", "--json", env={"FANOUT_UPSTREAMS_FILE": str(path)})
    listing = json.loads(done.stdout)
    assert [e["name"] for e in listing["endpoints"]] == ["vllm", "azure-east"]
    assert listing["routes"] == [{"model": "gpt-4o", "endpoints": [{"endpoint": "azure-east", "model": "gpt4o-prod"},
                                                                   {"endpoint": "vllm", "model": "gpt-4o"}]}]


@pytest.mark.parametrize("command", ["worker", "publisher", "upstreams"])
def test_a_mistake_in_the_file_is_exit_2_naming_file_table_and_key(tmp_path: Path, command: str) -> None:
    path = tmp_path / "upstreams.toml"
    path.write_text(GOOD.replace('auth = "none"', 'auth = "nope"'))
    done = fanout(command, env={"FANOUT_UPSTREAMS_FILE": str(path), "FANOUT_DEV": "1"})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (f"fanout {command}: bad upstreams file {path}: "
                                                    "[endpoints.vllm] key 'auth': "
                                   "must be one of bearer, api-key, x-api-key, x-goog-api-key, google, aws, none")


@pytest.mark.parametrize("command", ["worker", "publisher", "upstreams"])
def test_a_file_nested_past_the_parser_is_exit_2_not_a_traceback(tmp_path: Path, command: str) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 2000 + "]" * 2000 + "\n")  # tomllib recurses once per level
    done = fanout(command, env={"FANOUT_UPSTREAMS_FILE": str(path), "FANOUT_DEV": "1"})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (f"fanout {command}: bad upstreams file {path}: "
                                                    "arrays or inline tables nested too deeply")


def test_worker_refuses_an_endpoint_whose_secret_variable_is_unset(tmp_path: Path) -> None:
    path = tmp_path / "upstreams.toml"
    path.write_text(GOOD)
    done = fanout("worker", env={"FANOUT_UPSTREAMS_FILE": str(path)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (f"fanout worker: bad upstreams file {path}: [endpoints.azure-east] key "
                                   "'secret_env': variable AZURE_OPENAI_KEY is empty or unset; it must hold the secret")


def test_worker_refuses_an_unreadable_secret_file(tmp_path: Path) -> None:
    path = tmp_path / "upstreams.toml"
    path.write_text(GOOD.replace('secret_env = "AZURE_OPENAI_KEY"', f'secret_file = "{tmp_path}/missing"'))
    done = fanout("worker", env={"FANOUT_UPSTREAMS_FILE": str(path)})
    assert done.returncode == 2, done.stderr
    assert f"key 'secret_file': cannot read {tmp_path}/missing: No such file or directory" in done.stderr
