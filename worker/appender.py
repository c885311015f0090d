"""Fenced, batched appends of contract events to a stream's Redis keys: one script call per batch.

The script (``EVALSHA`` of a script registered with redis-py's ``register_script``; Redis
6.2+, no Functions) runs atomically and, for a batch ``seq = f .. f+n-1``:

1. refuses unless meta ``token`` equals the caller's fencing token (:class:`FencedError`),
   meta ``state`` is not ``done`` (:class:`StreamClosedError`) and meta ``last_seq + 1 == f``
   (:class:`SeqConflictError`);
2. ``XADD <events> 0-<seq> e <json>`` for each event, in order (explicit ids, so a
   duplicate can never be stored);
3. ``HSET <meta> last_seq`` and, when the batch ends with a terminal event, ``state=done``,
   ``status``, ``ended_ms``; ``EXPIRE`` events and meta (``stream_ttl_s``); the tombstone
   hash ``{last_seq, status}`` with ``EXPIRE tombstone_ttl_s``;
4. ``PUBLISH <live> <payload>``: the batch's events themselves when they fit
   ``live_max_bytes``, else the seq-only ``<last_seq>`` (format: :mod:`publisher.live`).

Redis Cluster: the script touches only the stream's own keys, all hash-tagged
``{<stream_id>}`` and so in one slot, and every one of them is passed in ``KEYS``
(events, meta, tomb, and the live channel: not a key, but declared so the slot check
covers it and a move to sharded ``SPUBLISH``, which Redis Cluster slot-checks like a key,
needs no change). No key name is built inside the Lua.

The analytics summary of a finished stream goes to ``P:done``, which lives in another
slot, so it is NOT written by the script: after the script stored a terminal event,
:meth:`StreamWriter.append` sends one plain ``XADD <done> MAXLEN ~ <done_maxlen> *`` with
the summary (:func:`summary_fields`). A crash (or a Redis error) between the two loses
only that summary line, never an event: the events, meta, tombstone and TTLs are
already stored by the script, and a reclaiming worker finds the stream done and only
acks it. A failed summary ``XADD`` is logged (``event=summary_lost``) and not raised,
because the terminal event is stored and the job must be acked.

Layout and protocol: :mod:`schema.keys`. Redis command pages followed: EVALSHA, XADD, HSET,
EXPIRE, PUBLISH. The refusals (:class:`AppendRefusedError` and its subclasses) are defined
in :mod:`schema.errors` and re-exported here.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import redis.asyncio as aioredis
import redis.exceptions
from redis.commands.core import AsyncScript

from schema.contract import BlockDelta, Event, StreamDone, StreamError, encode_event, is_terminal
from schema.errors import AppendRefusedError, FencedError, InternalError, SeqConflictError, StreamClosedError
from schema.keys import Keys

__all__ = [
    "APPEND_LUA",
    "AppendRefusedError",
    "Appender",
    "FencedError",
    "SeqConflictError",
    "StreamClosedError",
    "StreamWriter",
    "summary_fields",
]

log = logging.getLogger("fanout.worker.appender")

LIVE_MAX_BYTES: Final = 64 * 1024
"""Default ``FANOUT_LIVE_MAX_BYTES``: batches up to this size carry their events on the
live channel, so publishers serve them without a read."""

APPEND_LUA: Final = """
local meta = redis.call('HMGET', KEYS[2], 'token', 'last_seq', 'state')
if meta[1] ~= ARGV[1] then return {'fenced', meta[1] or ''} end
if meta[3] == 'done' then return {'closed', meta[2] or '0'} end
local last = tonumber(meta[2] or '0')
local first = tonumber(ARGV[2])
if last + 1 ~= first then return {'seq', tostring(last)} end
local n = tonumber(ARGV[8])
local size = 0
for i = 1, n do
  redis.call('XADD', KEYS[1], '0-' .. (first + i - 1), 'e', ARGV[8 + i])
  size = size + #ARGV[8 + i] + 1
end
local new_last = first + n - 1
local status = ARGV[3]
if status == '' then
  redis.call('HSET', KEYS[2], 'last_seq', new_last)
else
  redis.call('HSET', KEYS[2], 'last_seq', new_last, 'state', 'done', 'status', status, 'ended_ms', ARGV[4])
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  redis.call('EXPIRE', KEYS[2], ARGV[5])
  redis.call('HSET', KEYS[3], 'last_seq', new_last, 'status', status)
  redis.call('EXPIRE', KEYS[3], ARGV[6])
