"""A Redis that answers but refuses ``REDIS_URL`` (password, user, database) is named as such, not as down.

``fanout worker`` and ``fanout demo`` once said "cannot reach Redis ... start Redis" (exit 4)
for a wrong password or a database number the server does not have: Redis was up, and
the advice sent the user the wrong way; ``fanout export`` said "run again", which cannot
help. Each case runs the real command against a private ``redis-server`` started with
``requirepass``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_servers import RedisServer, redis_node

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "pw-4f1c9e"


@pytest.fixture(scope="module")
def guarded() -> Iterator[RedisServer]:
    with redis_node(password=PASSWORD) as server:
        yield server


def fanout(*args: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")} | {"REDIS_URL": redis_url}
    return subprocess.run([sys.executable, "-m", "fanout_cli", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60, check=False)


@pytest.mark.parametrize("command", ["worker", "demo"])
@pytest.mark.parametrize(("credentials", "said"), [
    (":wrong-password@", "invalid username-password pair"),
    ("", "uthenticat"),  # NOAUTH "Authentication required", or over RESP3 "HELLO must be called ... authenticated"
])
def test_a_refused_password_says_to_fix_the_url_and_exits_2(guarded: RedisServer, command: str, credentials: str,
                                                            said: str) -> None:
    done = fanout(command, redis_url=f"redis://{credentials}127.0.0.1:{guarded.port}/0")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, (done.returncode, done.stderr)
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"fanout {command}: Redis at redis://"), line
    assert "answered but refused it" in line, line
    assert said in line, line
    assert "check the user, password and database number in REDIS_URL" in line, line
    assert "start Redis" not in done.stderr
    assert "wrong-password" not in done.stderr + done.stdout
    assert "started upstream" not in done.stdout  # the demo refused before starting anything


def test_the_demo_names_a_database_the_server_does_not_have(guarded: RedisServer) -> None:
    done = fanout("demo", redis_url=f"redis://:{PASSWORD}@127.0.0.1:{guarded.port}/99")
    assert done.returncode == 2, (done.returncode, done.stderr)
    line = done.stderr.strip()
    assert "DB index is out of range" in line, line
    assert "check the user, password and database number in REDIS_URL" in line, line
    assert PASSWORD not in done.stderr + done.stdout



def test_export_with_a_refused_password_says_to_fix_the_url_not_to_run_again(guarded: RedisServer) -> None:
    done = fanout("export", redis_url=f"redis://:wrong-password@127.0.0.1:{guarded.port}/0")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, (done.returncode, done.stderr)  # export: 1 when Redis failed (its --help)
    line = done.stderr.strip().splitlines()[-1]
    assert "answered but refused it (invalid username-password pair" in line, line
    assert "check the user, password and database number in REDIS_URL or --redis-url" in line, line
    assert line.endswith("nothing acknowledged is lost"), line
    assert "run again" not in line, line
    assert "wrong-password" not in done.stderr + done.stdout


def test_the_worker_names_a_database_the_server_does_not_have(guarded: RedisServer) -> None:
    done = fanout("worker", redis_url=f"redis://:{PASSWORD}@127.0.0.1:{guarded.port}/99")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, (done.returncode, done.stderr)  # a ResponseError, not a ConnectionError
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("fanout worker: Redis at redis://"), line
    assert "answered but refused it (DB index is out of range)" in line, line
    assert "check the user, password and database number in REDIS_URL" in line, line
    assert PASSWORD not in done.stderr + done.stdout


@pytest.mark.parametrize(("credentials", "database", "said"), [
    (":wrong-password@", 0, "invalid username-password pair"),
    (f":{PASSWORD}@", 99, "DB index is out of range"),
])
def test_the_publisher_warns_to_fix_the_url_not_to_start_redis(guarded: RedisServer, credentials: str, database: int,
                                                               said: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")} | {
        "REDIS_URL": f"redis://{credentials}127.0.0.1:{guarded.port}/{database}", "FANOUT_DEV": "1",
        "FANOUT_API_KEYS": "k"}
    publisher = subprocess.Popen([sys.executable, "-m", "fanout_cli", "publisher", "--port", "0"], env=env, cwd=ROOT,
                                 stderr=subprocess.PIPE, text=True)
    try:
        assert publisher.stderr is not None
        line = ""
        for line in publisher.stderr:  # the start-up check logs once, then the publisher serves (503s) until stopped
            if "Redis at" in line:
                break
        assert "answered but refused it" in line, line
        assert said in line, line
        assert "check the user, password and database number in REDIS_URL" in line, line
        assert "start Redis" not in line, line
        assert PASSWORD not in line, line
        assert "wrong-password" not in line, line
    finally:
        publisher.terminate()
        publisher.wait(timeout=30)
        if publisher.stderr is not None:
            publisher.stderr.close()
