"""Real ``fanout publisher`` processes for the fault scenarios, their logs and their Prometheus figures.

A :class:`PublisherProcess` runs the real entry point (uvloop, the real edge and log setup)
on a loopback port it picks itself (``--port 0``; the port is read from its ``listening on``
line), with its environment cleared of the caller's ``FANOUT_*``/``OTEL_*`` variables, and
writes its log to a file the test reads afterwards.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.faults.polling import until
from tests.publisher.helpers import API_KEY, SECRET
from tools.demo.stack import free_port

ROOT = Path(__file__).resolve().parents[2]
START_GUARD_S = 30.0
"""Hang guard of a start: a loaded 2-core machine may take seconds to import everything."""
BAD_NEEDLES = ("Traceback", "level=ERROR", '"level": "ERROR"', "never retrieved", "was never awaited",
               "Task was destroyed", "Unclosed", "unexpected error")
"""What no fault may make a process log: a traceback, an ERROR record, an unretrieved task error."""


def log_problems(text: str, *, allowed: tuple[str, ...] = ()) -> list[str]:
    """Return the lines of ``text`` holding one of :data:`BAD_NEEDLES` and none of ``allowed``."""
    return [line[:300] for line in text.splitlines()
            if any(needle in line for needle in BAD_NEEDLES) and not any(a in line for a in allowed)]


def clean_env(**extra: str) -> dict[str, str]:
    """``os.environ`` without ``FANOUT_*``/``OTEL_*`` variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FANOUT_", "OTEL_"))}
    env.update(extra)
    return env


class PublisherProcess:
    """One real ``fanout publisher`` on 127.0.0.1 (``API_KEY``, ``SECRET`` of the publisher tests).

    Args:
        redis_url: ``REDIS_URL``.
        prefix: ``FANOUT_REDIS_PREFIX``.
        metrics: Serve the Prometheus endpoint (``OTEL_METRICS_EXPORTER=prometheus``) on a free port.
        env: More variables (``FANOUT_*`` settings), strings.
    """

    def __init__(self, redis_url: str, prefix: str, *, metrics: bool = False, **env: str) -> None:
        self.metrics_port = free_port() if metrics else 0
        exporter = {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
                    "OTEL_EXPORTER_PROMETHEUS_PORT": str(self.metrics_port)} if metrics else {}
        self.env = clean_env(**{"REDIS_URL": redis_url, "FANOUT_REDIS_PREFIX": prefix, "FANOUT_API_KEYS": API_KEY,
                                "FANOUT_TOKEN_SECRET": SECRET, "FANOUT_SHUTDOWN_WINDOW_S": "0", **exporter, **env})
        self.log_path = Path(tempfile.mkstemp(prefix="fanout-faults-publisher-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def base(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        """Everything the process logged so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    async def start(self) -> PublisherProcess:
        """Start the process; return once its ``listening on`` line names its port."""
        with self.log_path.open("wb") as out:  # Popen returns at once; the wait below polls without blocking
            self.proc = subprocess.Popen([sys.executable, "-m", "fanout_cli", "publisher", "--host",  # noqa: ASYNC220
                                          "127.0.0.1", "--port", "0"], env=self.env, cwd=ROOT, stdout=out, stderr=out)

        def listening() -> bool:
            assert self.proc is not None
            assert self.proc.poll() is None, f"the publisher exited at start: {self.log()[-2000:]}"
            return "listening on http://" in self.log()

        await until(listening, f"the publisher listens (log: {self.log_path})", guard_s=START_GUARD_S)
        match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.log())
        assert match is not None
        self.port = int(match.group(1))
        return self

    async def stop(self, guard_s: float = START_GUARD_S) -> int | None:
        """SIGTERM and wait without blocking the loop; its exit status, ``None`` if it had to be killed."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        proc = self.proc
        try:
            await until(lambda: proc.poll() is not None, "the publisher exits after SIGTERM", guard_s=guard_s)
        except AssertionError:
            proc.kill()
            proc.wait()
            return None
        return proc.returncode

    def rss_kb(self) -> int:
        """The process's resident set size (``VmRSS`` of ``/proc/<pid>/status``), KiB."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS line")

    async def metric(self, name: str) -> float:
        """The sum of every sample of the Prometheus metric ``name`` (all labels), 0 when absent."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.metrics_port)
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        body = (await reader.read()).decode()
        writer.close()
        pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", re.MULTILINE)
        return sum(float(value) for value in pattern.findall(body))

    async def until_metric(self, name: str, wanted: float, guard_s: float = START_GUARD_S) -> None:
        """Poll the metric until it equals ``wanted``; fail after ``guard_s``."""
        async def reached() -> bool:
            return await self.metric(name) == wanted

        await until(reached, f"{name} == {wanted}", guard_s=guard_s)

    def remove(self) -> None:
        """Kill the process if it still runs and delete its log."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log_path.unlink(missing_ok=True)
