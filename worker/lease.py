"""Ownership of a job: claim its stream (fencing token), renew, release and ack its pending entry.

A running job's lease is its pending entry's idle time in the ``workers`` consumer group:
the owner resets it with ``XCLAIM <jobs> workers <me> 0 <id> JUSTID`` every ``lease_s / 3``;
an entry idle for ``lease_s`` is taken over by another worker's ``XAUTOCLAIM``
(:mod:`worker.intake`). Every claim increments meta ``token`` (``HINCRBY``), which fences
the previous owner's appends out (:mod:`worker.appender`). All three scripts are atomic.

Redis command pages followed: HINCRBY, HSETNX, XPENDING (extended form), XCLAIM
(``JUSTID``, ``IDLE``), XACK, EVALSHA. Protocol: :mod:`schema.keys`.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from schema.keys import JOBS_GROUP, Keys

CLAIM_LUA: Final = """
if redis.call('EXISTS', KEYS[2]) == 1 then return {'done', '0', '0', '0'} end
local m = redis.call('HMGET', KEYS[1], 'state', 'last_seq', 'started_ms')
if m[1] == 'done' then return {'done', m[2] or '0', '0', m[3] or '0'} end
local token = redis.call('HINCRBY', KEYS[1], 'token', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'state', 'running', 'job_id', ARGV[5])
redis.call('HSETNX', KEYS[1], 'started_ms', ARGV[2])
redis.call('HSETNX', KEYS[1], 'last_seq', '0')
redis.call('HSETNX', KEYS[1], 'provider', ARGV[3])
redis.call('HSETNX', KEYS[1], 'model', ARGV[4])
return {'running', m[2] or '0', tostring(token), m[3] or ARGV[2]}
"""
"""KEYS = meta, tomb; ARGV = owner, now_ms, provider, model, job entry id."""

_OWNED_LUA: Final = """
if ARGV[4] ~= '' and redis.call('HGET', KEYS[2], 'token') ~= ARGV[4] then return 'fenced' end
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then return 'lost' end
"""

RENEW_LUA: Final = _OWNED_LUA + """
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
if redis.call('EXISTS', KEYS[3]) == 1 then return 'cancel' end
return 'ok'
"""
"""KEYS = jobs, meta, cancel; ARGV = group, consumer, entry id, token."""

RELEASE_LUA: Final = _OWNED_LUA + """
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[5], 'JUSTID')
return 'ok'
"""
"""KEYS = jobs, meta; ARGV = group, consumer, entry id, token ('' = unclaimed), idle ms."""

RenewOutcome = Literal["ok", "cancel", "fenced", "lost"]
"""``ok``; ``cancel`` (renewed, and the cancel flag is set); ``fenced`` (meta token moved on);
``lost`` (the pending entry belongs to another consumer, or was acked)."""


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """What claiming a stream found."""

    done: bool
    """The stream already ended (meta ``state=done`` or a tombstone): ack and skip."""
    last_seq: int
    """Meta ``last_seq`` before this claim (0: nothing stored, 1: only ``stream.start``)."""
    token: int
    """This owner's fencing token (0 when ``done``)."""
    started_ms: int
    """The stream's first claim time, ms since the epoch."""


def _text(value: bytes | str | int) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Leases:
    """Claims, lease renewals, releases and acks for one worker process (one consumer).

    Args:
        redis: asyncio client.
        keys: Key layout.
        consumer: This process's consumer name in the ``workers`` group.
        lease_s: Lease length; :meth:`release` makes an entry look this idle.
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys, *, consumer: str, lease_s: float) -> None:
        self.redis, self.keys, self.consumer = redis, keys, consumer
        self.lease_ms = max(1, int(lease_s * 1000))
        self._claim: AsyncScript = redis.register_script(CLAIM_LUA)
        self._renew: AsyncScript = redis.register_script(RENEW_LUA)
        self._release: AsyncScript = redis.register_script(RELEASE_LUA)

    async def claim(self, *, stream_id: str, provider: str, model: str, entry_id: str, now_ms: int) -> Claim:
        """Become the stream's owner: increment meta ``token``, set ``owner``, ``state=running``.

        Creates the meta fields a publisher would have set (``provider``, ``model``,
        ``last_seq=0``) when missing. A finished stream is not claimed.
        """
        reply = await self._claim(
            keys=[self.keys.meta(stream_id), self.keys.tomb(stream_id)],
            args=[self.consumer, now_ms, provider, model, entry_id],
        )
        state, last_seq, token, started = (_text(v) for v in reply)
        return Claim(done=state == "done", last_seq=int(last_seq), token=int(token), started_ms=int(started))

    async def renew(self, *, entry_id: str, stream_id: str, token: int) -> RenewOutcome:
        """Reset the job's idle time if this process still owns it; report the cancel flag.

        Returns:
            See :data:`RenewOutcome`. On ``fenced`` or ``lost`` the caller must abort the
            upstream request and stop writing (no terminal, no ack).
        """
        reply = await self._renew(
            keys=[self.keys.jobs, self.keys.meta(stream_id), self.keys.cancel(stream_id)],
            args=[JOBS_GROUP, self.consumer, entry_id, str(token)],
        )
        outcome = _text(reply)
        assert outcome in ("ok", "cancel", "fenced", "lost")
        return outcome  # type: ignore[return-value]

    async def release(self, *, entry_id: str, stream_id: str = "", token: int | None = None) -> bool:
        """Hand a job back at shutdown: leave it pending but make it look ``lease_s`` idle.

        The next ``XAUTOCLAIM`` of any worker takes it at once (and writes ``worker_lost``
        or retries). Returns False when this process no longer owned it.
        """
        reply = await self._release(
            keys=[self.keys.jobs, self.keys.meta(stream_id or "_")],
            args=[JOBS_GROUP, self.consumer, entry_id, "" if token is None else str(token), self.lease_ms],
        )
        return _text(reply) == "ok"

    async def ack(self, entry_id: str) -> None:
        """``XACK`` the job: its terminal event is stored (or it can never run)."""
        await self.redis.xack(self.keys.jobs, JOBS_GROUP, entry_id)

    async def is_cancelled(self, stream_id: str) -> bool:
        """Whether a client asked to cancel ``stream_id`` (the ``cancel`` flag is set)."""
        return bool(await self.redis.exists(self.keys.cancel(stream_id)))
