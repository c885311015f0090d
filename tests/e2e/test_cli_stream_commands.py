"""``fanout status``, ``cancel`` and ``token``, and the readable text mode of ``submit --follow`` and ``tail``.

Each test runs the real ``fanout`` entry point as a subprocess against a real stack
(fake upstream, a worker, the publisher, Redis). The terminal case runs ``tail`` on a
pseudo-terminal, as a person's shell would.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanout_client.contract import decode_event
from fanout_client.text_view import RULE, TextView
from tests.e2e.test_cli_messages import CASE, client_env, fanout, golden_result, one_line
from tools.demo.stack import LocalStack

ROOT = Path(__file__).resolve().parents[2]
PTY_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def stack(single_redis_url: str) -> Iterator[LocalStack]:
    with LocalStack(single_redis_url, workers=1, delay_ms=5, chunk_bytes=256, slow_delay_ms=1000) as running:
        yield running


@pytest.fixture(scope="module")
def finished(stack: LocalStack) -> str:
    provider, case = CASE
    done = fanout("submit", "--provider", provider, "--model", case, "--request", "{}", "--follow",
                  env=client_env(stack))
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout.splitlines()[0])["stream_id"])


def submit_slow(stack: LocalStack) -> str:
    provider, case = CASE
    done = fanout("submit", "--provider", provider, "--model", f"slow-{case}", "--request", "{}",
                  env=client_env(stack))
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["stream_id"])


def test_status_prints_the_state_and_the_assembled_result(stack: LocalStack, finished: str) -> None:
    done = fanout("status", finished, env=client_env(stack))
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["status"] == "completed"
    result = status["result"]
    assert {k: result[k] for k in ("status", "finish_reason", "blocks", "usage")} == golden_result("anthropic",
                                                                                                  CASE[1])


def test_token_mints_a_read_token_that_status_and_tail_accept(stack: LocalStack, finished: str) -> None:
    done = fanout("token", finished, env=client_env(stack))
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["stream_id"], answer["token_scope"]) == (finished, "public")
    bare = fanout("token", finished, "--bare", "--scope", "internal", env=client_env(stack))
    token = bare.stdout.strip()
    assert bare.returncode == 0, bare.stderr
    assert token.startswith("v1.")
    assert "\n" not in token
    no_key = {"FANOUT_URL": stack.base_url, "FANOUT_TOKEN": token}
    assert json.loads(fanout("status", finished, env=no_key).stdout)["status"] == "completed"
    assert fanout("tail", finished, env=no_key).returncode == 0


def test_token_without_an_api_key_says_which_variable(stack: LocalStack, finished: str) -> None:
    one_line(fanout("token", finished, env={"FANOUT_URL": stack.base_url}), 1, "FANOUT_API_KEY")


def test_cancel_stops_a_running_stream_and_tail_exits_3_cancelled(stack: LocalStack) -> None:
    stream_id = submit_slow(stack)
    done = fanout("cancel", stream_id, env=client_env(stack))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"stream_id": stream_id, "state": "cancelling"}
    tail = fanout("tail", stream_id, "--format", "json", env=client_env(stack))
    one_line(tail, 3, "cancelled")
    assert json.loads(tail.stdout.splitlines()[-1])["status"] == "cancelled"


def test_cancel_of_a_finished_stream_says_it_already_ended(stack: LocalStack, finished: str) -> None:
    one_line(fanout("cancel", finished, env=client_env(stack)), 1, "already ended (completed)")


def test_status_of_an_unknown_stream_says_to_check_the_id(stack: LocalStack) -> None:
    one_line(fanout("status", "st_nosuchstream", env=client_env(stack)), 1, "404", "check the id")


def test_new_commands_help_lists_their_exit_statuses() -> None:
    for command in ("status", "cancel", "token"):
        done = fanout(command, "--help")
        assert done.returncode == 0, done.stderr
        assert "exit status:" in done.stdout
        assert "(env FANOUT_URL" in " ".join(done.stdout.split())


def _golden_text() -> tuple[list[str], str]:
    result = golden_result("anthropic", CASE[1])
    texts = [str(block["text"]) for block in result["blocks"]]  # type: ignore[union-attr]
    return texts, str(result["status"])


def test_tail_format_text_prints_the_answer_with_labelled_blocks(stack: LocalStack, finished: str) -> None:
    done = fanout("tail", finished, "--format", "text", env=client_env(stack))
    assert done.returncode == 0, done.stderr
    texts, status = _golden_text()
    for text in texts:
        assert text in done.stdout
    assert done.stdout.startswith(f"{RULE} {finished} · anthropic {CASE[1]}\n")
    assert "[reasoning]\n" in done.stdout
    assert done.stdout.splitlines()[-1].startswith(f"{RULE} {status} · finish_reason ")
    assert "{" not in done.stdout.splitlines()[0]


def _on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``fanout ARGS`` with standard output on a pseudo-terminal; return its exit status and output."""
    parent, child = pty.openpty()
    base = {k: v for k, v in os.environ.items() if k not in ("FANOUT_URL", "FANOUT_API_KEY", "FANOUT_TOKEN")}
    proc = subprocess.Popen([sys.executable, "-m", "fanout_cli", *args], stdout=child, stderr=subprocess.PIPE,
                            env={**base, **env}, cwd=ROOT)
    os.close(child)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(parent, 4096)
        except OSError:  # EIO: the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(parent)
    code = proc.wait(timeout=PTY_TIMEOUT_S)
    assert proc.stderr is not None
    proc.stderr.close()
    return code, b"".join(chunks).decode().replace("\r\n", "\n")


