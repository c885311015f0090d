"""``fanout demo --keep-running``: what a person needs comes first, and links the page itself."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from publisher.demo import announcement
from publisher.stack import LocalStack

ROOT = Path(__file__).resolve().parents[2]


def test_announcement_names_page_key_redis_and_prefix_without_the_password() -> None:
    stack = LocalStack("redis://:s3cret@127.0.0.1:6379/0", prefix="fanout-demo-x")
    try:
        text = announcement(stack, stack.redis_url, "REDIS_URL")
    finally:
        shutil.rmtree(stack.logdir)
    assert f"demo page:  {stack.base_url}/demo " in text, "the page itself, not one stream that already ended"
    assert "stream_id=" not in text
    assert f"API key:    {stack.api_key}" in text
    assert "redis:      redis://:***@127.0.0.1:6379/0  (REDIS_URL)" in text
    assert "s3cret" not in text
    assert "key prefix: fanout-demo-x" in text
    assert "fanout-demo-x:{<stream_id>}:events" in text
    assert "XREAD BLOCK 0 STREAMS 'fanout-demo-x:done' '$'" in text


def test_announcement_for_the_embedded_server_names_its_socket() -> None:
    stack = LocalStack("unix:///tmp/fanout-redis-x/redis.sock")
    try:
        text = announcement(stack, stack.redis_url, "embedded server")
    finally:
        shutil.rmtree(stack.logdir)
    assert "redis:      unix:///tmp/fanout-redis-x/redis.sock  (embedded server)" in text
    assert "redis-cli -s /tmp/fanout-redis-x/redis.sock XREAD" in text


def test_keep_running_prints_urls_first_and_the_page_works_while_the_streams_run(redis_url: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    demo = subprocess.Popen([sys.executable, "-m", "fanout_cli", "demo", "--keep-running", "--delay-ms", "500"],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    lines: list[str] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("following "):
                break
        printed = "".join(lines)
        assert "following 9 streams" in printed, printed
        page = next(line.split()[2] for line in lines if line.strip().startswith("demo page:"))
        assert page.endswith("/demo"), page
        for label in ("publisher:", "API key:", "redis:", "key prefix:", "export FANOUT_URL="):
            assert label in printed, label
        with urllib.request.urlopen(page, timeout=10) as resp:
            assert resp.status == 200
            assert b"Start stream" in resp.read()
        demo.send_signal(signal.SIGTERM)  # mid-streams: every process stops, exit 130
        assert demo.wait(timeout=60) == 130
        assert "demo interrupted" in demo.stdout.read()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        if demo.stdout is not None:
            demo.stdout.close()
