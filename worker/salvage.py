"""Ending a stream whose appends Redis refuses for good: store the terminal if possible, else mark it.

Called after :class:`~schema.errors.StorageRefusedError` (:mod:`infra.storage`). Two
steps, each one script on the stream's slot (KEYS events, meta, tomb, live, like the
append), each fenced by the caller's token:

1. :data:`TERMINAL_LUA`: the append script with the ``allow-oom`` flag (Redis 7 script
   flags, ``#!lua flags=allow-oom``), used only for the one terminal batch (one
   ``stream.error``, after a ``stream.start`` when none is stored). Out of memory no longer
   blocks it, so a stream that hit ``maxmemory`` still ends with a real terminal event: a
   few hundred bytes past the limit, once per stream. Redis 6.2 cannot parse script
   flags; there the same script runs without its flags line (everything but the
   ``maxmemory`` exemption, ``jump`` included).
   After a failover lost this writer's last events (the append answered ``seq`` with a
   ``last_seq`` below the writer's), the terminal is stored right after the writer's own
   last seq (``jump``): a reader that got the lost events live resumes exactly after them
   and receives the terminal; any other reader hits the hole and gets ``stream.gap`` / 410.
2. When that is refused too (a foreign entry above ours: no ``0-<seq>`` can ever be added
   again; ``WRONGTYPE`` on the events key), :data:`MARK_LUA` ends the stream without an
   event: meta ``state=done``, ``status``, ``ended_ms``, ``error_category``,
   ``error_message``, the TTLs, and the tombstone ``{last_seq, status}``, then ``PUBLISH``
   (``SPUBLISH`` in sharded live mode, as the append) the unchanged ``last_seq``. Readers
   then see what an ended stream shows: the status route reports ``done`` with that
   status, and an SSE request at or past the last
   stored event gets 204 (``publisher.api.events``), so no reader waits forever.

The caller acks the job after either step, and also when neither could store anything
(meta itself unusable): a job that can never be stored must not loop through reclaims.

Redis pages followed: EVAL (script flags), XADD, HSET, EXPIRE, PUBLISH, SPUBLISH.
"""

from __future__ import annotations

from typing import Any, Final

import redis.exceptions
from redis.commands.core import AsyncScript

from infra.redis_client import RedisClient
from schema.keys import Keys

TERMINAL_LUA: Final = """#!lua flags=allow-oom
local n = tonumber(ARGV[8])
local meta = redis.call('HMGET', KEYS[2], 'token', 'last_seq', 'state', 'batch', 'epoch')
if meta[1] ~= ARGV[1] then return {'fenced', meta[1] or ''} end
if meta[4] == ARGV[9 + n] then return {'landed', meta[2] or '0'} end
if meta[3] == 'done' then return {'closed', meta[2] or '0'} end
local epoch = ARGV[11 + n]
local last = tonumber(meta[2] or '0')
local first = tonumber(ARGV[2])
if first > 1 and (meta[5] or '') ~= epoch then return {'reset', meta[5] or ''} end
local jump = ARGV[12 + n] == 'jump' and first > last + 1
if last + 1 ~= first and not jump then return {'seq', tostring(last)} end
if jump then redis.call('HSET', KEYS[2], 'lost_from', last + 1, 'lost_to', first - 1) end
for i = 1, n do
  redis.call('XADD', KEYS[1], '0-' .. (first + i - 1), 'c', ARGV[8 + i])
end
local new_last = first + n - 1
redis.call('HSET', KEYS[2], 'last_seq', new_last, 'batch', ARGV[9 + n], 'state', 'done', 'status', ARGV[3],
  'ended_ms', ARGV[4])
if first == 1 and epoch ~= '' then redis.call('HSET', KEYS[2], 'epoch', epoch) end
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('HSET', KEYS[3], 'last_seq', new_last, 'status', ARGV[3])
if epoch ~= '' then redis.call('HSET', KEYS[3], 'epoch', epoch) end
redis.call('EXPIRE', KEYS[3], ARGV[6])
local note = new_last
if epoch ~= '' then note = new_last .. ' ' .. first .. ' ' .. epoch end
if ARGV[10 + n] == 'sharded' then
  redis.call('SPUBLISH', KEYS[4], note)
else
  redis.call('PUBLISH', KEYS[4], note)
end
return {'ok', tostring(new_last)}
"""
"""The terminal-only append, allowed past ``maxmemory``. KEYS and ARGV as
:data:`worker.append_script.APPEND_LUA` (the status is never empty here; ARGV[10 + n] is the
live mode, ARGV[11 + n] the writer's epoch, checked the same way), plus ARGV[12 + n]:
``jump`` lets the batch start past ``last_seq + 1`` (never below it) when the writer knows
that Redis lost its events in between (a failover that kept the generation: meta still
holds the writer's epoch); meta then records ``lost_from`` and ``lost_to``, and readers
get a ``stream.gap`` or a 410 for that range, never a silent hole. Its notification is
seq-only."""

