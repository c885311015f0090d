"""Lossless compaction of finished streams, after a grace period: who does it, and the one script that does it.

Who: the worker that stores a stream's terminal event schedules it (:meth:`Compactor.schedule`:
``ZADD P:compact NX <now + FANOUT_COMPACT_GRACE_S> <stream id>``, a plain command in its own
slot, like the summary; a worker whose claim finds a stream already done schedules it too,
in case its writer died before), and every worker sweeps the due ones in its loop
(:meth:`Compactor.sweep`, every ``FANOUT_COMPACT_SWEEP_S``). A worker that dies during the
grace period leaves its entry in ``P:compact``; any other worker's sweep takes it. Two
sweeps may take the same stream at once: the script lets only the first rewrite it (meta
``compacted``); the other answers ``already``. A crash between the terminal and the
``ZADD`` (and before the job's ack, which follows it) leaves the job pending: the worker
that reclaims it finds the stream done and schedules the compaction. Only a failed ``ZADD``
loses the compaction of that stream (logged; it keeps its live form until its TTL).

How: :func:`worker.compaction_plan.plan` turns the entries read (``XRANGE``, after meta says
``done``) into the compacted ones, proven to give back every event's JSON exactly; then
:data:`COMPACT_LUA` replaces them in one step. The script is fenced by what it checks, not
by an owner's token: meta ``state=done``, ``last_seq`` and ``epoch`` as read with the
entries, no ``compacted`` mark, the events key's length and top id unchanged. A finished
stream never changes, so these prove the entries are the ones planned from; a new generation
(a Redis restored from an older snapshot that ran the job again) changes the epoch or
the state, and the script answers ``changed``. It deletes the key and adds the new entries
``0-<seq>`` (field ``c``), then rewrites the key once more through ``DUMP``/``RESTORE`` with
its TTL (``PTTL``): Redis preallocates each new stream node at ``stream-node-max-bytes``
and a restore allocates every node at its exact size (about 4 KB less per stream). It
marks meta ``compacted``, all inside one script: Redis runs it atomically, replicates and persists
it as one unit (effects replication wraps it in ``MULTI``/``EXEC``), so a reader, a
failover or a restart sees the stream before or after, never half of it. Its first write
is ``DEL`` (not refused under ``maxmemory``), after which Redis lets the script finish.

Readers need nothing new: a run's entry id is its last seq, so ``XRANGE (0-<n> +`` from any
position returns the run that holds ``n + 1`` first, and the publisher drops what is at or
before ``n`` (:mod:`publisher.history.pages`). A stream that cannot be compacted is left as it
is and logged once (``event=compaction_refused``), then dropped from ``P:compact``.

Redis pages followed: ZADD, ZRANGEBYSCORE, ZREM, XRANGE, XLEN, XREVRANGE, DEL, XADD, PTTL,
PEXPIRE, HSET, EVALSHA. Must not import :mod:`publisher` or :mod:`tools`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

from redis.commands.core import AsyncScript

from infra.redis_client import REDIS_ERRORS, RedisClient
from infra.redis_faults import redis_error_fields
from schema.keys import Keys
from worker.compaction_plan import PlanRefusedError, plan

log = logging.getLogger("fanout.worker.compactor")

COMPACT_LUA: Final = """
local meta = redis.call('HMGET', KEYS[2], 'state', 'last_seq', 'epoch', 'compacted')
if meta[4] then return {'already', meta[2] or ''} end
if meta[1] ~= 'done' or meta[2] ~= ARGV[1] or (meta[3] or '') ~= ARGV[2] then return {'changed', meta[2] or ''} end
if redis.call('XLEN', KEYS[1]) ~= tonumber(ARGV[3]) then return {'changed', meta[2]} end
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if not top[1] or top[1][1] ~= '0-' .. ARGV[1] then return {'changed', meta[2]} end
local ttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
local k = tonumber(ARGV[4])
for i = 1, k do
  redis.call('XADD', KEYS[1], '0-' .. ARGV[3 + 2 * i], 'c', ARGV[4 + 2 * i])
