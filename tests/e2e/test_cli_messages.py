"""Every user mistake on the command line: one line that says what to do, no traceback, a documented exit status.

Each test runs the real ``fanout`` entry point as a subprocess, against a real
publisher, worker, fake upstream and Redis where the mistake needs one.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import redis
import redis.cluster

from schema.contract import encode_event
from schema.keys import Keys
from schema.reducer import reduce
from tests.worker.redis_proc import private_redis
from tools.demo.stack import LocalStack, free_port, wait_for_port
from tools.replay import replay_file

ROOT = Path(__file__).resolve().parents[2]
CASE = ("anthropic", "thinking_with_signature")
REDIS_SERVER = "/usr/bin/redis-server"


def fanout(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``fanout ARGS`` with the FANOUT_* client variables cleared unless given."""
    base = {k: v for k, v in os.environ.items() if k not in ("FANOUT_URL", "FANOUT_API_KEY", "FANOUT_TOKEN")}
    return subprocess.run([sys.executable, "-m", "fanout_cli", *args], input=stdin, capture_output=True, text=True,
                          env={**base, **(env or {})}, cwd=ROOT, timeout=timeout, check=False)


def one_line(done: subprocess.CompletedProcess[str], status: int, *words: str) -> str:
    """Assert the exit status, no traceback, and that stderr's last line holds every word; return it."""
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == status, (done.returncode, done.stderr)
    line = done.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in line, (word, line)
    return line


@pytest.fixture(scope="module")
def stack(single_redis_url: str) -> Iterator[LocalStack]:
    with LocalStack(single_redis_url, workers=1, delay_ms=5, chunk_bytes=256) as running:
        yield running


def client_env(stack: LocalStack, **extra: str) -> dict[str, str]:
    return {"FANOUT_URL": stack.base_url, "FANOUT_API_KEY": stack.api_key, **extra}


def golden_result(directory: str, case: str) -> dict[str, object]:
    events, _ = replay_file(ROOT / "transcripts" / directory / f"{case}.sse")
    result = msgspec.to_builtins(reduce(events))
    return {k: result[k] for k in ("status", "finish_reason", "blocks", "usage")}


@pytest.fixture(scope="module")
def finished(stack: LocalStack) -> tuple[str, int]:
    """A completed stream of CASE: (stream id, its last seq)."""
    provider, case = CASE
    done = fanout("submit", "--provider", provider, "--model", case, "--request", "-", "--follow",
                  env=client_env(stack), stdin="{}")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    return json.loads(lines[0])["stream_id"], json.loads(lines[-1])["seq"]


# --- tail --result: the whole stream's result -------------------------------------------------


@pytest.mark.parametrize("position", ["end", "middle"])
def test_tail_result_after_last_event_id_is_the_whole_streams(stack: LocalStack, finished: tuple[str, int],
                                                              position: str) -> None:
    stream_id, last = finished
    held = last if position == "end" else last // 2
    done = fanout("tail", stream_id, "--last-event-id", str(held), "--result", env=client_env(stack))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {k: result[k] for k in ("status", "finish_reason", "blocks", "usage")} == golden_result(*CASE)


def test_tail_at_the_end_of_a_failed_stream_exits_3_and_says_why(stack: LocalStack) -> None:
    done = fanout("submit", "--provider", "anthropic", "--model", "error_after_partial_text", "--request", "{}",
                  "--follow", env=client_env(stack))
    assert done.returncode == 3, done.stderr
    stream_id, last = json.loads(done.stdout.splitlines()[0])["stream_id"], json.loads(done.stdout.splitlines()[-1])
    again = fanout("tail", stream_id, "--last-event-id", str(last["seq"]), env=client_env(stack))
    assert again.stdout == ""
    one_line(again, 3, stream_id, "failed")


# --- the publisher's address -------------------------------------------------------------------


def test_url_without_scheme_is_refused_with_the_fix() -> None:
    done = fanout("tail", "st_x", env={"FANOUT_URL": "127.0.0.1:46951"})
    one_line(done, 2, "FANOUT_URL", "http://127.0.0.1:46951")


