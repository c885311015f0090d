"""Job intake from the sharded jobs streams: the ``workers`` group, new entries and reclaimed ones.

Each worker process is one consumer (:func:`consumer_name`) of the ``workers`` group on
EVERY jobs stream in use (:meth:`Intake.streams`): shards ``P:jobs:{0} .. P:jobs:{n-1}``
with ``n`` the largest of the worker's own ``FANOUT_JOB_SHARDS`` and every count a
publisher recorded in the ``P:jobshards`` set (so jobs queued under an older or newer
shard count keep being served), plus the legacy ``P:jobs`` of earlier releases while it
exists. The set is re-read every :data:`SHARD_REFRESH_S`.

Per stream, the runner (:mod:`worker.runner`) keeps one reader that asks for no more
entries than the process has free slots: ``XAUTOCLAIM <stream> workers <me> <lease_ms>
<cursor> COUNT <free>`` for jobs whose owner stopped renewing its lease, else
``XREADGROUP ... COUNT <free> BLOCK <block_ms> STREAMS <stream> >``. A reply naming a
missing group (``NOGROUP``: Redis lost its data, or someone destroyed it; ``UNBLOCKED the
stream key no longer exists``: Redis 7's answer to a read blocked on a stream deleted
meanwhile) recreates it (``XGROUP CREATE ... 0 MKSTREAM``) and the read goes on. The legacy
``P:jobs`` is the exception: nothing writes it any more, so it is never created here
(``XGROUP CREATE`` without ``MKSTREAM``); once it is gone (an operator retired it) its
reader stops (:meth:`Intake.serves`) instead of putting it back for good.

Redis Cluster: every command here names one jobs stream (one key, one slot): a
multi-stream ``XREADGROUP`` would be cross-slot, hence one blocking read per stream.
Redis command pages followed: XGROUP CREATE (``MKSTREAM``), XREADGROUP, XAUTOCLAIM (6.2
reply: cursor and entries, a deleted entry as nil; 7.0 adds deleted ids, ignored here),
XINFO GROUPS, SMEMBERS, EXISTS.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Iterable
from typing import Any, Final

import redis.exceptions

from schema.keys import JOB_FIELD, JOBS_GROUP, MAX_JOB_SHARDS, Keys
from worker.redis_client import RedisClient
from worker.redis_faults import error_code, fault_kind

log = logging.getLogger("fanout.worker.intake")

JobEntry = tuple[str, bytes | None]
"""A jobs-stream entry: (job ref ``<jobs stream>/<entry id>``, the Job JSON of field ``j``, or ``None``)."""

SHARD_REFRESH_S: Final = 30.0
"""How often the streams in use are re-read (``SMEMBERS P:jobshards``, ``EXISTS P:jobs``), seconds."""


def consumer_name() -> str:
    """Return this process's consumer name: ``<hostname>-<pid>-<random hex>``."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _is_nogroup(exc: redis.exceptions.ResponseError) -> bool:
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
    :func:`worker.redis_faults.fault_kind`) is raised, not taken for a missing group.

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
        if not any(_text(group.get("name", b"")) == JOBS_GROUP for group in groups):
            missing.append(stream)
    return missing


def _entries(stream: str, keys: Keys, raw: Any) -> list[JobEntry]:
    out: list[JobEntry] = []
    for item in raw or []:
        if not item or item[0] is None:
            continue  # an entry deleted while pending (Redis 6.2 XAUTOCLAIM gives it as nil)
        entry_id, fields = item[0], item[1]
        out.append((keys.job_ref(stream, _text(entry_id)), (fields or {}).get(JOB_FIELD)))
    return out


class Intake:
    """Reads jobs for one consumer of the ``workers`` group, on every jobs stream in use.

    Args:
        redis: asyncio client (``decode_responses`` off), either topology.
        keys: Key layout.
        consumer: This process's consumer name.
        lease_s: Entries idle this long are reclaimed from their (dead) owner.
        shards: The worker's own ``FANOUT_JOB_SHARDS``.
    """

    def __init__(self, redis: RedisClient, keys: Keys, *, consumer: str, lease_s: float, shards: int = 1) -> None:
        self.redis, self.keys, self.consumer, self.shards = redis, keys, consumer, shards
        self.min_idle_ms = max(1, int(lease_s * 1000))
        self._cursors: dict[str, str] = {}
        self._refreshed_at = 0.0
        self._streams: list[str] = []

    async def streams(self) -> list[str]:
        """Return the jobs streams to serve now (re-read every :data:`SHARD_REFRESH_S`); groups ensured on new ones."""
        if not self._streams or time.monotonic() - self._refreshed_at >= SHARD_REFRESH_S:
            streams = await streams_in_use(self.redis, self.keys, self.shards)
            for stream in streams:
                if stream not in self._streams:
                    await ensure_jobs_group(self.redis, self.keys, stream)
            self._streams, self._refreshed_at = streams, time.monotonic()
        return list(self._streams)

    def serves(self, stream: str) -> bool:
        """Whether ``stream`` is still to be read: False once the legacy ``P:jobs`` is gone."""
        return stream != self.keys.jobs or stream in self._streams

    async def ensure_groups(self) -> None:
        """Create every stream in use and its group if missing (at start)."""
        self._streams = []
        await self.streams()

    async def _recreate(self, stream: str, exc: redis.exceptions.ResponseError) -> None:
        self._cursors.pop(stream, None)
        if stream == self.keys.jobs and not await self.redis.exists(stream):  # legacy: gone means retired
            self._streams = [s for s in self._streams if s != stream]
            log.info("event=legacy_jobs_gone stream=%s action=stop_reading", stream)
            return
        created = await ensure_jobs_group(self.redis, self.keys, stream)
        log.warning("event=group_recreated stream=%s created=%s error=%r", stream, created, str(exc))

    async def read_new(self, stream: str, count: int, *, block_ms: int) -> list[JobEntry]:
        """Return up to ``count`` never-delivered jobs of ``stream``, waiting up to ``block_ms`` for one."""
        try:
            reply: Any = await self.redis.xreadgroup(
                JOBS_GROUP, self.consumer, {stream: ">"}, count=count, block=block_ms,
            )
        except redis.exceptions.ResponseError as exc:
            if not _is_nogroup(exc):
                raise
            await self._recreate(stream, exc)
            return []
        return [entry for item in reply or [] for entry in _entries(stream, self.keys, item[1])]

    async def reclaim(self, stream: str, count: int) -> list[JobEntry]:
        """Take over up to ``count`` jobs of ``stream`` idle for the lease (their owner stopped renewing).

        Walks the pending list with a cursor per stream across calls, so one call costs at
        most ``count`` entries.
        """
        try:
            reply = await self.redis.xautoclaim(
                stream, JOBS_GROUP, self.consumer, self.min_idle_ms, start_id=self._cursors.get(stream, "0-0"),
                count=count,
            )
        except redis.exceptions.ResponseError as exc:
            if not _is_nogroup(exc):
                raise
            await self._recreate(stream, exc)
            return []
        self._cursors[stream] = _text(reply[0])
        return _entries(stream, self.keys, reply[1])
