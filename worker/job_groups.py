"""The jobs consumer group's state per shard, read for the ``fanout.jobs.pending`` / ``fanout.jobs.lag`` gauges.

OpenTelemetry calls observable-gauge callbacks synchronously at collection time, so they
cannot await Redis: :func:`watch_job_groups` reads ``XINFO GROUPS`` of every jobs stream
every ``interval_s`` and hands the numbers to :meth:`worker.telemetry.Telemetry.job_groups`,
whose callbacks report the last values read. ``pending`` is the group's pending entries
(delivered, not acked); ``lag`` is the entries not yet delivered (Redis 7.0+; ``nil`` when
Redis cannot tell, e.g. after entries were deleted, and then not reported).

Follows the Redis command page of XINFO GROUPS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import redis.exceptions

from infra.redis_client import REDIS_ERRORS, RedisClient
from schema.keys import JOBS_GROUP
from worker.telemetry import Telemetry

log = logging.getLogger("fanout.worker.job_groups")

JobStream = tuple[str, str]
"""(shard number as decimal text, jobs stream key)."""


async def read_job_groups(client: RedisClient, streams: Sequence[JobStream], telemetry: Telemetry) -> None:
    """Read ``XINFO GROUPS`` of each jobs stream once and record the ``workers`` group's pending and lag.

    A stream or group that does not exist yet records nothing; a Redis error is counted
    (``fanout.redis.errors``) and that shard keeps its previous values.
    """
    for shard, key in streams:
        try:
            groups = await client.xinfo_groups(key)
        except redis.exceptions.ResponseError as exc:
            if "no such key" not in str(exc).lower():
                telemetry.redis_error(exc)
            continue
        except REDIS_ERRORS as exc:
            telemetry.redis_error(exc)
            log.warning("event=job_groups_unread shard=%s error=%s", shard, type(exc).__name__)
            continue
        for group in groups:
            name = group.get("name")
            if (name.decode() if isinstance(name, bytes) else name) == JOBS_GROUP:
                lag = group.get("lag")
                telemetry.job_groups(shard, pending=int(group.get("pending") or 0),
                                     lag=int(lag) if lag is not None else None)


async def watch_job_groups(client: RedisClient, streams: Sequence[JobStream], telemetry: Telemetry, *,
                           interval_s: float, stop: asyncio.Event) -> None:
    """Call :func:`read_job_groups` every ``interval_s`` seconds until ``stop`` is set.

    Returns at once when ``telemetry`` exports no metrics.
    """
    while telemetry.metrics_enabled and not stop.is_set():
        await read_job_groups(client, streams, telemetry)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
