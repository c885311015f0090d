"""The ``workers`` consumer group on the jobs streams: which streams are in use, create a missing group, find one.

Shared by the worker's intake (:mod:`worker.intake`), the publisher (its shards' groups at
start, ``/readyz``'s repair) and ``fanout health``: the group starts at id 0, so jobs
enqueued before the first worker started are read; the legacy unsharded ``P:jobs`` is
never created, only given its group. Imports nothing of the worker or the publisher.

Redis command pages followed: XGROUP CREATE (``MKSTREAM``), XINFO GROUPS, SMEMBERS, EXISTS.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis.exceptions

from infra.redis_client import RedisClient
from infra.redis_faults import error_code, fault_kind
from schema.keys import JOBS_GROUP, MAX_JOB_SHARDS, Keys


def text(value: bytes | str) -> str:
    """Return a Redis reply value as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def is_nogroup(exc: redis.exceptions.ResponseError) -> bool:
    """Whether ``exc`` says the jobs group is gone.

    ``NOGROUP``, or (Redis 7) ``UNBLOCKED the stream key no longer exists``: the answer to a
    read blocked on a stream deleted meanwhile (evicted, flushed).
    """
    code = error_code(exc)
    return code == "NOGROUP" or (code == "UNBLOCKED" and "no longer exists" in str(exc))


def _count(value: bytes | str) -> int | None:
    """Return a recorded shard count, or None unless it is ASCII decimal digits.

    ``str.isdigit`` alone also takes ``'²'`` and other Unicode digits, which ``int`` refuses.
    """
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    return int(text) if text.isascii() and text.isdigit() else None


def shard_count(own: int, recorded: Iterable[bytes | str]) -> int:
    """Return the shard count to serve: the largest of ``own`` and the valid recorded counts (capped).

    A member that is not an ASCII decimal (a stray write, bytes that are not text) is skipped.
    """
    counts = [count for count in map(_count, recorded) if count is not None]
    return min(MAX_JOB_SHARDS, max([own, *counts]))


async def streams_in_use(client: RedisClient, keys: Keys, own_shards: int) -> list[str]:
    """Every jobs stream to serve: the shards (see :func:`shard_count`), then ``P:jobs`` if it exists."""
    recorded = await client.smembers(keys.job_shards)
    streams = keys.jobs_streams(shard_count(own_shards, recorded))
    if await client.exists(keys.jobs):
        streams.append(keys.jobs)
    return streams


async def ensure_group(client: RedisClient, stream: str, *, mkstream: bool = True) -> bool:
    """Create ``stream`` (unless ``mkstream`` is false) and its ``workers`` group if missing (start id 0).

    The group starts at id 0, so jobs enqueued before the first worker started are read.

    Returns:
        True if the group was created; False if it existed, or (``mkstream`` false) the
        stream does not exist.
    """
    try:
        await client.xgroup_create(stream, JOBS_GROUP, id="0", mkstream=mkstream)
    except redis.exceptions.ResponseError as exc:
        if error_code(exc) == "BUSYGROUP" or (not mkstream and "requires the key to exist" in str(exc)):
            return False
        raise
    return True


async def ensure_jobs_group(client: RedisClient, keys: Keys, stream: str) -> bool:
    """:func:`ensure_group` for a jobs stream; the legacy ``P:jobs`` is never created, only given its group.

    Nothing writes ``P:jobs`` any more: a missing one was retired, and creating it would keep
    every worker reading it for good.
    """
    return await ensure_group(client, stream, mkstream=stream != keys.jobs)


async def missing_groups(client: RedisClient, streams: list[str]) -> list[str]:
    """Return the streams of ``streams`` that have no ``workers`` group (``XINFO GROUPS`` each).

    A stream whose ``XINFO GROUPS`` is refused for good (``ERR no such key``, ``WRONGTYPE``)
    counts as missing its group; a refusal a retry cures (``BUSY``, ``MASTERDOWN``, ...:
    :func:`infra.redis_faults.fault_kind`) is raised, not taken for a missing group.

    Raises:
        redis.exceptions.AskError: ``MOVED``/``ASK``: a plain client talks to a Cluster
            node (``FANOUT_REDIS_CLUSTER`` does not match the server); not a missing group.
        redis.exceptions.ResponseError: A transient refusal (above).
    """
    missing = []
    for stream in streams:
        try:
            groups = await client.xinfo_groups(stream)
        except redis.exceptions.AskError:
            raise
        except redis.exceptions.ResponseError as exc:
            if fault_kind(exc) != "permanent":
                raise
            groups = []  # no such key, or not a stream
        if not any(text(group.get("name", b"")) == JOBS_GROUP for group in groups):
            missing.append(stream)
    return missing