def test_connection_refused_names_fanout_url_and_exits_4() -> None:
    port = free_port()
    tail = fanout("tail", "st_x", env={"FANOUT_URL": f"http://127.0.0.1:{port}"}, timeout=30)
    one_line(tail, 4, f"127.0.0.1:{port}", "connection refused", "FANOUT_URL")
    submit = fanout("submit", "--url", f"http://127.0.0.1:{port}", "--provider", "anthropic", "--model", "m",
                    "--request", "{}", timeout=30)
    one_line(submit, 4, "connection refused", "--url")


def test_url_ending_in_v1_is_told_to_drop_it(stack: LocalStack) -> None:
    done = fanout("submit", "--provider", "anthropic", "--model", "m", "--request", "{}",
                  env=client_env(stack, FANOUT_URL=f"{stack.base_url}/v1"))
    one_line(done, 1, "without /v1", f"({stack.base_url})", "FANOUT_URL")


def test_url_of_another_server_is_not_taken_for_an_unknown_stream(stack: LocalStack) -> None:
    done = fanout("tail", "st_x", env=client_env(stack, FANOUT_URL=stack.upstream_url))
    one_line(done, 1, "not a route of a fanout publisher", "root URL", "FANOUT_URL")


def test_unknown_stream_says_to_check_the_id(stack: LocalStack) -> None:
    one_line(fanout("tail", "st_never", env=client_env(stack)), 1, "no stream st_never", "check the id")


# --- credentials -------------------------------------------------------------------------------


def test_wrong_api_key_is_refused_not_missing(stack: LocalStack) -> None:
    done = fanout("submit", "--provider", "anthropic", "--model", "m", "--request", "{}",
                  env=client_env(stack, FANOUT_API_KEY="wrong"))
    line = one_line(done, 1, "refused the API key", "FANOUT_API_KEY", "--api-key")
    assert "required" not in line


def test_missing_api_key_says_which_variable(stack: LocalStack) -> None:
    done = fanout("submit", "--provider", "anthropic", "--model", "m", "--request", "{}",
                  env={"FANOUT_URL": stack.base_url})
    one_line(done, 1, "no credential", "FANOUT_API_KEY")


@pytest.mark.parametrize("token", ["bogus", "v1.bogus.mac"])
def test_bad_read_token_is_invalid_not_an_unknown_api_key(stack: LocalStack, finished: tuple[str, int],
                                                          token: str) -> None:
    stream_id, _ = finished
    done = fanout("tail", stream_id, "--token", token, env=client_env(stack))
    line = one_line(done, 1, "read token is invalid", f"POST /v1/streams/{stream_id}/tokens", "--token")
    assert "unknown API key" not in line


