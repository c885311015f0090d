"""Reads at the edges of stored streams for the live side: each stream's top, and a block's start.

:func:`tops` is what the live audit (:mod:`publisher.live.audit`) asks of the topics that
heard nothing for a while; :func:`find_block_start` is how a public projection resuming
inside a reasoning block learns where that block started. Both are reached through
:class:`publisher.history.store.Store` (its ``tops`` and ``find_block_start``).

Follows the Redis command pages of XREVRANGE and HMGET.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from redis.exceptions import ResponseError

from publisher.history.entries import TOP_OF_OURS, Entry, ours_seq
from publisher.history.pages import item_entries
from schema.keys import Keys, seq_of

if TYPE_CHECKING:
    from infra.redis_client import RedisClient

FIND_FIRST_COUNT: Final = 64
"""Entries of the first backward page of :func:`find_block_start`."""
Top = tuple[int | None, str | None, bool, bytes | None]
"""What :func:`tops` finds of one stream: top seq, meta state, top is terminal, meta epoch."""


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


async def find_block_start(redis: RedisClient, keys: Keys, stream_id: str, before_seq: int, *, block_index: int,
                           page: int) -> Entry | None:
    """Return the ``block.start`` of block ``block_index`` stored before ``before_seq``, or ``None``.

    Reads backwards, ``XREVRANGE <events> (0-<before_seq> - COUNT <n>`` with ``n``
    64 and then four times larger per page up to ``page``, and stops at that start,
    at the start of an earlier block (the normalizer numbers blocks in order of their
    start, so the one wanted is not stored: trimmed, or never written), or at the
    first entry. A reader resuming inside a block thus reads back to that block's start
    only, not the whole history.
    """
    upper, count = before_seq, min(page, FIND_FIRST_COUNT)
    while upper > 1:
        raw: Any = await redis.xrevrange(keys.events(stream_id), f"(0-{upper}", "-", count=count)
        below = upper
        for entry_id, fields in raw or ():
            seq = ours_seq(entry_id)
            if seq is None:  # a foreign id sorts above ours: skip it
                continue
            for entry in reversed(item_entries(stream_id, entry_id, fields)):  # a compacted run: many
                if entry.type == "block.start" and entry.block_index is not None and entry.seq < before_seq:
                    if entry.block_index == block_index:
                        return entry
                    if entry.block_index < block_index:
                        return None
            upper = seq
        if not raw or len(raw) < count or upper == below:
            return None
        count = min(page, count * 4)
    return None


async def tops(redis: RedisClient, keys: Keys, stream_ids: list[str]) -> list[Top | ResponseError]:
    """Return ``(top seq or None, meta state or None, top is a terminal event, meta epoch or None)`` of each stream.

    One round trip: ``HMGET <meta> state epoch`` and then ``XREVRANGE <events> <top of
    ours> - COUNT 1`` per stream; the top is ``None`` when the stream holds no entry of
    ours, the state ``None`` when meta is gone, the epoch ``None`` when meta has none.
    A stream whose key answers a reply error (another type, say) gets that error, so
    it fails only its own entry.

    The state is read first because a pipeline is not atomic: Redis may run another
    client's commands between two of its commands (at a read boundary of a long
    pipeline, say). The worker's append script stores a terminal event and sets
    ``state=done`` in one step, so a ``done`` read first means the top read after it
    includes that event. In the other order, a stream ending in between would read
    as ``done`` with the top below its terminal event: ended without one.
    """
    async with redis.pipeline(transaction=False) as pipe:
        for stream_id in stream_ids:
            pipe.hmget(keys.meta(stream_id), ["state", "epoch"])
            pipe.xrevrange(keys.events(stream_id), TOP_OF_OURS, "-", count=1)
        replies = await pipe.execute(raise_on_error=False)
    results: list[Top | ResponseError] = []
    for stream_id, fields, top in zip(stream_ids, replies[::2], replies[1::2], strict=True):
        failed = next((reply for reply in (top, fields) if isinstance(reply, Exception)), None)
        if failed is not None:
            if not isinstance(failed, ResponseError):
                raise failed
            results.append(failed)
        else:
            state, epoch = fields
            results.append((seq_of(top[0][0]) if top else None, _text(state),
                            bool(top) and any(e.terminal for e in item_entries(stream_id, *top[0])[-1:]), epoch))
    return results
