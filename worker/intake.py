"""Job intake from the jobs stream: the ``workers`` consumer group, new entries and reclaimed ones.

Each worker process is one consumer (:func:`consumer_name`). It asks for no more entries
than it has free slots: ``XREADGROUP ... COUNT <free> BLOCK <ms> STREAMS <jobs> >`` for new
jobs, and ``XAUTOCLAIM <jobs> workers <me> <lease_ms> <cursor> COUNT <free>`` for jobs whose
owner stopped renewing its lease (a dead or stopped worker). Redis command pages
followed: XGROUP CREATE (``MKSTREAM``), XREADGROUP, XAUTOCLAIM (6.2 reply: cursor and
entries; 7.0 adds deleted ids, ignored here).

Redis Cluster: every command here names the jobs stream alone (one key, one slot) and no
script runs here; the stream's own keys are touched only after the claim
(:mod:`worker.lease`), in their own slot.
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from schema.keys import JOB_FIELD, JOBS_GROUP, Keys

JobEntry = tuple[str, bytes | None]
"""A jobs-stream entry: (entry id, the Job JSON of field ``j``, or ``None`` if missing)."""


def consumer_name() -> str:
    """Return this process's consumer name: ``<hostname>-<pid>-<random hex>``."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def _entries(raw: Any) -> list[JobEntry]:
    out: list[JobEntry] = []
    for item in raw or []:
        if not item or item[0] is None:
            continue  # an entry deleted while pending (Redis 6.2 XAUTOCLAIM gives it as nil)
        entry_id, fields = item[0], item[1]
        text_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        out.append((text_id, (fields or {}).get(JOB_FIELD)))
    return out


class Intake:
    """Reads jobs for one consumer of the ``workers`` group.

    Args:
        redis: asyncio client (``decode_responses`` off).
        keys: Key layout.
        consumer: This process's consumer name.
        lease_s: Entries idle this long are reclaimed from their (dead) owner.
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys, *, consumer: str, lease_s: float) -> None:
        self.redis, self.keys, self.consumer = redis, keys, consumer
        self.min_idle_ms = max(1, int(lease_s * 1000))
        self._cursor = "0-0"

    async def ensure_group(self) -> None:
        """Create the jobs stream and the ``workers`` group if missing.

        The group starts at id 0, so jobs enqueued before the first worker started are read.
        """
        try:
            await self.redis.xgroup_create(self.keys.jobs, JOBS_GROUP, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read_new(self, count: int, *, block_ms: int) -> list[JobEntry]:
        """Return up to ``count`` never-delivered jobs, waiting up to ``block_ms`` for one."""
        reply: Any = await self.redis.xreadgroup(
            JOBS_GROUP, self.consumer, {self.keys.jobs: ">"}, count=count, block=block_ms,
        )
        return [entry for stream in reply or [] for entry in _entries(stream[1])]

    async def reclaim(self, count: int) -> list[JobEntry]:
        """Take over up to ``count`` jobs idle for the lease (their owner stopped renewing).

        Walks the pending list with a cursor across calls, so one call costs at most
        ``count`` entries.
        """
        reply = await self.redis.xautoclaim(
            self.keys.jobs, JOBS_GROUP, self.consumer, self.min_idle_ms, start_id=self._cursor, count=count,
        )
        cursor = reply[0]
        self._cursor = cursor.decode() if isinstance(cursor, bytes) else str(cursor)
        return _entries(reply[1])

