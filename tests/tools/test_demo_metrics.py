"""``fanout demo`` with ``OTEL_METRICS_EXPORTER=prometheus``: a scrape endpoint per process, printed with its log."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tools.demo.stack import LocalStack, metrics_ports

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["worker-1", "worker-2", "publisher"]
SCRAPE_GUARD_S = 30.0


def test_no_exporter_no_ports() -> None:
    assert metrics_ports({}, NAMES) == {}
    assert metrics_ports({"OTEL_METRICS_EXPORTER": "otlp"}, NAMES) == {}
    assert metrics_ports({"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_SDK_DISABLED": "true"}, NAMES) == {}


def test_each_process_gets_its_own_free_port() -> None:
    ports = metrics_ports({"OTEL_METRICS_EXPORTER": "console, Prometheus"}, NAMES)
    assert sorted(ports) == sorted(NAMES)
    assert len(set(ports.values())) == 3


def test_a_chosen_port_is_the_first_and_the_others_follow_it() -> None:
    env = {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": "9600"}
    assert metrics_ports(env, NAMES) == {"worker-1": 9600, "worker-2": 9601, "publisher": 9602}


def test_the_stack_says_where_each_process_logs_and_is_scraped(redis_url: str) -> None:
    stack = LocalStack(redis_url, env={"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_HOST": "::1"})
    lines = stack.where().splitlines()
    assert [line.split()[0] for line in lines] == ["upstream", *NAMES]
    assert all(f"log {stack.logdir}/" in line for line in lines)
    assert "metrics" not in lines[0]
    for name, line in zip(NAMES, lines[1:], strict=True):
        assert line.endswith(f"metrics http://::1:{stack.metrics_ports[name]}/metrics")


def _families(url: str) -> dict[str, float]:
    """Sample name → the sum of its values over every label set; empty while the port refuses."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
    except urllib.error.URLError:  # asked again until SCRAPE_GUARD_S; the final assert names what is missing
        return {}
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def test_demo_with_prometheus_serves_every_process_on_its_own_port(redis_url: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url, "FANOUT_REDIS_PREFIX": "", "PYTHONUNBUFFERED": "1",
           "OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
           "FANOUT_METRICS_POLL_S": "0.2"}
    demo = subprocess.Popen([sys.executable, "-m", "fanout_cli", "demo", "--keep-running", "--delay-ms", "0"],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    lines: list[str] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("the stack is still running"):
                break
        printed = "".join(lines)
        assert "9/9 streams match" in printed, printed
        urls = dict(re.findall(r"^  (worker-\d|publisher)\s+log \S+  metrics (\S+)$", printed, flags=re.MULTILINE))
        logs = dict(re.findall(r"^  (\S+)\s+log (\S+)", printed, flags=re.MULTILINE))
        assert sorted(urls) == sorted(NAMES), printed
        assert len(set(urls.values())) == 3
        deadline = time.monotonic() + SCRAPE_GUARD_S
        while True:
            scraped = {name: _families(url) for name, url in urls.items()}
            ended = sum(scraped[w].get("fanout_jobs_ended_total", 0.0) for w in ("worker-1", "worker-2"))
            # the pending gauge is read from XINFO GROUPS every FANOUT_METRICS_POLL_S: it may trail the counters
            polled = all("fanout_jobs_pending" in scraped[w] for w in ("worker-1", "worker-2"))
            if (ended >= 9 and polled) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        # every demo job, counted by the worker that ran it (a port that never answered: its log says why)
        assert ended == 9, ({name: sorted(found) for name, found in scraped.items()},
                            {name: Path(logs[name]).read_text(encoding="utf-8")[-2000:]
                             for name in NAMES if not scraped[name]})
        assert polled, {w: (sorted(scraped[w]), Path(logs[w]).read_text(encoding="utf-8")[-2000:])
                        for w in ("worker-1", "worker-2") if "fanout_jobs_pending" not in scraped[w]}
        assert any(name.startswith("fanout_sse_") for name in scraped["publisher"])
        for name in ["upstream", *NAMES]:
            assert "Address already in use" not in Path(logs[name]).read_text(encoding="utf-8")
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=60) == 0  # after the streams: a normal stop
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        if demo.stdout is not None:
            demo.stdout.close()
