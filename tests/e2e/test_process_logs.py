"""Real ``fanout worker`` and ``fanout publisher`` processes log in one format at the level asked.

Each test starts the real entry point as a subprocess against the real Redis (its own key
prefix, deleted afterwards), stops it with SIGTERM and reads everything it wrote on stderr.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.schema.test_logs import LOGFMT_LINE, TS
from tools.demo.stack import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
STOP_S = 30.0
"""Guard on a process's exit after SIGTERM (not a bound the test asserts)."""


@pytest.fixture
def prefix(single_redis_url: str) -> Iterator[str]:
    """A key prefix for this test's processes; its keys are deleted afterwards."""
    name = f"logtest-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(single_redis_url)
    try:
        for key in client.scan_iter(match=f"{name}:*"):
            client.delete(key)
    finally:
        client.close()


def base_env(redis_url: str, prefix: str, **extra: str) -> dict[str, str]:
    """The environment without any FANOUT_*/OTEL_* of the caller's, plus what a process needs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FANOUT_", "OTEL_"))}
    return {**env, "REDIS_URL": redis_url, "FANOUT_REDIS_PREFIX": prefix, "FANOUT_TOKEN_SECRET": "s" * 40, **extra}


def fanout(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "fanout_cli", *args], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen[str]) -> list[str]:
    """SIGTERM ``proc``; return every stderr line it wrote, after asserting a clean exit."""
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    assert proc.returncode == 0, err
    return err.splitlines()


def publisher_lines(env: dict[str, str], *flags: str) -> list[str]:
    """Start a publisher, wait until it listens, make one request, stop it; return its stderr lines."""
    port = free_port()
    proc = fanout("publisher", "--port", str(port), *flags, env=env)
    try:
        wait_for_port(port, proc=proc)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert sock.recv(64).startswith(b"HTTP/1.1 200 ")
    finally:
        lines = stop(proc)
    return lines


def worker_lines(env: dict[str, str]) -> list[str]:
    """Start a worker, wait for its ``event=worker_start`` record, stop it; return its stderr lines."""
    proc = fanout("worker", "--concurrency", "1", env=env)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line.rstrip("\n"))
        if "event=worker_start" in line:
            break
    return seen + stop(proc)


def test_publisher_logs_info_at_startup_by_default(single_redis_url, prefix):
    lines = publisher_lines(base_env(single_redis_url, prefix))
    info = [line for line in lines if " level=INFO " in line]
    assert any("listening on http://127.0.0.1:" in line for line in info), lines
    assert any("logger=aiohttp.access" in line and "/healthz" in line for line in info), lines


@pytest.mark.parametrize(("variables", "flags"), [
    ({"FANOUT_LOG_LEVEL": "WARNING"}, ()),
    ({"FANOUT_LOG_LEVEL": "INFO"}, ("--log-level", "WARNING")),  # the flag wins over the variable
], ids=["variable", "flag"])
def test_publisher_at_warning_prints_no_info_line(single_redis_url, prefix, variables, flags):
    lines = publisher_lines(base_env(single_redis_url, prefix, **variables), *flags)  # FANOUT_API_KEYS unset: a WARNING
    assert not [line for line in lines if "level=INFO" in line or "level=DEBUG" in line], lines
    assert any(" level=WARNING logger=publisher.settings FANOUT_API_KEYS is empty" in line for line in lines), lines


def test_worker_and_publisher_write_the_same_logfmt_line_shape(single_redis_url, prefix):
    env = base_env(single_redis_url, prefix)
    for lines, logger in ((worker_lines(env), "fanout.worker"), (publisher_lines(env), "publisher")):
        assert lines
        for line in lines:
            assert LOGFMT_LINE.fullmatch(line), line
        assert any(f" logger={logger} " in line for line in lines), lines


def test_worker_and_publisher_json_lines_are_json_objects(single_redis_url, prefix):
    env = base_env(single_redis_url, prefix, FANOUT_LOG_FORMAT="json")
    by_logger: dict[str, list[dict[str, str]]] = {}
    for lines, logger in ((worker_lines(env), "fanout.worker"), (publisher_lines(env), "publisher")):
        records = [json.loads(line) for line in lines]
        assert records
        for record in records:
            assert {"ts", "level", "logger", "msg"} <= set(record), record
            assert re.fullmatch(TS, record["ts"])
            assert record["level"] in ("DEBUG", "INFO", "WARNING", "ERROR")
        assert any(record["logger"] == logger for record in records), records
        by_logger[logger] = records
    config = [record for record in by_logger["fanout.worker"] if record.get("event") == "worker_config"]
    assert config, "the worker's event=worker_config record has no event field"
    assert config[0]["msg"].startswith("event=worker_config concurrency=")
    assert config[0]["concurrency"].isdigit()
    # one field for the credentials, not one per word of their repr
    assert re.fullmatch(r"Credentials\(openai=(un)?set, anthropic=(un)?set, gemini=(un)?set\)",
                        config[0]["credentials"]), config[0]
    assert not {"anthropic", "gemini"} & set(config[0]), config[0]


@pytest.mark.parametrize("command", ["worker", "publisher", "export", "upstream", "demo"])
@pytest.mark.parametrize("bad", [
    ("FANOUT_LOG_LEVEL", "verbose", "one of DEBUG, INFO, WARNING, ERROR"),
    ("FANOUT_LOG_FORMAT", "xml", "one of logfmt, json"),
], ids=["level", "format"])
def test_a_bad_log_variable_is_a_usage_error(single_redis_url, prefix, command, bad):
    name, value, accepted = bad
    args = ["--port", "0"] if command in ("publisher", "upstream") else []
    done = subprocess.run([sys.executable, "-m", "fanout_cli", command, *args], capture_output=True, text=True,
                          env=base_env(single_redis_url, prefix, **{name: value}), cwd=ROOT, timeout=60, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"fanout {command}: bad configuration: {name}={value!r}: "
                                        f"expected {accepted}"]


@pytest.mark.parametrize("command", ["worker", "publisher"])
def test_a_bad_log_level_flag_is_a_usage_error(single_redis_url, prefix, command):
    done = subprocess.run([sys.executable, "-m", "fanout_cli", command, "--log-level", "verbose"], capture_output=True,
                          text=True, env=base_env(single_redis_url, prefix), cwd=ROOT, timeout=60, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    assert "argument --log-level: invalid choice: 'verbose'" in done.stderr.splitlines()[-1]


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_a_malformed_request_to_the_publisher_logs_no_header_value(single_redis_url, prefix, fmt):
    port = free_port()
    proc = fanout("publisher", "--port", str(port), "--log-level", "DEBUG",
                  env=base_env(single_redis_url, prefix, FANOUT_LOG_FORMAT=fmt))
    try:
        wait_for_port(port, proc=proc)
        for request in (b"GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\x01tail\r\n\r\n",
                        b"\x16\x03\x01 sekrit-not-http\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(request)
                assert sock.recv(64).split(b" ")[1] == b"400"
    finally:
        lines = stop(proc)
    assert not [line for line in lines if "sekrit" in line], lines
    malformed = [line for line in lines if "malformed request" in line]
    assert len(malformed) == 2, lines
    for line in malformed:
        if fmt == "json":
            assert json.loads(line)["logger"] == "publisher.api.edge"
        else:
            assert LOGFMT_LINE.fullmatch(line), line
