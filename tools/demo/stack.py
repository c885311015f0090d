"""A whole fanout deployment on one machine, as real processes: for the demo and end-to-end tests.

:class:`LocalStack` starts ``fanout upstream`` (recorded transcripts served as the four
providers would), N ``fanout worker`` processes and one ``fanout publisher``, all on
loopback and sharing one Redis and one key prefix, and stops every one of them on exit.
Each process logs to its own file in :attr:`LocalStack.logdir`; with
``OTEL_METRICS_EXPORTER=prometheus`` each worker and the publisher serve ``/metrics`` on a
port of their own (:attr:`LocalStack.metrics_ports`), never all on the exporter's 9464.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Final

ROOT: Final = Path(__file__).resolve().parents[2]
START_TIMEOUT_S: Final = 30.0
"""How long a process may take to listen on its port."""
STOP_TIMEOUT_S: Final = 15.0
"""How long processes may take to exit after SIGTERM before they are killed."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(port: int, timeout_s: float = START_TIMEOUT_S, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until something accepts connections on ``127.0.0.1:port``.

    Raises:
        RuntimeError: Nothing listened in time, or ``proc`` exited first.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout_s} s")


def metrics_ports(environ: Mapping[str, str], names: list[str]) -> dict[str, int]:
    """Give each process in ``names`` its own Prometheus port when ``OTEL_METRICS_EXPORTER`` asks for ``prometheus``.

    Args:
        environ: The environment the processes get.
        names: The processes that export metrics (the workers and the publisher).

    Returns:
        Name → port: ``OTEL_EXPORTER_PROMETHEUS_PORT`` + 0, 1, 2 ... in ``names`` order when
        that variable is a port number, else a free port each; empty without the exporter.
    """
    asked = {name.strip().lower() for name in environ.get("OTEL_METRICS_EXPORTER", "").split(",")}
    if "prometheus" not in asked or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return {}
    base = environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "").strip()
    if base.isdigit() and 0 < int(base) <= 65535 - len(names):
        return {name: int(base) + n for n, name in enumerate(names)}
    return {name: free_port() for name in names}