TERMINAL_UNFLAGGED_LUA: Final = TERMINAL_LUA.split("\n", 1)[1]
""":data:`TERMINAL_LUA` without its flags line, for Redis 6.2 (which cannot parse script
flags): the same terminal append, ``jump`` included, minus the ``maxmemory`` exemption."""

MARK_LUA: Final = """
local meta = redis.call('HMGET', KEYS[2], 'token', 'last_seq', 'state', 'epoch')
if meta[1] ~= ARGV[1] then return {'fenced', meta[1] or ''} end
if meta[3] == 'done' then return {'closed', meta[2] or '0'} end
local last = meta[2] or '0'
if (meta[4] or '') ~= ARGV[9] and not (last == '0' and ARGV[10] == '0') then return {'reset', meta[4] or ''} end
redis.call('HSET', KEYS[2], 'state', 'done', 'status', ARGV[2], 'ended_ms', ARGV[3],
  'error_category', ARGV[4], 'error_message', ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('EXPIRE', KEYS[2], ARGV[6])
redis.call('HSET', KEYS[3], 'last_seq', last, 'status', ARGV[2])
if meta[4] then redis.call('HSET', KEYS[3], 'epoch', meta[4]) end
redis.call('EXPIRE', KEYS[3], ARGV[7])
if ARGV[8] == 'sharded' then
  redis.call('SPUBLISH', KEYS[4], last)
else
  redis.call('PUBLISH', KEYS[4], last)
end
return {'ok', last}
"""
"""End a stream without an event. KEYS = events, meta, tomb, live; ARGV = token, status,
ended_ms, error category, error message, stream_ttl_s, tombstone_ttl_s, live mode
(``sharded``: ``SPUBLISH``, else ``PUBLISH``), the writer's epoch and last seq. Refused
with ``reset`` when meta holds another generation than the writer's (unless neither
stored anything yet)."""


def _text(part: Any) -> str:
    return part.decode() if isinstance(part, bytes) else str(part)


class Salvage:
    """The two last-resort scripts of one process.

    Args:
        redis: asyncio client.
        keys: Key layout.
        ttls: ``(stream_ttl_s, tombstone_ttl_s)`` as script arguments.
    """

    def __init__(self, redis: RedisClient, keys: Keys, ttls: tuple[str, str]) -> None:
        self.keys, self.ttls = keys, ttls
        self._terminal: AsyncScript = redis.register_script(TERMINAL_LUA)
        self._terminal_unflagged: AsyncScript = redis.register_script(TERMINAL_UNFLAGGED_LUA)
        self._mark: AsyncScript = redis.register_script(MARK_LUA)
        self.flags_supported = True
        """False once Redis (6.2) refused to compile a flagged script."""

    def _keys(self, stream_id: str) -> list[str]:
        k = self.keys
        return [k.events(stream_id), k.meta(stream_id), k.tomb(stream_id), k.live(stream_id)]

    async def terminal(self, stream_id: str, argv: list[Any]) -> tuple[str, str]:
        """Run :data:`TERMINAL_LUA` (without its flags line on Redis 6.2); return (code, detail).

        Raises:
            redis.exceptions.RedisError: As the append script would.
        """
        if self.flags_supported:
            try:
                reply = await self._terminal(keys=self._keys(stream_id), args=argv)
            except redis.exceptions.ResponseError as exc:
                if "compiling" not in str(exc) and "shebang" not in str(exc):
                    raise
                self.flags_supported = False
            else:
                return _text(reply[0]), _text(reply[1])
        reply = await self._terminal_unflagged(keys=self._keys(stream_id), args=argv)
        return _text(reply[0]), _text(reply[1])

    async def mark(self, stream_id: str, *, token: int, status: str, ended_ms: int, category: str,
                   message: str, mode: str = "classic", epoch: str = "", last_seq: int = 0) -> tuple[str, str]:
        """Run :data:`MARK_LUA`; return (``ok``/``fenced``/``closed``/``reset``, last_seq, token or epoch).

        ``mode``: the live mode (:func:`infra.live_pubsub.live_mode`) of its notification;
        ``epoch`` and ``last_seq``: the writer's generation and last stored seq.

        Raises:
            redis.exceptions.RedisError: Redis failed or refused (e.g. meta holds another type).
        """
        argv = [str(token), status, str(ended_ms), category, message, *self.ttls, mode, epoch, str(last_seq)]
        reply = await self._mark(keys=self._keys(stream_id), args=argv)
        return _text(reply[0]), _text(reply[1])