def test_publisher_problem_for_a_bad_token_says_how_to_get_one(stack: LocalStack, finished: tuple[str, int]) -> None:
    stream_id, _ = finished
    request = urllib.request.Request(f"{stack.base_url}/v1/streams/{stream_id}/events",
                                     headers={"Authorization": "Bearer v1.bogus.mac"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    problem = json.loads(info.value.read())
    assert info.value.code == 401
    assert f"POST /v1/streams/{stream_id}/tokens" in problem["detail"]


# --- submit's inputs ---------------------------------------------------------------------------


def test_request_path_that_does_not_exist_says_it_takes_a_file_or_stdin() -> None:
    done = fanout("submit", "--provider", "anthropic", "--model", "m", "--request", "nope.json")
    one_line(done, 2, "--request nope.json", "no such file", "- for stdin")


def test_request_accepts_the_json_object_inline(stack: LocalStack) -> None:
    done = fanout("submit", "--provider", "anthropic", "--model", CASE[1],
                  "--request", '{"messages": [{"role": "user", "content": "hi"}]}', env=client_env(stack))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stream_id"].startswith("st_")


@pytest.mark.parametrize(("value", "kind"), [("[1]", "array"), ('"hi"', "string"), ("null", "null")])
def test_request_inline_json_that_is_not_an_object_says_so_not_no_such_file(value: str, kind: str) -> None:
    done = fanout("submit", "--provider", "anthropic", "--model", "m", "--request", value)
    line = one_line(done, 2, "--request must be a JSON object", f"got a JSON {kind}")
    assert "no such file" not in line


def test_request_inline_that_is_not_json_names_the_option() -> None:
    one_line(fanout("submit", "--provider", "anthropic", "--model", "m", "--request", '{"a": 1'),
             2, "--request is not JSON", "JSON object")


@pytest.mark.parametrize("value", ["x", "[1]"])
def test_metadata_that_is_not_a_json_object_names_the_option(value: str) -> None:
    done = fanout("submit", "--provider", "anthropic", "--model", "m", "--request", "{}", "--metadata", value)
    one_line(done, 2, "--metadata", "JSON object")


def test_negative_last_event_id_is_a_usage_error() -> None:
    one_line(fanout("tail", "st_x", "--last-event-id", "-1"), 2, "--last-event-id", ">= 0")


def test_unknown_model_in_the_demo_stack_points_at_the_case_list(stack: LocalStack) -> None:
    done = fanout("submit", "--provider", "anthropic", "--model", "claude-sonnet-4-5", "--request", "{}",
                  "--follow", env=client_env(stack))
    one_line(done, 3, "not_found", "transcripts/anthropic/INDEX.md", "slow-")


# --- replay ------------------------------------------------------------------------------------


def test_replay_of_a_missing_file_says_so() -> None:
    one_line(fanout("replay", "transcripts/anthropic/nope.sse"), 2, "no such file", "- for stdin")


@pytest.mark.parametrize("directory", ["transcripts/anthropic", "transcripts"])
def test_replay_of_a_directory_says_to_give_a_file_and_names_one_that_exists(directory: str) -> None:
    line = one_line(fanout("replay", directory), 2, "is a directory")
    example = re.search(r"\(e\.g\. (\S+)\)", line)
    assert example, line
    assert (ROOT / example.group(1)).is_file()
    assert fanout("replay", example.group(1)).returncode in (0, 1)  # a body replay takes (valid or not)


@pytest.mark.parametrize(("path", "kind"), [
    ("transcripts/bedrock_converse/tool_use_input_fragments.eventstream", None),
    ("transcripts/bedrock_invoke/throttling_exception_only_message.eventstream", "bedrock_invoke"),
])
def test_replay_reads_bedrock_event_stream_bodies(path: str, kind: str | None) -> None:
    done = fanout("replay", *(["--provider", kind] if kind else []), path)
    assert (done.returncode, "Traceback" in done.stderr) == (0, False), done.stderr
    events, _ = replay_file(ROOT / path)
    assert done.stdout.splitlines()[-1] == encode_event(events[-1]).decode()


def test_replay_of_a_directory_looks_one_level_deep_and_prefers_sse(tmp_path: Path) -> None:
    """``fanout replay ~`` once walked the whole tree (10 s) and named a zoneinfo .json from a venv."""
    (tmp_path / "body.json").write_text("{}")  # a request body, beside the recording
    (tmp_path / "deep" / "er" / "still").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "still" / "a.sse").write_text("")
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "z.sse").write_text("")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "a.sse").write_text("")
    line = one_line(fanout("replay", "--provider", "anthropic", str(tmp_path)), 2, "is a directory")
    assert f"(e.g. {tmp_path / 'cases' / 'z.sse'})" in line, line
    (tmp_path / "cases" / "z.sse").unlink()
    line = one_line(fanout("replay", "--provider", "anthropic", str(tmp_path)), 2, "is a directory")
    assert f"(e.g. {tmp_path / 'body.json'})" in line, line
    (tmp_path / "body.json").unlink()
    line = one_line(fanout("replay", "--provider", "anthropic", str(tmp_path)), 2, "is a directory")
    assert f"(e.g. {tmp_path}/<case>.sse)" in line, line


