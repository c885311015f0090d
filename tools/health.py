"""``fanout health``: the container health check (Docker ``HEALTHCHECK``, Kubernetes exec probes).

Exit 0 when, within the timeout, Redis (``REDIS_URL``, default ``redis://localhost:6379/0``, a cluster seed with
``FANOUT_REDIS_CLUSTER=1``) answers PING and takes a probe write (``SET <FANOUT_REDIS_PREFIX>:probe 1 PX``,
:func:`infra.storage.probe_write`: fails while Redis refuses writes, e.g. ``OOM``,
``NOREPLICAS``, ``READONLY``, ``MISCONF``), every cluster primary reports
``cluster_state:ok`` (cluster mode), every jobs stream in use (``FANOUT_JOB_SHARDS``, the
recorded shard counts, ``FANOUT_REDIS_PREFIX``) has its ``workers`` consumer group, and,
when ``FANOUT_HEALTH_URL`` (or ``--url``) is set, that URL answers 200; exit 1 otherwise,
printing each problem: the cause and kind ``/readyz`` gives (one table:
:func:`infra.redis_faults.readiness_cause`), then the URL (password masked) and the
server's message, for the operator. A missing group means no worker (nor
publisher, whose ``/readyz`` creates it) has run under this prefix yet, a mistyped
``FANOUT_REDIS_PREFIX``, or a Redis that lost its data (restart without persistence,
failover to an empty replica): a running worker recreates it on its next read, so the
check passes again once one did. Exit 2 when ``REDIS_URL`` is not a Redis URL, ``--url``
is not an ``http(s)://`` URL, or ``--timeout-s`` is not above 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import aiohttp

from fanout_client.client import base_url_problem
from infra.groups import missing_groups, streams_in_use
from infra.redis_client import REDIS_ERRORS, RedisOptions, cluster_mode_mismatch, cluster_problems, connect
from infra.redis_faults import readiness_cause
from infra.storage import probe_write
from schema.cli import CommandError, above, check_redis_url, redact_url
from schema.keys import Keys
from schema.settings import SettingsError
from worker.error_policy import safe_message
from worker.settings import load_worker_settings


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Declare the ``health`` options."""
    parser.add_argument("--url", default=os.environ.get("FANOUT_HEALTH_URL"),
                        help="HTTP URL that must answer 200 (env FANOUT_HEALTH_URL; default: none)")
    parser.add_argument("--timeout-s", type=above(0.0), default=3.0, help="limit of each check, seconds (> 0)")


def run(args: argparse.Namespace) -> int:
    """Run the checks; return 0 when healthy.

    Raises:
        CommandError: ``REDIS_URL`` is not a Redis URL, or ``--url`` (``FANOUT_HEALTH_URL``)
            is not an ``http(s)://`` URL (exit 2).
    """
    check_redis_url(os.environ.get("REDIS_URL") or "redis://")
    if args.url:
        problem = base_url_problem(args.url)
        if problem is not None:
            source = "--url" if os.environ.get("FANOUT_HEALTH_URL") != args.url else "FANOUT_HEALTH_URL"
            raise CommandError(f"{source}: {problem}")
    problems = asyncio.run(_check(args.url, args.timeout_s))
    for problem in problems:
        sys.stderr.write(f"fanout health: unhealthy: {problem}\n")
    return 1 if problems else 0


def missing_group_problem(stream: str, prefix: str) -> str:
    """Word a jobs stream without its ``workers`` group, naming the likelier causes first."""
    return (f"redis: jobs stream {stream} has no consumer group 'workers': no worker has started under "
            f"FANOUT_REDIS_PREFIX={prefix} yet, the prefix is mistyped, or Redis lost its data "
            "(a running worker recreates the group on its next read)")


async def redis_problems(timeout_s: float) -> list[str]:
    """Check the Redis of the environment (module docstring; ``REDIS_URL`` unset: its default); ``[]`` when healthy."""
    try:
        settings = load_worker_settings(os.environ)
    except SettingsError as exc:
        return [f"configuration: {exc}"]
    options = RedisOptions(cluster=settings.redis_cluster, socket_timeout_s=timeout_s, connect_timeout_s=timeout_s,
                           retries=0)
    try:
        client = connect(settings.redis_url, options)
    except (*REDIS_ERRORS, ValueError) as exc:
        return [f"redis: {type(exc).__name__}: {exc}"]
    try:
        async with asyncio.timeout(timeout_s * 3):
            await client.ping()
            keys = Keys(settings.redis_prefix)
            await probe_write(client, keys.probe, timeout_s=timeout_s)
            problems = [f"redis cluster: {p}" for p in await cluster_problems(client)]
            streams = await streams_in_use(client, keys, settings.job_shards)
            problems += [missing_group_problem(s, settings.redis_prefix) for s in await missing_groups(client, streams)]
            return problems
    except (*REDIS_ERRORS, OSError, TimeoutError) as exc:
        if mismatch := cluster_mode_mismatch(exc, settings.redis_cluster):
            return [f"redis at {redact_url(settings.redis_url)}: {mismatch}"]
        return [redis_problem(exc, settings.redis_url, timeout_s)]
    finally:
        await client.aclose()


def redis_problem(exc: BaseException, redis_url: str, timeout_s: float) -> str:
    """Word one failed check: the cause and kind ``/readyz`` gives, then for the operator the URL and the server's text.

    ``redis at redis://host:6379/0: replicas missing (NOREPLICAS) [transient]: ResponseError:
    NOREPLICAS Not enough good replicas to write.`` (:func:`infra.redis_faults.readiness_cause`;
    the URL's password and credentials in the text are masked).
    """
    cause, fault = readiness_cause(exc)
    if isinstance(exc, TimeoutError):
        cause = f"no answer within {timeout_s:g} s"
    detail = safe_message(str(exc))
    return f"redis at {redact_url(redis_url)}: {cause} [{fault}]" + (
        f": {type(exc).__name__}: {detail}" if detail else "")


async def _check(url: str | None, timeout_s: float) -> list[str]:
    problems = await redis_problems(timeout_s)
    if url:
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as resp:
                if resp.status != 200:
                    problems.append(f"{url}: HTTP {resp.status}")
        except TimeoutError:
            problems.append(f"{url}: no answer within {timeout_s:g} s (FANOUT_HEALTH_URL or --url; --timeout-s)")
        except aiohttp.ClientError as exc:
            detail = safe_message(str(exc))
            problems.append(f"{url}: {type(exc).__name__}{': ' + detail if detail else ''}"
                            " (check FANOUT_HEALTH_URL or --url)")
    return problems