class LocalStack:
    """Upstream, workers and publisher as subprocesses; a context manager.

    Args:
        redis_url: The Redis every process uses.
        workers: How many ``fanout worker`` processes to start.
        delay_ms: Upstream pause between chunks, so bodies really stream.
        chunk_bytes: Upstream chunk size.
        slow_delay_ms: Upstream pause between provider events of ``slow-<case>`` models.
        slow_pacing: What ``slow-<case>`` sends between pauses: ``event`` (one provider event,
            as a person watching wants) or ``chunk`` (one ``chunk_bytes`` chunk).
        prefix: Redis key prefix (default: a fresh random one, isolating this stack).
        env: Extra environment for every process (overrides the defaults).
    """

    def __init__(
        self,
        redis_url: str,
        *,
        workers: int = 2,
        delay_ms: int = 40,
        chunk_bytes: int = 96,
        slow_delay_ms: int = 1000,
        slow_pacing: str = "event",
        prefix: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.redis_url, self.workers = redis_url, workers
        self.delay_ms, self.chunk_bytes, self.slow_delay_ms = delay_ms, chunk_bytes, slow_delay_ms
        self.slow_pacing = slow_pacing
        self.prefix = prefix or f"fanout-stack-{secrets.token_hex(4)}"
        self.api_key = f"key-{secrets.token_hex(8)}"
        self.upstream_port, self.publisher_port = free_port(), free_port()
        self.extra_env = env or {}
        self.procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []
        self.logdir = Path(tempfile.mkdtemp(prefix="fanout-stack-"))
        self.keep_logs = False
        """Keep :attr:`logdir` on exit even when nothing failed (set by a caller that pointed a person at it)."""
        self.metrics_ports = metrics_ports({**os.environ, **self.extra_env}, self.process_names()[1:])
        """Prometheus port of each worker and the publisher; empty unless the exporter is asked for."""

    @property
    def base_url(self) -> str:
        """Root URL of the publisher."""
        return f"http://127.0.0.1:{self.publisher_port}"

    @property
    def upstream_url(self) -> str:
        """Root URL of the fake provider."""
        return f"http://127.0.0.1:{self.upstream_port}"

    def process_names(self) -> list[str]:
        """Names of the processes in start order: ``upstream``, ``worker-1`` .. ``worker-N``, ``publisher``."""
        return ["upstream", *(f"worker-{n}" for n in range(1, self.workers + 1)), "publisher"]

    def log_path(self, name: str) -> Path:
        """Where process ``name`` writes its output (stdout and stderr)."""
        return self.logdir / f"{name}.log"

    def metrics_url(self, name: str) -> str | None:
        """Where to scrape process ``name`` (``http://<host>:<port>/metrics``), or ``None`` without Prometheus."""
        port = self.metrics_ports.get(name)
        host = {**os.environ, **self.extra_env}.get("OTEL_EXPORTER_PROMETHEUS_HOST") or "localhost"
        return None if port is None else f"http://{host}:{port}/metrics"

    def where(self) -> str:
        """Return one line per process: where it logs and, with Prometheus, where to scrape it."""
        lines = []
        for name in self.process_names():
            url = self.metrics_url(name)
            lines.append(f"  {name:<10} log {self.log_path(name)}" + (f"  metrics {url}" if url else ""))
        return "\n".join(lines)

    def env(self) -> dict[str, str]:
        """Environment of every process of the stack."""
        return {
            **os.environ,
            "REDIS_URL": self.redis_url,
            "FANOUT_REDIS_PREFIX": self.prefix,
            "FANOUT_OPENAI_BASE_URL": f"{self.upstream_url}/v1",
            "FANOUT_ANTHROPIC_BASE_URL": self.upstream_url,
            "FANOUT_GEMINI_BASE_URL": self.upstream_url,
            "OPENAI_API_KEY": "local-openai-key",
            "ANTHROPIC_API_KEY": "local-anthropic-key",
            "GEMINI_API_KEY": "local-gemini-key",
            "FANOUT_API_KEYS": self.api_key,
            "FANOUT_TOKEN_SECRET": secrets.token_hex(32),
            "FANOUT_DEMO_PAGE": "1",
            "FANOUT_MAX_RETRIES": "0",
            **self.extra_env,
        }

    def __enter__(self) -> LocalStack:
        env = self.env()
        fanout = [sys.executable, "-m", "fanout_cli"]
        pacing = ["--delay-ms", str(self.delay_ms), "--chunk-bytes", str(self.chunk_bytes),
                  "--slow-delay-ms", str(self.slow_delay_ms), "--slow-pacing", self.slow_pacing]
        try:
            upstream = self._spawn("upstream", [*fanout, "upstream", "--host", "127.0.0.1",
                                                "--port", str(self.upstream_port), *pacing], env)
            for n in range(1, self.workers + 1):
                self._spawn(f"worker-{n}", [*fanout, "worker", "--concurrency", "8"], env)
            publisher = self._spawn("publisher", [*fanout, "publisher", "--host", "127.0.0.1",
                                                  "--port", str(self.publisher_port)], env)
            wait_for_port(self.upstream_port, proc=upstream)
            wait_for_port(self.publisher_port, proc=publisher)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        if name in self.metrics_ports:
            env = {**env, "OTEL_EXPORTER_PROMETHEUS_PORT": str(self.metrics_ports[name])}
        log = self.log_path(name).open("wb")
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603
        self.procs.append((name, proc, log))
        return proc

    def alive(self) -> bool:
        """Whether every process still runs."""
        return all(proc.poll() is None for _, proc, _ in self.procs)

    def logs(self, name: str) -> str:
        """Return the output of one process so far (``upstream``, ``worker-1``, ``publisher``, ...)."""
        path = self.log_path(name)
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def stop(self) -> list[str]:
        """Stop every process (SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`).

        Returns:
            One line per process that exited abnormally, with the tail of its output.
        """
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        problems: list[str] = []
        for name, proc, log in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            if proc.returncode not in (0, -15):
                problems.append(f"[{name} exited {proc.returncode}] {self.logs(name)[-1500:]}")
        self.procs.clear()
        return problems

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        problems = self.stop()
        for problem in problems:
            sys.stderr.write(problem + "\n")
        failed = exc_type is not None and not issubclass(exc_type, KeyboardInterrupt)  # Ctrl-C is a normal stop
        if problems or failed or self.keep_logs:
            sys.stderr.write(f"process logs kept in {self.logdir}\n")
        else:
            shutil.rmtree(self.logdir, ignore_errors=True)
