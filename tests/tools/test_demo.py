"""``fanout demo --keep-running``: what a person needs comes first, and links the page itself."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import redis

from schema.contract import StreamDone, StreamStart
from tools.demo.run import announcement, forget_prefix
from tools.demo.stack import LocalStack
from tools.demo.view import CaseRun, ProgressView

ROOT = Path(__file__).resolve().parents[2]


def _keys_under(url: str, prefix: str) -> list[bytes]:
    with redis.Redis.from_url(url) as client:
        return list(client.scan_iter(match=f"{prefix}:*", count=500))


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
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1", "FANOUT_REDIS_PREFIX": ""}  # empty: unset
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
        prefix = next(line.split()[2] for line in lines if line.strip().startswith("key prefix:"))
        demo.send_signal(signal.SIGTERM)  # mid-streams: every process stops, exit 130
        assert demo.wait(timeout=60) == 130
        rest = demo.stdout.read()
        assert "demo interrupted" in rest
        assert "removed the demo's " in rest
        assert _keys_under(redis_url, prefix) == [], "the demo's keys are gone from the user's Redis"
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        if demo.stdout is not None:
            demo.stdout.close()


def test_announcement_without_redis_cli_names_the_command_alone(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-cli here
    stack = LocalStack("redis://127.0.0.1:6379/0", prefix="fanout-demo-y")
    try:
        text = announcement(stack, stack.redis_url, "REDIS_URL")
    finally:
        shutil.rmtree(stack.logdir)
    assert "redis-cli -u" not in text
    assert ("consumer:   (with any Redis client; redis-cli is not on PATH) "
            "XREAD BLOCK 0 STREAMS 'fanout-demo-y:done'") in text


def test_forget_prefix_deletes_only_that_prefix(redis_url: str, keys, capsys: pytest.CaptureFixture[str]) -> None:
    other = f"{keys.prefix}x"  # shares the text but not the "prefix:" boundary
    with redis.Redis.from_url(redis_url) as client:
        client.xadd(keys.done, {"a": "1"})
        client.xadd(keys.jobs_shard(0), {"a": "1"})
        client.set(f"{other}:kept", "1")
        try:
            forget_prefix(redis_url, keys.prefix)
            assert capsys.readouterr().out == f"removed the demo's 2 keys (prefix {keys.prefix}) from REDIS_URL\n"
            assert client.exists(keys.done, keys.jobs_shard(0)) == 0
            assert client.get(f"{other}:kept") == b"1"
        finally:
            client.delete(f"{other}:kept")


def test_forget_prefix_reports_an_unreachable_redis(capsys: pytest.CaptureFixture[str]) -> None:
    forget_prefix("redis://127.0.0.1:1/0", "fanout-stack-gone")
    assert capsys.readouterr().out.startswith("could not remove the demo's keys (prefix fanout-stack-gone): ")


@pytest.mark.parametrize(("argument", "value", "why"), [
    ("--delay-ms", "-5", "'-5' is below 0"),
    ("--delay-ms", "abc", "'abc' is not a whole number (>= 0)"),
    ("--chunk-bytes", "0", "'0' is below 1"),
    ("--timeout-s", "nan", "'nan' is not above 0"),
    ("--timeout-s", "soon", "'soon' is not a number (> 0)"),
])
def test_a_bad_demo_argument_is_a_usage_error(argument: str, value: str, why: str) -> None:
    done = subprocess.run([sys.executable, "-m", "fanout_cli", "demo", argument, value], capture_output=True,
                          text=True, cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 2
    assert f"argument {argument}: {why}" in done.stderr
    assert "Traceback" not in done.stderr


def test_forget_prefix_matches_its_prefix_literally(redis_url: str, keys, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"{keys.prefix}?[ab]*"  # glob characters in the prefix are its own text, not a pattern
    lookalike = f"{keys.prefix}Xa-other"
    with redis.Redis.from_url(redis_url) as client:
        client.set(f"{prefix}:mine", "1")
        client.set(f"{lookalike}:kept", "1")
        try:
            forget_prefix(redis_url, prefix)
            assert capsys.readouterr().out == f"removed the demo's 1 keys (prefix {prefix}) from REDIS_URL\n"
            assert client.exists(f"{prefix}:mine") == 0
            assert client.get(f"{lookalike}:kept") == b"1"
        finally:
            client.delete(f"{lookalike}:kept", f"{prefix}:mine")


def test_a_timed_out_demo_keeps_the_logs_it_points_at(redis_url: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url}
    done = subprocess.run([sys.executable, "-m", "fanout_cli", "demo", "--timeout-s", "0.2", "--delay-ms", "500"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("demo timed out"))
    logdir = Path(line.rsplit(" ", 1)[1])
    try:
        assert sorted(path.name for path in logdir.iterdir()), "the logs it names are there"
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def test_progress_lines_line_up_whatever_the_case_name_length() -> None:
    """A case name longer than the old fixed 52 columns pushed its bar out of line."""
    out = io.StringIO()
    view = ProgressView(out)
    runs = [CaseRun(provider="anthropic", directory="anthropic", case="simple_text"),
            CaseRun(provider="openai_responses", directory="openai_responses",
                    case="several_blocks_reasoning_text_and_call_and_then_some_more")]
    view.start(runs)
    for run in runs:
        run.events.append(StreamStart(stream_id="st_x", seq=1, ts=0, provider=run.provider, model="m"))
        run.events.append(StreamDone(stream_id="st_x", seq=2, ts=1, status="completed", finish_reason="stop",
                                     provider_finish_reason="stop", usage=None, response_id=None, model=None))
        view.update(run)
    done = [line for line in out.getvalue().splitlines() if line.startswith("  done  ")]
    assert len(done) == 2
    assert len({line.index("##") for line in done}) == 1, done