def test_output_closed_early_stops_quietly_with_141() -> None:
    """``fanout replay ... | head -1``: the reader left; no traceback, no "Exception ignored", exit 141."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout now fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "fanout_cli", "replay", "transcripts/anthropic/simple_text.sse"],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == "", done.stderr


@pytest.mark.parametrize("directory", ["gemini_sse", "gemini_json_array"])
def test_replay_provider_gemini_detects_the_framing(directory: str) -> None:
    for path in sorted((ROOT / "transcripts" / directory).glob("*.sse")):
        by_dir = fanout("replay", str(path))
        by_name = fanout("replay", "--provider", "gemini", str(path))
        assert by_name.stdout == by_dir.stdout, path
        assert by_name.returncode == by_dir.returncode, path


def test_replay_provider_gemini_from_stdin_detects_a_json_array() -> None:
    path = ROOT / "transcripts" / "gemini_json_array" / "simple_text.sse"
    if not path.exists():
        path = sorted((ROOT / "transcripts" / "gemini_json_array").glob("*.sse"))[0]
    piped = fanout("replay", "--provider", "gemini", "-", stdin=path.read_text(encoding="utf-8"))
    assert piped.stdout == fanout("replay", str(path)).stdout


def test_replay_chunk_size_and_its_hidden_alias_chunk() -> None:
    path = "transcripts/anthropic/simple_text.sse"
    whole = fanout("replay", path)
    assert whole.returncode == 0, whole.stderr
    assert fanout("replay", "--chunk-size", "3", path).stdout == whole.stdout
    assert fanout("replay", "--chunk", "3", path).stdout == whole.stdout
    one_line(fanout("replay", "--chunk-size", "0", path), 2, "--chunk-size", ">= 1")
    assert "--chunk " not in fanout("replay", "--help").stdout


# --- help --------------------------------------------------------------------------------------


def test_top_level_help_shows_no_docstring_markup_and_the_exit_statuses() -> None:
    done = fanout("--help")
    assert done.returncode == 0
    assert "``" not in done.stdout
    assert ":class:" not in done.stdout
    assert ":func:" not in done.stdout
    for status in ("0", "1", "2", "3", "4"):
        assert f"    {status}  " in done.stdout


def test_every_subcommand_help_reads_without_markup_and_lists_exit_statuses() -> None:
    for command in ("replay", "worker", "publisher", "upstream", "submit", "tail", "demo", "health"):
        done = fanout(command, "--help")
        assert done.returncode == 0, (command, done.stderr)
        assert "``" not in done.stdout, command
        assert "exit status:" in done.stdout, command


def test_client_options_name_their_variables_and_defaults() -> None:
    tail = " ".join(fanout("tail", "--help").stdout.split())
    for words in ("(env FANOUT_URL; default http://127.0.0.1:8080)", "(env FANOUT_API_KEY", "(env FANOUT_TOKEN"):
        assert words in tail
    submit = " ".join(fanout("submit", "--help").stdout.split())
    assert "provider API the worker calls" in submit
    assert "INDEX.md" in submit  # --model's help


def test_help_never_shows_the_api_key_from_the_environment() -> None:
    done = fanout("tail", "--help", env={"FANOUT_API_KEY": "secret-key-123", "FANOUT_TOKEN": "v1.secret"})
    assert "secret" not in done.stdout


def test_demo_options_show_their_defaults() -> None:
    demo = " ".join(fanout("demo", "--help").stdout.split())
    assert "(default: 40)" in demo
    assert "(default: 96)" in demo
    assert "(default: 120.0)" in demo


# --- worker and publisher startup --------------------------------------------------------------


def test_worker_with_redis_unreachable_prints_one_line_and_exits_4() -> None:
    url = f"redis://:pw@127.0.0.1:{free_port()}/0"
    done = fanout("worker", env={"REDIS_URL": url}, timeout=60)
    line = one_line(done, 4, "cannot reach Redis", "REDIS_URL", "start Redis")
    assert "pw" not in done.stderr
    assert ":***@" in line
    assert len(done.stderr.strip().splitlines()) <= 3  # two log lines at start, then the one line


def test_demo_with_redis_unreachable_prints_one_line_and_exits_4() -> None:
    url = f"redis://:pw@127.0.0.1:{free_port()}/0"
    done = fanout("demo", env={"REDIS_URL": url}, timeout=60)
    line = one_line(done, 4, "fanout demo: cannot reach Redis", ":***@", "unset REDIS_URL for an embedded one")
    assert "pw" not in done.stderr + done.stdout
    assert "started upstream" not in done.stdout  # refused before any process was started
    assert line == done.stderr.strip()


def test_demo_with_a_redis_url_that_is_not_one_is_a_usage_error() -> None:
    one_line(fanout("demo", env={"REDIS_URL": "localhost:6379"}), 2, "REDIS_URL", "redis://host:6379/0")


def test_worker_with_a_provider_base_url_that_is_not_a_url_is_a_usage_error() -> None:
    done = fanout("worker", env={"FANOUT_ANTHROPIC_BASE_URL": "notaurl", "REDIS_URL": "redis://127.0.0.1:1/0"})
    line = one_line(done, 2, "FANOUT_ANTHROPIC_BASE_URL='notaurl'", "expected an http(s) URL with a host")
    assert line.startswith("fanout worker: bad configuration:")


@pytest.mark.parametrize(("command", "status"), [(("worker",), 2), (("publisher", "--port", "0"), 2),
                                               (("health",), 1), (("export", "--output", os.devnull), 2),
                                               (("demo",), 2)])
def test_fanout_redis_cluster_takes_the_same_booleans_in_every_command(command: tuple[str, ...], status: int) -> None:
    """Usage error (2) where the process would start; the probe reports it as unhealthy (1)."""
    done = fanout(*command, env={"FANOUT_REDIS_CLUSTER": "yes", "REDIS_URL": "redis://127.0.0.1:1/0"})
    one_line(done, status, "FANOUT_REDIS_CLUSTER='yes'", "expected a boolean: 1, 0, true or false")


@pytest.mark.parametrize("command", [("worker",), ("health",), ("export", "--output", os.devnull)])
def test_a_redis_password_given_in_the_url_query_is_never_printed(command: tuple[str, ...]) -> None:
    """redis-py authenticates with ``?password=`` as with ``:password@``: both are masked alike."""
    url = f"redis://127.0.0.1:{free_port()}/0?password=query-secret-pw&socket_timeout=5"
    done = fanout(*command, env={"REDIS_URL": url, "FANOUT_LOG_LEVEL": "DEBUG"}, timeout=60)
    assert done.returncode != 0
    assert "127.0.0.1" in done.stderr  # the message names the URL
    assert "query-secret-pw" not in done.stderr + done.stdout
    assert "password=***" in done.stderr
    assert "socket_timeout=5" in done.stderr  # other options are shown as given


def test_worker_with_a_redis_url_that_is_not_one_is_a_usage_error() -> None:
    one_line(fanout("worker", "--redis-url", "localhost:6379"), 2, "--redis-url", "redis://host:6379/0")


def test_worker_without_provider_credentials_warns(redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(REDIS_URL=redis_url, FANOUT_REDIS_PREFIX=f"clitest-{uuid.uuid4().hex[:8]}")
    proc = subprocess.Popen([sys.executable, "-m", "fanout_cli", "worker"], env=env, cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "event=worker_start" in line:
                break
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()
    warning = [line for line in lines if "level=WARNING" in line]
    assert warning, lines
    assert "OPENAI_API_KEY" in warning[0]
    assert "no provider key" in warning[0]


def _wait_status(url: str, status: int, timeout_s: float = 20.0) -> None:
    deadline, got = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                got = resp.status
        except urllib.error.HTTPError as exc:
            got = exc.code
        except OSError:
            got = None
        if got == status:
            return
        time.sleep(0.2)
    raise AssertionError(f"{url} answered {got}, not {status}")


def _line_within(proc: subprocess.Popen[str], words: str, timeout_s: float) -> str:
    """Return the first stderr line of ``proc`` holding ``words``; fail after ``timeout_s``."""
    found: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if words in line:
                found.put(line)
                return

    threading.Thread(target=read, daemon=True).start()
    try:
        return found.get(timeout=timeout_s)
    except queue.Empty:
        raise AssertionError(f"no stderr line with {words!r} within {timeout_s} s") from None


@pytest.mark.skipif(not Path(REDIS_SERVER).exists(), reason=f"{REDIS_SERVER} is not installed")
def test_publisher_with_redis_unreachable_warns_is_not_ready_then_ready_when_redis_starts() -> None:
    redis_port, port = free_port(), free_port()
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "FANOUT_DEV": "1", "FANOUT_API_KEYS": "k"}
    publisher = subprocess.Popen([sys.executable, "-m", "fanout_cli", "publisher", "--port", str(port)], env=env,
                                 cwd=ROOT, stderr=subprocess.PIPE, text=True)
    workdir = tempfile.mkdtemp(prefix="fanout-cli-redis-")
    redis = None
    try:
        warning = _line_within(publisher, "does not answer", timeout_s=30)
        assert "WARNING" in warning
        assert "REDIS_URL" in warning
        assert f"127.0.0.1:{redis_port}" in warning
        _wait_status(f"http://127.0.0.1:{port}/readyz", 503)
        redis = subprocess.Popen([REDIS_SERVER, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", workdir], stdout=subprocess.DEVNULL)
        wait_for_port(redis_port)
        _wait_status(f"http://127.0.0.1:{port}/readyz", 200)  # no worker runs: the publisher made the jobs group
    finally:
        publisher.terminate()
        publisher.wait(timeout=30)
        if publisher.stderr is not None:
            publisher.stderr.close()
        if redis is not None:
            redis.terminate()
            redis.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("command", ["publisher", "upstream"])
def test_port_in_use_says_choose_another_port(stack: LocalStack, command: str) -> None:
    done = fanout(command, "--port", str(stack.publisher_port), env={"FANOUT_DEV": "1", "FANOUT_API_KEYS": "k"})
    one_line(done, 2, f"127.0.0.1:{stack.publisher_port}", "already in use", "--port")


def test_publisher_with_a_redis_url_that_is_not_one_is_a_usage_error() -> None:
    done = fanout("publisher", "--port", "0", env={"REDIS_URL": "localhost:6379", "FANOUT_DEV": "1"})
    one_line(done, 2, "REDIS_URL", "redis://host:6379/0")


def test_health_with_a_redis_url_that_is_not_one_is_a_usage_error() -> None:
    one_line(fanout("health", env={"REDIS_URL": "localhost"}), 2, "REDIS_URL", "not a Redis URL")


def test_health_of_an_unreachable_redis_names_it_in_one_line() -> None:
    done = fanout("health", "--timeout-s", "1", env={"REDIS_URL": "redis://127.0.0.1:1/0"})
    one_line(done, 1, "fanout health: unhealthy:", "redis at redis://127.0.0.1:1/0", "ConnectionError")


def test_health_of_an_unreachable_health_url_says_why_and_which_setting() -> None:
    done = fanout("health", "--timeout-s", "1", "--url", "http://127.0.0.1:1/healthz",
                  env={"REDIS_URL": "redis://127.0.0.1:1/0"})
    one_line(done, 1, "fanout health: unhealthy: http://127.0.0.1:1/healthz: ClientConnectorError: Cannot connect",
             "check FANOUT_HEALTH_URL or --url")


def test_health_without_redis_url_checks_the_default_redis() -> None:
    prefix = f"healthdefault-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"} | {"FANOUT_REDIS_PREFIX": prefix}
    default = redis.Redis.from_url("redis://localhost:6379/0", socket_connect_timeout=1)
    try:
        try:
            default.xadd(Keys(prefix).jobs_shard(0), {"x": "1"})  # a jobs stream with no consumer group
            answers = True
        except redis.ConnectionError:
            answers = False
        done = subprocess.run([sys.executable, "-m", "fanout_cli", "health", "--timeout-s", "1"], capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=60, check=False)
        # either way the check ran against the default URL: it found that stream, or it names the URL
        want = "has no consumer group 'workers'" if answers else "redis at redis://localhost:6379/0"
        one_line(done, 1, "fanout health: unhealthy:", want)
    finally:
        with contextlib.suppress(redis.ConnectionError):
            default.delete(Keys(prefix).jobs_shard(0), Keys(prefix).probe)
        default.close()


def test_health_under_a_prefix_no_worker_used_names_the_likely_causes(single_redis_url: str) -> None:
    prefix = f"typo-{uuid.uuid4().hex[:8]}"
    done = fanout("health", "--timeout-s", "3", env={"REDIS_URL": single_redis_url, "FANOUT_REDIS_PREFIX": prefix})
    line = one_line(done, 1, f"jobs stream {prefix}:jobs:{{0}} has no consumer group 'workers'")
    assert f"no worker has started under FANOUT_REDIS_PREFIX={prefix} yet" in line
    assert "mistyped" in line
    assert "Redis lost its data" in line
    assert "(Redis lost its data?)" not in line


def test_publisher_takes_redis_url_and_prefix_flags(single_redis_url: str) -> None:
    """``--redis-url`` and ``--prefix`` override REDIS_URL and FANOUT_REDIS_PREFIX, as the worker's flags do."""
    prefix, port = f"pubflags-{uuid.uuid4().hex[:8]}", free_port()
    env = {**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0", "FANOUT_REDIS_PREFIX": "not-this-one",
           "FANOUT_DEV": "1", "FANOUT_API_KEYS": "k"}
    publisher = subprocess.Popen([sys.executable, "-m", "fanout_cli", "publisher", "--port", str(port),
                                  "--redis-url", single_redis_url, "--prefix", prefix], env=env, cwd=ROOT,
                                 stderr=subprocess.DEVNULL)
    client = redis.Redis.from_url(single_redis_url)
    try:
        wait_for_port(port, proc=publisher)
        body = json.dumps({"provider": "anthropic", "model": "m", "request": {"messages": []}}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/streams", data=body, method="POST",
                                         headers={"Authorization": "Bearer k", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.status == 201
        assert client.xlen(Keys(prefix).jobs_shard(0)) == 1  # the job went to the flag's Redis, under its prefix
    finally:
        publisher.terminate()
        publisher.wait(timeout=30)
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
        client.close()


def test_publisher_redis_url_flag_that_is_not_one_is_named_in_the_error() -> None:
    done = fanout("publisher", "--port", "0", "--redis-url", "localhost:6379", env={"FANOUT_DEV": "1"})
    one_line(done, 2, "--redis-url", "redis://host:6379/0")


@pytest.mark.parametrize("log_format", ["logfmt", "json"])
def test_the_publisher_warning_about_unreachable_redis_masks_a_password_given_in_the_url_query(log_format: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0?password=query-secret-pw"
    env = {**os.environ, "REDIS_URL": url, "FANOUT_DEV": "1", "FANOUT_API_KEYS": "k", "FANOUT_LOG_LEVEL": "DEBUG",
           "FANOUT_LOG_FORMAT": log_format}
    publisher = subprocess.Popen([sys.executable, "-m", "fanout_cli", "publisher", "--port", str(free_port())],
                                 env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        warning = _line_within(publisher, "does not answer", timeout_s=30)
    finally:
        publisher.terminate()
        publisher.wait(timeout=30)
        rest = publisher.stderr.read() if publisher.stderr is not None else ""
        if publisher.stderr is not None:
            publisher.stderr.close()
    assert "password=***" in warning
    assert "query-secret-pw" not in warning + rest


@pytest.mark.parametrize("command", [("export", "--output", os.devnull), ("health",)])
def test_cluster_mode_that_does_not_match_the_server_is_named_with_its_fix(
        command: tuple[str, ...], cluster_redis_url: str) -> None:
    """FANOUT_REDIS_CLUSTER=1 on a single node, or 0 on a Cluster node holding the summaries
    elsewhere, printed redis-py's words ("<slot> <host:port>" for a MOVED) and, for export,
    "run again", which can never help; the message names the variable and the value to set."""
    prefix = f"clmode{os.getpid()}"
    seeded = cluster_client(cluster_redis_url)
    single = contextlib.ExitStack()
    try:
        single_redis_url = single.enter_context(private_redis()).url  # over TCP
        # a seed that owns none of the keys the command reads: the jobs stream ({0}: one slot for
        # every prefix, so the seed is a node other than its owner), the summaries, the probe key
        jobs_owner = seeded.get_node_from_key("x:jobs:{0}").port
        seed = next(f"redis://127.0.0.1:{node.port}/0" for node in seeded.get_primaries() if node.port != jobs_owner)
        key = next(f"{prefix}{n}:done" for n in range(1000)
                   if not any(_on_seed(seeded, f"{prefix}{n}:{name}", seed) for name in ("done", "probe")))
        seeded.xadd(key, {"s": "{}"})
        on_single = fanout(*command, env={"REDIS_URL": single_redis_url, "FANOUT_REDIS_CLUSTER": "1",
                                          "FANOUT_REDIS_PREFIX": prefix})
        line = one_line(on_single, 1, "not a Redis Cluster node", "set FANOUT_REDIS_CLUSTER=0")
        assert "run again" not in line
        on_cluster = fanout(*command, env={"REDIS_URL": seed, "FANOUT_REDIS_CLUSTER": "0",
                                           "FANOUT_REDIS_PREFIX": key.removesuffix(":done")})
        line = one_line(on_cluster, 1, "node of a Redis Cluster", "set FANOUT_REDIS_CLUSTER=1")
        assert "run again" not in line
    finally:
        seeded.delete(key)
        seeded.close()
        single.close()


def cluster_client(url: str) -> redis.cluster.RedisCluster:
    return redis.cluster.RedisCluster.from_url(url)


def _on_seed(client: redis.cluster.RedisCluster, key: str, seed_url: str) -> bool:
    node = client.get_node_from_key(key)
    return f":{node.port}/" in seed_url