end
local dump = redis.call('DUMP', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('RESTORE', KEYS[1], math.max(ttl, 0), dump)
redis.call('HSET', KEYS[2], 'compacted', k)
return {'ok', tostring(k)}
"""
"""Replace a finished stream's entries by their compacted form. KEYS = events, meta (one slot);
ARGV = last seq, epoch ('' for none), the entry count read, k, then k pairs (seq, compact
value). Answers ``ok`` (k entries written), ``already`` (meta ``compacted`` is set) or
``changed`` (the stream is not the one planned from: not done, another last seq or epoch,
another length or top)."""


def _text(part: Any) -> str:
    return part.decode() if isinstance(part, bytes) else str(part)


def _as_map(fields: dict[bytes, bytes] | list[bytes]) -> dict[bytes, bytes]:
    """Return an entry's fields as a map (a client whose XRANGE answers flat lists, as the publisher's does)."""
    return fields if isinstance(fields, dict) else dict(zip(fields[::2], fields[1::2], strict=False))


class Compactor:
    """Schedules and performs compactions for one worker process.

    Args:
        redis: asyncio client (``decode_responses`` off).
        keys: Key layout.
        grace_s: ``FANOUT_COMPACT_GRACE_S``: how long after its terminal event a stream is
            compacted; a negative value turns compaction off.
        run_deltas: ``FANOUT_COMPACT_RUN_DELTAS``: most deltas per compacted entry.
        sweep_batch: Most due streams one :meth:`sweep` takes.
    """

    def __init__(self, redis: RedisClient, keys: Keys, *, grace_s: float = 10.0, run_deltas: int = 512,
                 sweep_batch: int = 32) -> None:
        self.redis, self.keys = redis, keys
        self.grace_s, self.run_deltas, self.sweep_batch = grace_s, run_deltas, sweep_batch
        self.script: AsyncScript = redis.register_script(COMPACT_LUA)

    async def schedule(self, stream_id: str, now_ms: int | None = None) -> None:
        """``ZADD P:compact NX <now + grace> <stream id>`` (an earlier due time stays); a Redis error is logged."""
        if self.grace_s < 0:
            return
        due = (now_ms if now_ms is not None else int(time.time() * 1000)) + int(self.grace_s * 1000)
        try:
            await self.redis.zadd(self.keys.compact_due, {stream_id: due}, nx=True)
        except REDIS_ERRORS as exc:
            log.warning("event=compaction_unscheduled stream_id=%s %s", stream_id, redis_error_fields(exc))

    async def sweep(self, now_ms: int | None = None) -> int:
        """Compact the streams whose grace ended; return how many were taken off ``P:compact``.

        Raises:
            redis.exceptions.RedisError: Redis failed reading ``P:compact`` (the next sweep tries again).
        """
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        due = await self.redis.zrangebyscore(self.keys.compact_due, "-inf", now, start=0, num=self.sweep_batch)
        done = 0
        for member in due:
            stream_id = _text(member)
            try:
                await self.compact(stream_id)
            except REDIS_ERRORS as exc:  # stays scheduled: the next sweep tries again
                log.warning("event=compaction_failed stream_id=%s %s", stream_id, redis_error_fields(exc))
                continue
            await self.redis.zrem(self.keys.compact_due, stream_id)
            done += 1
        return done

    async def compact(self, stream_id: str) -> str:
        """Compact one finished stream now.

        Returns:
            ``ok``, ``already`` (compacted before), ``changed`` (not done, or changed while
            planned: left alone), ``gone`` (expired) or ``refused`` (cannot be compacted
            losslessly: left alone, logged once with the reason).

        Raises:
            redis.exceptions.RedisError: Redis failed; nothing or everything was rewritten.
        """
        meta = await self.redis.hmget(self.keys.meta(stream_id), ["state", "last_seq", "epoch", "compacted"])
        state, last_seq, epoch, compacted = (_text(v) if v is not None else None for v in meta)
        if compacted is not None:
            return "already"
        if state != "done" or not last_seq:
            return "changed" if state else "gone"
        raw: Any = await self.redis.xrange(self.keys.events(stream_id))
        if not raw:
            return "gone"
        entries = [(entry_id, _as_map(fields)) for entry_id, fields in raw]
        try:
            planned = plan(stream_id, entries, run_deltas=self.run_deltas)
        except PlanRefusedError as exc:
            log.error("event=compaction_refused stream_id=%s reason=%s", stream_id, exc)
            return "refused"
        args: list[Any] = [last_seq, epoch or "", len(raw), len(planned.entries)]
        for seq, value in planned.entries:
            args += [seq, value]
        reply = await self.script(keys=[self.keys.events(stream_id), self.keys.meta(stream_id)], args=args)
        code = _text(reply[0])
        log.info("event=compaction stream_id=%s outcome=%s events=%d entries=%d", stream_id, code, planned.events,
                 len(planned.entries))
        return code
