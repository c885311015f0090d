"""The append script: the one server-side step that stores a batch of a stream's events.

Kept apart from :mod:`worker.appender` (which runs it) so the protocol can be read in one
place. Layout and protocol: :mod:`schema.keys`; the notification's format:
:mod:`publisher.live.notification`. Redis command pages followed: EVALSHA, XADD, HSET, EXPIRE,
PUBLISH, SPUBLISH. Pure: a string and its documentation, no imports of redis or asyncio.

Generations (contract 1.1). A batch that starts at seq 1 opens a generation: the script
stores the writer's ``epoch`` in meta (and later in the tombstone). A batch after seq 1
is refused with ``reset`` unless meta holds the writer's epoch: a Redis restored from an
older snapshot (or a failover to a replica that lost the stream) no longer holds the
generation this writer was extending, and its seq numbers may be reused by a new one, so
the fencing token (which such a restore also resets) cannot be trusted alone. An empty
epoch is a writer of a stream started before 1.1: it matches a meta without one.
"""

from __future__ import annotations

from typing import Final

APPEND_LUA: Final = """
local n = tonumber(ARGV[8])
local meta = redis.call('HMGET', KEYS[2], 'token', 'last_seq', 'state', 'batch', 'epoch')
if meta[1] ~= ARGV[1] then return {'fenced', meta[1] or ''} end
if meta[4] == ARGV[9 + n] then return {'landed', meta[2] or '0'} end
if meta[3] == 'done' then return {'closed', meta[2] or '0'} end
local epoch = ARGV[11 + n]
local first = tonumber(ARGV[2])
if first > 1 and (meta[5] or '') ~= epoch then return {'reset', meta[5] or ''} end
local last = tonumber(meta[2] or '0')
if last + 1 ~= first then return {'seq', tostring(last)} end
local size = 0
for i = 1, n do
  redis.call('XADD', KEYS[1], '0-' .. (first + i - 1), 'c', ARGV[8 + i])
  size = size + #ARGV[8 + i] + 1
end
local new_last = first + n - 1
local status = ARGV[3]
redis.call('HSET', KEYS[2], 'last_seq', new_last, 'batch', ARGV[9 + n])
if first == 1 and epoch ~= '' then redis.call('HSET', KEYS[2], 'epoch', epoch) end
if ARGV[12 + n] and ARGV[12 + n] ~= '' then
  redis.call('HSET', KEYS[2], 'bg_id', ARGV[12 + n], 'bg_cursor', ARGV[13 + n], 'bg_endpoint', ARGV[14 + n])
end
if status ~= '' then
  redis.call('HSET', KEYS[2], 'state', 'done', 'status', status, 'ended_ms', ARGV[4])
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  redis.call('EXPIRE', KEYS[2], ARGV[5])
  redis.call('HSET', KEYS[3], 'last_seq', new_last, 'status', status)
  if epoch ~= '' then redis.call('HSET', KEYS[3], 'epoch', epoch) end
  redis.call('EXPIRE', KEYS[3], ARGV[6])
end
local head = new_last .. ' ' .. first
if epoch ~= '' then head = head .. ' ' .. epoch end
local note = new_last
if epoch ~= '' then note = head end
if n == 0 then return {'ok', tostring(new_last)} end
local live_max = tonumber(ARGV[7])
if live_max > 0 and size <= live_max then
  local body = {}
  for i = 1, n do body[i] = #ARGV[8 + i] .. ':' .. ARGV[8 + i] end
  note = new_last .. ' ' .. first .. ' ' .. epoch .. ' c\\n' .. table.concat(body)
end
if ARGV[10 + n] == 'sharded' then
  redis.call('SPUBLISH', KEYS[4], note)
else
  redis.call('PUBLISH', KEYS[4], note)
end
return {'ok', tostring(new_last)}
"""
"""The append script. KEYS = events, meta, tomb, live (one slot: the stream's hash tag);
ARGV = token, first seq, terminal status ('' if none), ended_ms, stream_ttl_s,
tombstone_ttl_s, live_max_bytes, n, then the n events in their compact stored form
(:mod:`schema.stored`, stored as field ``c``), then the batch id (random,
one per batch, kept in meta ``batch``: a retried call finds its own batch stored and
answers ``landed``), then the live mode (``sharded``: ``SPUBLISH``, else ``PUBLISH``;
:func:`infra.live_pubsub.live_mode`), then the writer's epoch ('' for a stream started
before contract 1.1), then optionally (a background attempt, :mod:`worker.background`) the
provider's response id, the last provider ``sequence_number`` normalized and the endpoint's
name, stored in meta ``bg_id``, ``bg_cursor`` and ``bg_endpoint`` with the batch. A batch of
no event (``n`` = 0, first seq = ``last_seq + 1``) stores only those fields, fenced and checked
like any batch, and publishes nothing.

Answers ``{code, detail}``: ``ok``/``landed`` with the new last seq; ``fenced`` (another
token), ``closed`` (already ended), ``reset`` (meta holds another epoch, or none: the
generation this writer extends is gone) and ``seq`` (meta ``last_seq`` is not the batch's
first seq - 1) with what meta holds.

The notification is ``<last> <first> <epoch> c\\n<len>:<value>...`` (each stored value
prefixed by its length in bytes; the epoch may be empty) when the values and one byte
each fit ``live_max_bytes`` (``FANOUT_LIVE_MAX_BYTES``; 0 disables), else the seq-only
``<last> <first> <epoch>``, or ``<last>`` without an epoch
(:mod:`publisher.live.notification`)."""
