"""Bad flag values on the real ``fanout`` command line: exit 2, one line naming the flag and the fix, no traceback.

Each test runs the real entry point as a subprocess; the accepted edges (``--port 0`` and
``65535``) start the real server on a real socket and read the address it prints.
"""

from __future__ import annotations

import os
import queue
import re
import socket
import subprocess
import sys
import threading

import pytest

from tests.e2e.test_cli_messages import ROOT, fanout, one_line

NOT_A_PORT = "0 for any free port"


@pytest.mark.parametrize(("args", "words"), [
    (["upstream", "--port", "70000"], ["--port", "'70000' is not a port", NOT_A_PORT]),
    (["upstream", "--port", "-5"], ["--port", "'-5' is not a port", NOT_A_PORT]),
    (["upstream", "--port", "65536"], ["--port", "'65536' is not a port", "1-65535"]),
    (["upstream", "--port", "http"], ["--port", "'http' is not a port"]),
    (["publisher", "--dev", "--port", "99999"], ["--port", "'99999' is not a port", NOT_A_PORT]),
    (["publisher", "--dev", "--port", "-1"], ["--port", "'-1' is not a port", NOT_A_PORT]),
    (["publisher", "--dev", "--port", "65536"], ["--port", "'65536' is not a port"]),
    (["upstream", "--chunk-bytes", "0"], ["--chunk-bytes", "'0' is below 1"]),
    (["upstream", "--delay-ms", "-1"], ["--delay-ms", "'-1' is below 0"]),
    (["upstream", "--slow-delay-ms", "-1"], ["--slow-delay-ms", "'-1' is below 0"]),
    (["upstream", "--transcripts", "/nonexistent"], ["--transcripts", "'/nonexistent' does not exist"]),
    (["health", "--url", "127.0.0.1:58787"], ["--url", "write it with the scheme", "http://127.0.0.1:58787"]),
    (["health", "--timeout-s", "0"], ["--timeout-s", "'0' is not above 0"]),
    (["health", "--timeout-s", "-2"], ["--timeout-s", "'-2' is not above 0"]),
])
def test_bad_flag_value_is_a_one_line_usage_error(args: list[str], words: list[str]) -> None:
    one_line(fanout(*args), 2, f"fanout {args[0]}", *words)


def test_transcripts_variable_naming_no_directory_is_a_usage_error() -> None:
    done = fanout("upstream", "--port", "0", env={"FANOUT_TRANSCRIPTS_DIR": "/nonexistent"})
    one_line(done, 2, "FANOUT_TRANSCRIPTS_DIR", "'/nonexistent' is not a directory", "unset it")


def test_health_url_variable_without_scheme_is_a_usage_error() -> None:
    done = fanout("health", env={"FANOUT_HEALTH_URL": "localhost:8080"})
    one_line(done, 2, "FANOUT_HEALTH_URL", "http://localhost:8080")


def _listening_port(*args: str) -> int:
    """Start ``fanout ARGS``, return the port of its ``listening on http://host:port`` line, stop it."""
    env = {**os.environ, "FANOUT_DEV": "1", "FANOUT_API_KEYS": "k", "REDIS_URL": "redis://127.0.0.1:1/0"}
    proc = subprocess.Popen([sys.executable, "-m", "fanout_cli", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    found: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "listening on http://" in line or "Traceback" in line:
                found.put(line)
                return
        found.put("")

    threading.Thread(target=read, daemon=True).start()
    try:
        line = found.get(timeout=60)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()
    match = re.search(r"listening on http://[^:\s]+:(\d+)", line)
    assert match, line
    return int(match[1])


def _port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("command", ["upstream", "publisher"])
def test_port_0_listens_on_a_port_the_os_picked(command: str) -> None:
    assert 0 < _listening_port(command, "--port", "0") <= 65535


@pytest.mark.parametrize("command", ["upstream", "publisher"])
def test_port_65535_is_accepted(command: str) -> None:
    if not _port_is_free(65535):
        pytest.skip("something on this machine holds port 65535")
    assert _listening_port(command, "--port", "65535") == 65535


def test_every_role_shows_the_same_default_redis_url() -> None:
    defaults = {command: re.findall(r"redis://[^\s)]+", fanout(command, "--help").stdout)
                for command in ("worker", "publisher", "export")}
    assert defaults == {command: ["redis://localhost:6379/0"] for command in defaults}
