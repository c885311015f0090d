"""Helpers of the background-mode tests: an upstreams file with a background endpoint, goldens, comparisons.

The endpoint ``bg`` speaks ``openai_responses`` to the fake provider (:mod:`tools.fake_background`)
with ``background = true``; a job names it and a recorded case as its model.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from infra.redis_client import RedisClient
from schema.contract import Event
from schema.keys import Keys
from tests.conftest import is_cluster_url
from tests.worker.support import strip_volatile
from tools.replay import replay_file
from tools.upstream import DEFAULT_ROOTS

ROOT = Path(__file__).resolve().parents[2]

TEXT = "simple_text_mixed_scripts"
"""A text answer (14 events)."""
TOOL = "function_call_fragmented_json"
"""A tool call whose arguments arrive in fragments (14 events)."""
MIXED = "several_blocks_reasoning_text_and_call"
"""Reasoning, text and a tool call (18 events)."""


def background_toml(base: str, *, background: bool = True) -> str:
    """Return an upstreams file with the endpoints ``bg`` (OpenAI Responses) and ``bgi`` (Gemini
    Interactions) on the fake at ``base``."""
    flag = "true" if background else "false"
    return (f'[endpoints.bg]\napi = "openai_responses"\nurl = "{base}/v1"\nauth = "none"\n'
            f"background = {flag}\n"
            f'[endpoints.bgi]\napi = "gemini_interactions"\nurl = "{base}"\nauth = "none"\n'
            f"background = {flag}\n")


def comparable(events: list[Event]) -> list[dict[str, Any]]:
    """Events without what differs between runs: ``ts``, ids, the epoch, the response id and the endpoint."""
    out = strip_volatile(events)
    for item in out:
        item.pop("response_id", None)
        item.pop("endpoint", None)
    return out


def golden(case: str, directory: str = "openai_responses") -> list[dict[str, Any]]:
    """The case's transcript normalized offline (:func:`tools.replay.replay_file`), comparable."""
    events, _ = replay_file(DEFAULT_ROOTS[0] / directory / f"{case}.sse")
    return comparable(events)


LEASE_S = 1.0
"""The workers' lease in the hand-over tests: a dead worker's stream is reclaimed after it."""


class Workers:
    """Real ``fanout worker`` processes on one upstreams file; a job's holder found by its pending entry.

    Args:
        base: The fake provider's base URL.
        redis_url: ``REDIS_URL``.
        keys: The test's key namespace.
        directory: Where the upstreams file and the logs go.
        env: More ``FANOUT_*`` variables.
    """

    def __init__(self, base: str, redis_url: str, keys: Keys, directory: Path, **env: str) -> None:
        toml = directory / "upstreams.toml"
        toml.write_text(background_toml(base))
        self.directory, self.keys = directory, keys
        self.env = {**os.environ, "REDIS_URL": redis_url, "FANOUT_REDIS_PREFIX": keys.prefix,
                    "FANOUT_BLOCK_MS": "50", "FANOUT_LEASE_S": str(LEASE_S), "FANOUT_UPSTREAMS_FILE": str(toml),
                    "FANOUT_REDIS_CLUSTER": "1" if is_cluster_url(redis_url) else "0", **env}
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self, count: int = 1) -> None:
        """Start ``count`` more processes."""
        for _ in range(count):
            log = self.directory / f"worker-{len(self.procs)}.log"
            with log.open("wb") as sink:
                self.procs.append(await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "fanout_cli", "worker", "--concurrency", "4", cwd=ROOT, env=self.env,
                    stdout=sink, stderr=sink))

    def logs(self) -> str:
        """Every process's log so far."""
        return "".join(path.read_text(errors="replace") for path in sorted(self.directory.glob("worker-*.log")))

    async def holder(self, redis: RedisClient) -> asyncio.subprocess.Process | None:
        """The process whose consumer holds the pending job entry, if any (``<host>-<pid>-<hex>``)."""
        pending = await redis.xpending_range(self.keys.jobs_shard(0), "workers", min="-", max="+", count=10)
        pids = {int(p["consumer"].decode().rsplit("-", 2)[1]) for p in pending}
        return next((p for p in self.procs if p.pid in pids and p.returncode is None), None)

    async def stop(self) -> None:
        """Kill every process still running and reap them all."""
        for proc in self.procs:
            if proc.returncode is None:
                proc.kill()
        for proc in self.procs:
            await proc.wait()


@contextlib.asynccontextmanager
async def workers(base: str, redis_url: str, keys: Keys, directory: Path, count: int, **env: str) -> AsyncIterator[
        Workers]:
    """Run ``count`` worker processes until the block ends."""
    running = Workers(base, redis_url, keys, directory, **env)
    try:
        await running.start(count)
        yield running
    finally:
        await running.stop()


def contiguous(ids: list[str]) -> bool:
    """Whether stored entry ids are ``0-1 .. 0-n``, each once."""
    return ids == [f"0-{seq}" for seq in range(1, len(ids) + 1)]