def test_tail_on_a_terminal_prints_text_and_json_when_piped(stack: LocalStack, finished: str) -> None:
    code, shown = _on_a_terminal(["tail", finished], client_env(stack))
    assert code == 0
    texts, _ = _golden_text()
    assert texts[-1] in shown
    assert shown.startswith(f"{RULE} {finished}")
    piped = fanout("tail", finished, env=client_env(stack))
    first = piped.stdout.splitlines()[0]
    assert json.loads(first)["seq"] == 1


def test_submit_follow_on_a_terminal_prints_text(stack: LocalStack) -> None:
    provider, case = CASE
    code, shown = _on_a_terminal(["submit", "--provider", provider, "--model", case, "--request", "{}", "--follow"],
                                 client_env(stack))
    assert code == 0
    lines = shown.splitlines()
    assert lines[0].startswith(f"{RULE} submitted st_")
    assert lines[-1].startswith(f"{RULE} completed")


def test_text_view_labels_interleaved_blocks_and_ends_on_its_own_line() -> None:
    raw = [
        {"type": "stream.start", "provider": "openai_chat", "model": "m", "metadata": {}},
        {"type": "block.start", "block": {"id": "b0", "index": 0, "kind": "text"}},
        {"type": "block.delta", "block": {"id": "b0", "index": 0, "kind": "text"},
         "delta": {"kind": "text", "text": "Hi"}},
        {"type": "block.start", "block": {"id": "b1", "index": 1, "kind": "tool_call"},
         "tool": {"call_id": "c1", "name": "get"}},
        {"type": "block.delta", "block": {"id": "b1", "index": 1, "kind": "tool_call"},
         "delta": {"kind": "json_text", "text": "{\"a\": 1}"}},
        {"type": "block.delta", "block": {"id": "b0", "index": 0, "kind": "text"},
         "delta": {"kind": "signature", "text": "opaque"}},
        {"type": "block.delta", "block": {"id": "b0", "index": 0, "kind": "text"},
         "delta": {"kind": "text", "text": "!"}},
        {"type": "stream.error", "status": "interrupted", "usage": None, "finish_reason": None,
         "error": {"category": "transport", "retryable": True, "provider_code": None, "message": "lost"}},
    ]
    view = TextView()
    out = "".join(view.render(decode_event(json.dumps({"stream_id": "s", "seq": n, "ts": 0, **e}).encode()))
                  for n, e in enumerate(raw, 1))
    assert out == (f"{RULE} s · openai_chat m\nHi\n[tool call get (c1)]\n{{\"a\": 1}}\n[text]\n!\n"
                   f"{RULE} interrupted (transport, retryable): lost\n")


def test_fanout_client_has_the_same_three_commands(stack: LocalStack, finished: str) -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("FANOUT_URL", "FANOUT_API_KEY", "FANOUT_TOKEN")}
    done = subprocess.run([sys.executable, "-c", "from fanout_client.cli import main; raise SystemExit(main())",
                           "status", finished], capture_output=True, text=True, check=False, timeout=60, cwd=ROOT,
                          env={**base, **client_env(stack), "PYTHONPATH": str(ROOT / "client")})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    refused = subprocess.run([sys.executable, "-c", "from fanout_client.cli import main; raise SystemExit(main())",
                              "cancel", finished], capture_output=True, text=True, check=False, timeout=60, cwd=ROOT,
                             env={**base, **client_env(stack), "PYTHONPATH": str(ROOT / "client")})
    assert refused.returncode == 1
    assert refused.stderr.startswith("fanout-client cancel: stream ")
    assert "already ended (completed)" in refused.stderr
