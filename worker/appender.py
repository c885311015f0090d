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
   hash ``{last_seq, status}`` with ``EXPIRE tombstone_ttl_s``; ``XADD <done> MAXLEN ~ N *``
   with the finished stream's summary;
4. ``PUBLISH <live> <last_seq>``.

Layout and protocol: :mod:`schema.keys`. Redis command pages followed: EVALSHA, XADD, HSET,
EXPIRE, PUBLISH. Note for Redis Cluster: ``<done>`` is not hash-tagged with the stream, so
this script is single-node/Sentinel only (ARCHITECTURE.md's per-stream hash tags keep every
other key in one slot).
"""

from __future__ import annotations

from typing import Any, Final

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from schema.contract import BlockDelta, Event, StreamDone, StreamError, encode_event, is_terminal
from schema.errors import InternalError
from schema.keys import Keys

APPEND_LUA: Final = """
local meta = redis.call('HMGET', KEYS[2], 'token', 'last_seq', 'state')
if meta[1] ~= ARGV[1] then return {'fenced', meta[1] or ''} end
if meta[3] == 'done' then return {'closed', meta[2] or '0'} end
local last = tonumber(meta[2] or '0')
local first = tonumber(ARGV[2])
if last + 1 ~= first then return {'seq', tostring(last)} end
local n = tonumber(ARGV[9])
for i = 1, n do
  redis.call('XADD', KEYS[1], '0-' .. (first + i - 1), 'e', ARGV[9 + i])
end
local new_last = first + n - 1
local status = ARGV[4]
if status == '' then
  redis.call('HSET', KEYS[2], 'last_seq', new_last)
else
  redis.call('HSET', KEYS[2], 'last_seq', new_last, 'state', 'done', 'status', status, 'ended_ms', ARGV[5])
  redis.call('EXPIRE', KEYS[1], ARGV[6])
  redis.call('EXPIRE', KEYS[2], ARGV[6])
  redis.call('HSET', KEYS[3], 'last_seq', new_last, 'status', status)
  redis.call('EXPIRE', KEYS[3], ARGV[7])
  local summary = {}
  for i = 10 + n, #ARGV do summary[#summary + 1] = ARGV[i] end
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[8], '*', unpack(summary))
end
redis.call('PUBLISH', ARGV[3], new_last)
return {'ok', tostring(new_last)}
"""
"""The append script; KEYS = events, meta, tomb, done; ARGV as built by :meth:`StreamWriter.append`."""


class AppendRefusedError(InternalError):
    """The append script refused a batch; nothing of it was stored. Stop writing this stream."""


class FencedError(AppendRefusedError):
    """Another worker took the stream (meta ``token`` changed): abort the upstream request, do not ack."""


class SeqConflictError(AppendRefusedError):
    """Meta ``last_seq + 1`` is not the batch's first seq (a bug, or a write we lost track of).

    Attributes:
        stored_seq: The ``last_seq`` Redis holds.
    """

    def __init__(self, message: str, *, stored_seq: int) -> None:
        super().__init__(message)
        self.stored_seq = stored_seq


class StreamClosedError(AppendRefusedError):
    """The stream already has its terminal event; nothing may follow it. Ack the job."""


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
    """

    def __init__(
        self, redis: aioredis.Redis, keys: Keys, *, stream_ttl_s: int = 86_400,
        tombstone_ttl_s: int = 7 * 86_400, done_maxlen: int = 100_000,
    ) -> None:
        self.redis, self.keys = redis, keys
        self.limits = (str(stream_ttl_s), str(tombstone_ttl_s), str(done_maxlen))
        self.script: AsyncScript = redis.register_script(APPEND_LUA)

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
        limits = self._appender.limits
        head = [str(self.token), str(events[0].seq), self._appender.keys.live(self.stream_id)]
        if isinstance(terminal, StreamDone | StreamError):
            first_delta = self.first_delta_ms if self.first_delta_ms is not None else _first_delta_ts(events)
            summary = summary_fields(terminal, provider=self.provider, model=self.model,
                                     started_ms=self.started_ms, first_delta_ms=first_delta)
            head += [terminal.status, str(terminal.ts), *limits]
        else:
            summary = []
            head += ["", "", *limits]
        return [*head, str(len(events)), *(encode_event(e) for e in events), *summary]

    async def append(self, events: list[Event]) -> int:
        """Store ``events`` (one batch, seq order, consecutive) with one script call.

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
            redis.exceptions.RedisError: Redis unreachable; the batch may or may not be stored.
        """
        if not events:
            return self.last_seq
        keys = self._appender.keys
        reply = await self._appender.script(
            keys=[keys.events(self.stream_id), keys.meta(self.stream_id), keys.tomb(self.stream_id), keys.done],
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
        return self.last_seq


def _first_delta_ts(events: list[Event]) -> int | None:
    return next((e.ts for e in events if isinstance(e, BlockDelta)), None)


def _refusal(code: str, detail: str, stream_id: str) -> AppendRefusedError:
    if code == "fenced":
        return FencedError(f"stream {stream_id} is owned by another worker (token {detail or 'none'})")
    if code == "closed":
        return StreamClosedError(f"stream {stream_id} already ended at seq {detail}")
    return SeqConflictError(f"stream {stream_id} holds last_seq {detail}", stored_seq=int(detail))
