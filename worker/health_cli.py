"""``fanout health``: the container health check (Docker ``HEALTHCHECK``, Kubernetes exec probes).

Exit 0 when Redis (``REDIS_URL``) answers PING and takes a write within the timeout
(``SET <FANOUT_REDIS_PREFIX>:probe 1 PX``, :func:`worker.storage.probe_write`: fails while
Redis refuses writes, e.g. ``OOM``, ``READONLY``, ``MISCONF``) and, when
``FANOUT_HEALTH_URL`` (or ``--url``) is set, that URL answers 200; exit 1 otherwise,
printing why.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import aiohttp
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from schema.keys import Keys
from worker.error_policy import safe_message
from worker.storage import probe_write


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Declare the ``health`` options."""
    parser.add_argument("--url", default=os.environ.get("FANOUT_HEALTH_URL"), help="HTTP URL that must answer 200")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="limit of each check, seconds")


def run(args: argparse.Namespace) -> int:
    """Run the checks; return 0 when healthy."""
    problems = asyncio.run(_check(args.url, args.timeout_s))
    for problem in problems:
        sys.stderr.write(f"unhealthy: {problem}\n")
    return 1 if problems else 0


async def _check(url: str | None, timeout_s: float) -> list[str]:
    problems: list[str] = []
    redis_url = os.environ.get("REDIS_URL")
    if redis_url:
        client = aioredis.Redis.from_url(redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        try:
            await client.ping()
            written = await probe_write(client, Keys(os.environ.get("FANOUT_REDIS_PREFIX", "fanout")).probe,
                                        timeout_s=timeout_s)
            if written is not None:
                problems.append(f"redis: {written}")
        except (RedisError, OSError) as exc:
            problems.append(f"redis: {type(exc).__name__}: {safe_message(str(exc))}")
        finally:
            await client.aclose()
    if url:
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as resp:
                if resp.status != 200:
                    problems.append(f"{url}: HTTP {resp.status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            problems.append(f"{url}: {type(exc).__name__}")
    return problems
