"""Ownership of a job: claim its stream (fencing token), renew, release and ack its pending entry.

A running job's lease is its pending entry's idle time in the ``workers`` consumer group:
the owner resets it with ``XCLAIM <jobs> workers <me> 0 <id> JUSTID`` every ``lease_s / 3``;
an entry idle for ``lease_s`` is taken over by another worker's ``XAUTOCLAIM``
(:mod:`worker.intake`). Every claim increments meta ``token`` (``HINCRBY``), which fences
the previous owner's appends out (:mod:`worker.appender`).

Jobs are named by their ref ``<jobs stream>/<entry id>`` (:meth:`schema.keys.Keys.job_ref`,
stored as meta ``job_id``), since the jobs are sharded over several streams.

Redis Cluster: a jobs stream and a stream's ``{<id>}`` keys live in different slots, so no
script touches both, and each script declares every key it touches in ``KEYS``:

* claim: :data:`CLAIM_LUA`, atomic, on the stream's slot (meta, tomb);
* renew: the meta check first, ``HGET <meta> token`` and ``EXISTS <cancel>`` (one
  pipeline on the stream's slot); a token that moved on answers ``fenced`` without
  touching the jobs stream; else :data:`TOUCH_LUA`, atomic, on the jobs stream alone:
  the ``XPENDING`` ownership check and ``XCLAIM ... JUSTID`` (idle reset to 0);
* release: the same ``HGET <meta> token`` check (only when the caller holds a token),
  then :data:`TOUCH_LUA` with ``IDLE <lease_ms>``;
* ack: :data:`ACK_LUA`, atomic, on the jobs stream alone: ``XACK`` and ``XDEL`` together,
  so the request body leaves Redis with its terminal event (retention).

Why the split is safe. The ownership check and the ``XCLAIM`` stay in one script: a
worker can never take back an entry another worker reclaimed (a bare ``XCLAIM`` with
min-idle 0 would). Only the meta check is no longer atomic with the ``XCLAIM``, so the
token may move between the two (a reclaim's claim, or a second job entry naming the same
stream), and that renewal answers ``ok`` or ``lost`` instead of ``fenced``; the next one,
``lease_s / 3`` later, answers ``fenced``. Meanwhile the stale owner cannot store
anything: every append presents its token to the append script, which compares it with
meta ``token`` atomically with the writes on the stream's own slot and refuses the batch
(:class:`~schema.errors.FencedError`). The renewal is only the early warning that stops
a stale owner's upstream request; fencing at the append is the guarantee, so no event is
ever stored by two owners. Likewise, a release racing a takeover at worst marks idle an
entry whose new owner renews it within ``lease_s / 3`` and whose token already fences
the releaser out.

Redis command pages followed: HINCRBY, HSETNX, HGET, EXISTS, XPENDING (extended form),
XCLAIM (``JUSTID``, ``IDLE``), XACK, XDEL, EVALSHA. Protocol: :mod:`schema.keys`.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec
from redis.commands.core import AsyncScript

from infra.redis_client import RedisClient
from schema.keys import JOBS_GROUP, Keys

CLAIM_LUA: Final = """
if redis.call('EXISTS', KEYS[2]) == 1 then return {'done', '0', '0', '0', ''} end
local m = redis.call('HMGET', KEYS[1], 'state', 'last_seq', 'started_ms', 'epoch', 'job_id')
if m[1] == 'done' then return {'done', m[2] or '0', '0', m[3] or '0', m[4] or ''} end
if m[1] == 'running' and m[5] and m[5] ~= ARGV[5] and ARGV[6] ~= 'force' then
  return {'duplicate', m[2] or '0', '0', m[3] or '0', m[4] or '', m[5]}
