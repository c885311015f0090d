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
from typing import Any, Final

import redis.exceptions

from infra.groups import ensure_jobs_group, is_nogroup, streams_in_use, text
from infra.redis_client import RedisClient
from schema.keys import JOB_FIELD, JOBS_GROUP, Keys

log = logging.getLogger("fanout.worker.intake")

JobEntry = tuple[str, bytes | None]
"""A jobs-stream entry: (job ref ``<jobs stream>/<entry id>``, the Job JSON of field ``j``, or ``None``)."""

SHARD_REFRESH_S: Final = 30.0
"""How often the streams in use are re-read (``SMEMBERS P:jobshards``, ``EXISTS P:jobs``), seconds."""


def consumer_name() -> str:
    """Return this process's consumer name: ``<hostname>-<pid>-<random hex>``."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def _entries(stream: str, keys: Keys, raw: Any) -> list[JobEntry]:
    out: list[JobEntry] = []
    for item in raw or []:
        if not item or item[0] is None:
            continue  # an entry deleted while pending (Redis 6.2 XAUTOCLAIM gives it as nil)
        entry_id, fields = item[0], item[1]
        out.append((keys.job_ref(stream, text(entry_id)), (fields or {}).get(JOB_FIELD)))
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
            if not is_nogroup(exc):
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
            if not is_nogroup(exc):
                raise
            await self._recreate(stream, exc)
            return []
        self._cursors[stream] = text(reply[0])
        return _entries(stream, self.keys, reply[1])