end
local live_max = tonumber(ARGV[7])
if live_max > 0 and size <= live_max then
  redis.call('PUBLISH', KEYS[4], new_last .. ' ' .. first .. '\\n' .. table.concat(ARGV, '\\n', 9, 8 + n))
else
  redis.call('PUBLISH', KEYS[4], new_last)
end
return {'ok', tostring(new_last)}
"""
"""The append script. KEYS = events, meta, tomb, live (one slot: the stream's hash tag);
ARGV = token, first seq, terminal status ('' if none), ended_ms, stream_ttl_s,
tombstone_ttl_s, live_max_bytes, n, then the n event JSONs. The notification is
``<last> <first>\n<json>\n...`` when the JSONs and their separators fit
``live_max_bytes`` (``FANOUT_LIVE_MAX_BYTES``; 0 disables), else ``<last>``
(:mod:`publisher.live`)."""


def summary_fields(
    terminal: StreamDone | StreamError,
    *,
    provider: str,
    model: str,
    started_ms: int,
    first_delta_ms: int | None,
) -> list[str]:
    """Return the flat field/value list XADDed to ``P:done`` for a finished stream.

    Fields: ``stream_id provider model status finish_reason error_category input_tokens
    output_tokens cached_input_tokens reasoning_tokens events ttfd_ms duration_ms
    ended_ms``; unknown values are empty strings. ``events`` is the terminal's seq;
    ``ttfd_ms`` (first ``block.delta``) and ``duration_ms`` (terminal) are measured from
    ``started_ms``, the stream's first claim.
    """
    usage = terminal.usage
    fields: dict[str, object] = {
        "stream_id": terminal.stream_id, "provider": provider, "model": model,
        "status": terminal.status, "finish_reason": terminal.finish_reason,
        "error_category": terminal.error.category if isinstance(terminal, StreamError) else None,
        "input_tokens": usage.input_tokens if usage else None,
        "output_tokens": usage.output_tokens if usage else None,
        "cached_input_tokens": usage.cached_input_tokens if usage else None,
        "reasoning_tokens": usage.reasoning_tokens if usage else None,
        "events": terminal.seq,
        "ttfd_ms": first_delta_ms - started_ms if first_delta_ms is not None and started_ms else None,
        "duration_ms": terminal.ts - started_ms if started_ms else None,
        "ended_ms": terminal.ts,
    }
    return [part for name, value in fields.items() for part in (name, "" if value is None else str(value))]


class Appender:
    """The process's append script and limits; makes one :class:`StreamWriter` per claimed stream.

    Args:
        redis: asyncio client (``decode_responses`` off).
        keys: Key layout of the deployment (tests pass a unique prefix).
        stream_ttl_s: TTL of a finished stream's events and meta.
        tombstone_ttl_s: TTL of its tombstone.
        done_maxlen: Approximate cap of the summaries stream.
        live_max_bytes: Largest batch (event JSON bytes plus one per event) whose events
            ride on the live notification; a larger batch publishes only its last seq.
    """

    def __init__(
        self, redis: aioredis.Redis, keys: Keys, *, stream_ttl_s: int = 86_400,
        tombstone_ttl_s: int = 7 * 86_400, done_maxlen: int = 100_000,
        live_max_bytes: int = LIVE_MAX_BYTES,
    ) -> None:
        self.redis, self.keys = redis, keys
        self.ttls = (str(stream_ttl_s), str(tombstone_ttl_s), str(live_max_bytes))
        """``stream_ttl_s``, ``tombstone_ttl_s`` and ``live_max_bytes`` as script arguments."""
        self.done_maxlen = done_maxlen
        self.script: AsyncScript = redis.register_script(APPEND_LUA)

    async def write_summary(self, stream_id: str, fields: list[str]) -> bool:
        """``XADD <done> MAXLEN ~ <done_maxlen> *`` one finished-stream summary (its own slot).

        Called right after the script stored the stream's terminal event. Returns False,
        after logging ``event=summary_lost``, when Redis failed: only the analytics line is
        lost, every event is already stored.
        """
        try:
            await self.redis.xadd(self.keys.done, dict(zip(fields[::2], fields[1::2], strict=True)),
                                  maxlen=self.done_maxlen, approximate=True)
        except redis.exceptions.RedisError as exc:
            log.warning("event=summary_lost stream_id=%s error=%s", stream_id, type(exc).__name__)
            return False
        return True

    def writer(
        self, stream_id: str, *, token: int, last_seq: int, provider: str = "", model: str = "",
        started_ms: int = 0,
    ) -> StreamWriter:
        """Return the writer of ``stream_id`` for the holder of fencing ``token``.

        Args:
            stream_id: The stream.
            token: The fencing token this worker got when it claimed the stream.
            last_seq: Meta ``last_seq`` read at the claim.
            provider: Provider API, for the finished-stream summary.
            model: Requested model, for the summary.
            started_ms: The stream's first claim time (meta ``started_ms``), for the summary.
        """
        return StreamWriter(self, stream_id, token=token, last_seq=last_seq, provider=provider,
                            model=model, started_ms=started_ms)


class StreamWriter:
    """Appends one stream's batches in seq order; created by :meth:`Appender.writer`."""

    def __init__(
        self, appender: Appender, stream_id: str, *, token: int, last_seq: int, provider: str,
        model: str, started_ms: int,
    ) -> None:
        self._appender = appender
        self.stream_id, self.token, self.last_seq = stream_id, token, last_seq
        self.provider, self.model, self.started_ms = provider, model, started_ms
        self.first_delta_ms: int | None = None
        """``ts`` of the first ``block.delta`` this writer stored."""
        self.terminal: StreamDone | StreamError | None = None
        """The terminal event once this writer stored it."""

    def _argv(self, events: list[Event]) -> list[Any]:
        terminal = events[-1] if is_terminal(events[-1]) else None
        if any(is_terminal(e) for e in events[:-1]):
            raise InternalError("a terminal event must be the last of its batch")
        head = [str(self.token), str(events[0].seq)]
        if isinstance(terminal, StreamDone | StreamError):
            head += [terminal.status, str(terminal.ts)]
        else:
            head += ["", ""]
        return [*head, *self._appender.ttls, str(len(events)), *(encode_event(e) for e in events)]

    async def append(self, events: list[Event]) -> int:
        """Store ``events`` (one batch, seq order, consecutive) with one script call.

        When the batch ends the stream, the finished-stream summary follows as a separate
        ``XADD`` to ``P:done`` (:meth:`Appender.write_summary`); its failure is logged, not
        raised.

        Args:
            events: Possibly empty (then nothing is sent); seqs must continue
                :attr:`last_seq`; only the last may be terminal.

        Returns:
            The stream's last stored seq afterwards.

        Raises:
            FencedError: The meta token is no longer ours. Abort the upstream request,
                leave the job pending for its new owner.
            StreamClosedError: The stream already ended. Stop; ack the job.
            SeqConflictError: Redis holds another ``last_seq``. Stop writing this stream.
            InternalError: A terminal event not last in the batch.
            redis.exceptions.RedisError: Redis unreachable during the script call; the batch
                may or may not be stored.
        """
        if not events:
            return self.last_seq
        keys, sid = self._appender.keys, self.stream_id
        reply = await self._appender.script(
            keys=[keys.events(sid), keys.meta(sid), keys.tomb(sid), keys.live(sid)],
            args=self._argv(events),
        )
        code, detail = (part.decode() if isinstance(part, bytes) else str(part) for part in reply)
        if code != "ok":
            raise _refusal(code, detail, self.stream_id)
        self.last_seq = int(detail)
        if self.first_delta_ms is None:
            self.first_delta_ms = _first_delta_ts(events)
        last = events[-1]
        if isinstance(last, StreamDone | StreamError):
            self.terminal = last
            await self._appender.write_summary(sid, summary_fields(
                last, provider=self.provider, model=self.model, started_ms=self.started_ms,
                first_delta_ms=self.first_delta_ms))
        return self.last_seq


def _first_delta_ts(events: list[Event]) -> int | None:
    return next((e.ts for e in events if isinstance(e, BlockDelta)), None)


def _refusal(code: str, detail: str, stream_id: str) -> AppendRefusedError:
    if code == "fenced":
        return FencedError(f"stream {stream_id} is owned by another worker (token {detail or 'none'})")
    if code == "closed":
        return StreamClosedError(f"stream {stream_id} already ended at seq {detail}")
    return SeqConflictError(f"stream {stream_id} holds last_seq {detail}", stored_seq=int(detail))