end
local token = redis.call('HINCRBY', KEYS[1], 'token', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'state', 'running', 'job_id', ARGV[5])
redis.call('HSETNX', KEYS[1], 'started_ms', ARGV[2])
redis.call('HSETNX', KEYS[1], 'last_seq', '0')
redis.call('HSETNX', KEYS[1], 'provider', ARGV[3])
redis.call('HSETNX', KEYS[1], 'model', ARGV[4])
return {'running', m[2] or '0', tostring(token), m[3] or ARGV[2], m[4] or ''}
"""
"""KEYS = meta, tomb (the stream's slot); ARGV = owner, now_ms, provider, model, job ref, ``force`` or ''.
Answers ``{state, last_seq, token, started_ms, epoch}`` (``epoch`` '' when meta has none), or
``{'duplicate', ..., <job ref>}`` without claiming when another job entry of the same stream
runs it (meta ``job_id``): the same job stored twice (a job ``XADD`` re-sent after its
reply was lost). ``force`` claims anyway: the caller found that other entry no longer
pending, so nobody runs the stream."""

TOUCH_LUA: Final = """
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then return 'lost' end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[4], 'JUSTID')
return 'ok'
"""
"""Reset a pending entry's idle time if this consumer owns it: ``ok``, or ``lost`` (another
consumer owns it, or it was acked). KEYS = jobs (its own slot); ARGV = group, consumer,
entry id, idle ms (0 to renew, ``lease_ms`` to release)."""

ACK_LUA: Final = """
local acked = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return acked
"""
"""Acknowledge AND delete a job entry, atomically: nothing of the request outlives its stream.
KEYS = the job's jobs stream (its own slot); ARGV = group, entry id. Returns 1 if it was pending."""

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
    """The stream's first claim time, ms since the Unix epoch."""
    epoch: str = ""
    """Meta ``epoch``: the generation whose events are stored ('' before ``stream.start``, or on
    a stream written before contract 1.1)."""
    duplicate_of: str = ""
    """Set, with nothing claimed, when another job entry (this ref) runs the stream."""


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

    def __init__(self, redis: RedisClient, keys: Keys, *, consumer: str, lease_s: float) -> None:
        self.redis, self.keys, self.consumer = redis, keys, consumer
        self.lease_ms = max(1, int(lease_s * 1000))
        self._claim: AsyncScript = redis.register_script(CLAIM_LUA)
        self._touch: AsyncScript = redis.register_script(TOUCH_LUA)
        self._ack: AsyncScript = redis.register_script(ACK_LUA)

    async def claim(self, *, stream_id: str, provider: str, model: str, entry_id: str, now_ms: int,
                    force: bool = False) -> Claim:
        """Become the stream's owner: increment meta ``token``, set ``owner``, ``state=running``.

        Creates the meta fields a publisher would have set (``provider``, ``model``,
        ``last_seq=0``) when missing. A finished stream is not claimed, nor (unless
        ``force``) one that another job entry runs (:attr:`Claim.duplicate_of`).
        """
        reply = await self._claim(
            keys=[self.keys.meta(stream_id), self.keys.tomb(stream_id)],
            args=[self.consumer, now_ms, provider, model, entry_id, "force" if force else ""],
        )
        state, last_seq, token, started, epoch, *other = (_text(v) for v in reply)
        return Claim(done=state == "done", last_seq=int(last_seq), token=int(token), started_ms=int(started),
                     epoch=epoch, duplicate_of=other[0] if state == "duplicate" else "")

    async def is_pending(self, ref: str) -> bool:
        """Return whether job entry ``ref`` is still pending in its consumer group (someone owns it).

        Follows the Redis page of XPENDING (extended form).
        """
        stream, bare_id = self.keys.parse_job_ref(ref)
        return bool(await self.redis.xpending_range(stream, JOBS_GROUP, min=bare_id, max=bare_id, count=1))

    async def renew(self, *, entry_id: str, stream_id: str, token: int) -> RenewOutcome:
        """Reset the job's idle time if this process still owns it; report the cancel flag.

        Two commands in two slots (module docstring): the meta check (``HGET token``,
        ``EXISTS cancel``), then :data:`TOUCH_LUA` on the jobs stream unless fenced.

        Returns:
            See :data:`RenewOutcome`. On ``fenced`` or ``lost`` the caller must abort the
            upstream request and stop writing (no terminal, no ack).
        """
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(self.keys.meta(stream_id), "token")
            pipe.exists(self.keys.cancel(stream_id))
            stored, cancelled = await pipe.execute()
        if stored is None or _text(stored) != str(token):
            return "fenced"
        if await self._touch_entry(entry_id, idle_ms=0) != "ok":
            return "lost"
        return "cancel" if cancelled else "ok"

    async def release(self, *, entry_id: str, stream_id: str = "", token: int | None = None) -> bool:
        """Hand a job back at shutdown: leave it pending but make it look ``lease_s`` idle.

        ``XCLAIM ... IDLE <lease_ms> JUSTID`` (:data:`TOUCH_LUA`), after checking meta
        ``token`` when ``token`` is given (a job this process claimed; ``None`` for an
        entry read but never started). The next ``XAUTOCLAIM`` of any worker takes it at
        once (and writes ``worker_lost`` or retries). Returns False when this process no
        longer owned it (token moved on, or the entry is another consumer's or acked).
        """
        if token is not None:
            stored = await self.redis.hget(self.keys.meta(stream_id), "token")
            if stored is None or _text(stored) != str(token):
                return False
        return await self._touch_entry(entry_id, idle_ms=self.lease_ms) == "ok"

    async def _touch_entry(self, entry_id: str, *, idle_ms: int) -> str:
        stream, bare_id = self.keys.parse_job_ref(entry_id)
        reply = await self._touch(keys=[stream], args=[JOBS_GROUP, self.consumer, bare_id, idle_ms])
        return _text(reply)

    async def ack(self, entry_id: str) -> None:
        """Acknowledge and delete the job entry (:data:`ACK_LUA`): its terminal event is stored, or it can never run.

        Args:
            entry_id: The job ref ``<jobs stream>/<entry id>`` (a bare entry id names the legacy stream).
        """
        stream, bare_id = self.keys.parse_job_ref(entry_id)
        await self._ack(keys=[stream], args=[JOBS_GROUP, bare_id])

    async def is_cancelled(self, stream_id: str) -> bool:
        """Whether a client asked to cancel ``stream_id`` (the ``cancel`` flag is set)."""
        return bool(await self.redis.exists(self.keys.cancel(stream_id)))
