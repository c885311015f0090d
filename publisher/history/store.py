"""Reads of one stream's stored state: meta, tombstone and event entries, by exact position.

Entries are ``0-<seq>`` with field ``c`` (the compact form, :mod:`schema.stored`) or ``e``
(the JSON form of streams stored before it); a compacted run's entry id is its last seq. Every read is an exclusive
``XRANGE key (0-<n> + COUNT c`` (or one ``XREAD`` of several streams, each after its own
position), so a position is always a concrete seq, never "the current tail". Replies are
rendered into :class:`~publisher.history.entries.Entry` objects once per process while kept (frame_cache).

Every page that holds entries is followed by a read of the stream's meta ``epoch``
(``HGET``, once the entries are in): :attr:`publisher.history.entries.Page.epoch`. If it is
the epoch the reader holds, the entries are that generation's: a new generation writes
its epoch to meta with its seq 1, before any seq it could reuse, so entries read before
an epoch that is still the reader's cannot be a later generation's (contract 1.1,
"Generations").

Follows the Redis command pages of XRANGE, XREAD, XREVRANGE, HGET, HMGET and HGETALL.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import msgspec
from redis.exceptions import ResponseError

from infra.redis_client import REDIS_ERRORS
from publisher.history.entries import TOP_OF_OURS, Entry, Page, ours
from publisher.history.frame_cache import FrameCache
from publisher.history.pages import item_entries, item_jsons, page_of
from publisher.history.probes import Top, find_block_start, tops
from schema.errors import InternalError
from schema.keys import Keys, seq_of

if TYPE_CHECKING:
    from infra.redis_client import RedisClient


class HistoryChangedError(InternalError):
    """The stream was written again as another generation while it was being read (contract 1.1)."""

_known_top: ContextVar[tuple[str, int] | None] = ContextVar("fanout_store_known_top", default=None)
"""Per request task: ``(stream id, last_seq)`` of its last :meth:`Store.info` reply."""


class StreamInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What Redis knows about a stream before any event is read."""

    known: bool
    """Meta or events exist."""
    last_seq: int
    """Highest stored seq (meta ``last_seq``, or the last entry when higher)."""
    terminal: bool
    """The stream ended (meta ``state=done`` or a terminal last entry)."""
    meta: dict[str, str]
    """The meta hash, decoded (empty when missing)."""
    tomb: dict[str, str]
    """The tombstone (``last_seq``, ``status``), decoded (empty when missing)."""
    tomb_last_seq: int = 0
    """The tombstone's ``last_seq`` (0 when missing or not a number)."""

    @property
    def epoch(self) -> str:
        """The stream's current generation: meta ``epoch``, else the tombstone's ('' when neither has one)."""
        return self.meta.get("epoch") or (self.tomb.get("epoch", "") if not self.meta else "")


def _decode_hash(raw: dict[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in raw.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _int(value: str | None) -> int:
    """Return a stored counter as a non-negative int; 0 when missing or not a number (corrupt state)."""
    try:
        return max(0, int(value or 0))
    except ValueError:
        return 0


def _after(page: Page, after_seq: int, count: int) -> Page:
    """``page`` without entries at or before ``after_seq`` and cut to ``count``: a compacted run reaches outside."""
    if page and (page[0].seq <= after_seq or len(page) > count):
        return Page([entry for entry in page if entry.seq > after_seq][:count], page.epoch)
    return page


class Store:
    """Stream reads over one Redis client.

    Args:
        redis: The command client; tests may pass a wrapper with the same methods.
        keys: The deployment's key layout.
        page: Entries per XRANGE call (``FANOUT_READ_PAGE``).
        first_page: Entries of an SSE response's first history read
            (``FANOUT_READ_FIRST_PAGE``; at most ``page``).
        cluster: ``redis`` is a cluster client: :meth:`read_many` reads each stream on its own.
        frames: Renders the pages read, keeping rendered entries (``None``: a cache that keeps none).
    """

    def __init__(self, redis: RedisClient, keys: Keys, page: int, *, first_page: int | None = None,
                 cluster: bool = False, frames: FrameCache | None = None) -> None:
        self.redis = redis
        self.frames = frames if frames is not None else FrameCache(0)
        self.cluster = cluster
        self.keys = keys
        self.page = page
        self.first_page = min(page, first_page or page)
        self._inflight: dict[tuple[object, str, int, int], asyncio.Future[Page]] = {}
        for command in ("XRANGE", "XREAD"):  # replies as Redis sends them, parsed once, here (no dict per entry)
            redis.set_response_callback(command, lambda response, **_: response)

    async def info(self, stream_id: str) -> StreamInfo:
        """Return meta, tombstone and the top of the stored stream (one round trip)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.meta(stream_id))
            pipe.hgetall(self.keys.tomb(stream_id))
            pipe.xrevrange(self.keys.events(stream_id), TOP_OF_OURS, "-", count=1)
            meta_raw, tomb_raw, top = await pipe.execute()
        meta, tomb = _decode_hash(meta_raw), _decode_hash(tomb_raw)
        if tomb and not top:  # expired: the frames kept of it are let go
            self.frames.forget(stream_id)
        last = item_entries(stream_id, *top[0])[-1:] if top else None
        last_seq = max(_int(meta.get("last_seq")), seq_of(top[0][0]) if top else 0)
        _known_top.set((stream_id, last_seq))  # for read_after: a shared read must not show less
        return StreamInfo(
            known=bool(meta) or bool(top),
            last_seq=last_seq,
            terminal=meta.get("state") == "done" or bool(last and last[0].terminal),
            meta=meta,
            tomb=tomb,
            tomb_last_seq=_int(tomb.get("last_seq")),
        )

    async def read_after(self, stream_id: str, after_seq: int, count: int | None = None, *,
                         share: object | None = None, keep: bool = True) -> Page:
        """Return up to ``count`` (default: one page) entries with seq > ``after_seq``, in order.

        Runs ``XRANGE <events> (0-<after_seq> + COUNT <count>``; a page shorter than
        ``count`` means the stored top was reached. Callers check contiguity on ``seq``.

        Args:
            stream_id: The stream.
            after_seq: The exclusive start position (a seq; 0 for the beginning).
            count: Most entries returned; ``None`` for ``FANOUT_READ_PAGE``.
            share: When given, a read of the same stream, position and count already in
                flight under the same ``share`` key is awaited instead of a new one, and
                its very :class:`Page` is returned (callers must not modify it). The SSE
                routes pass their reader's live subscription
                (:meth:`publisher.live.hub.Hub.share_key`), so only reads made after that
                subscription was confirmed are shared and no live entry can fall between
                a shared read and the live tail. Readers replaying the same stream from
                the same place then hold one copy of its pages, not one each. A
                joined read that ends below the ``last_seq`` this task's last
                :meth:`info` saw was answered before that reply (it would look like
                trimmed history: a false ``410`` or ``stream.gap``), so it is read again,
                unshared.
            keep: Keep the rendered entries in the frame cache; live reads pass ``False``.
        """
        count = count or self.page
        if share is None:
            return await self._read_page(stream_id, after_seq, count, keep=keep)
        key = (share, stream_id, after_seq, count)
        shared = self._inflight.get(key)
        if shared is None:
            shared = asyncio.ensure_future(self._read_page(stream_id, after_seq, count))
            self._inflight[key] = shared
            shared.add_done_callback(lambda done: self._landed(key, done))
            return await asyncio.shield(shared)  # registered after this task's info(): nothing older
        page = await asyncio.shield(shared)
        known = _known_top.get()
        if len(page) < count and known is not None and known[0] == stream_id \
                and (page[-1].seq if page else after_seq) < known[1]:
            return await self._read_page(stream_id, after_seq, count)
        return page

    async def read_many(self, positions: Sequence[tuple[str, int]]) -> list[Page | BaseException]:
        """Return one page after each ``(stream id, after seq)``, or the error that stream's read met.

        A single node answers them all with one ``XREAD COUNT <page> STREAMS <events...>
        <0-<after>...>`` (its ids are exclusive, like ``XRANGE (0-<after>``; a stream with
        nothing after its position, or no events key, gets an empty page). When that
        command fails with a reply error (one key of another type, say), or on a cluster
        (where keys of several slots cannot share a command), or for one stream, each is
        read with :meth:`read_after`, concurrently, so one stream's failure is only its own.

        Args:
            positions: Distinct streams and their exclusive start seqs.

        Returns:
            In the order of ``positions``: a :class:`Page` of at most ``page`` entries, or
            the ``RedisError``/``RedisClusterException`` raised for that stream (a
            connection error fails every stream of a single-node read).
        """
        if len(positions) > 1 and not self.cluster:
            try:
                return await self._xread(positions)
            except ResponseError:
                pass
            except REDIS_ERRORS as exc:
                return [exc] * len(positions)
        results = await asyncio.gather(*(self.read_after(stream_id, after, keep=False)
                                         for stream_id, after in positions), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, REDIS_ERRORS):
                raise result
        return results

    async def _xread(self, positions: Sequence[tuple[str, int]]) -> list[Page | BaseException]:
        keys = [self.keys.events(stream_id) for stream_id, _ in positions]
        raw: Any = await self.redis.execute_command(
            "XREAD", "COUNT", self.page, "STREAMS", *keys, *(f"0-{after}" for _, after in positions))
        pairs = raw.items() if isinstance(raw, dict) else raw or ()  # RESP3 answers a map, RESP2 an array
        found = {_text(key): entries for key, entries in pairs}
        read = [stream_id for (stream_id, _), key in zip(positions, keys, strict=True) if found.get(key)]
        epochs = dict(zip(read, await self._epochs(read), strict=True))
        return [_after(page_of(stream_id, list(found.get(key, ())), epochs.get(stream_id, b""), after=after,
                               limit=self.page), after, self.page)
                for (stream_id, after), key in zip(positions, keys, strict=True)]

    async def _epochs(self, stream_ids: list[str]) -> list[bytes]:
        """Meta ``epoch`` of each stream (``b""`` when none), read after its entries: one round trip."""
        if not stream_ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream_id in stream_ids:
                pipe.hget(self.keys.meta(stream_id), "epoch")
            return [epoch or b"" for epoch in await pipe.execute()]

    async def _read_page(self, stream_id: str, after_seq: int, count: int, *, keep: bool = True) -> Page:
        raw, epoch = await self._xrange(stream_id, after_seq, count)
        render = self.frames.page if keep else page_of
        return _after(render(stream_id, raw, epoch, after=after_seq, limit=count), after_seq, count)

    def _landed(self, key: tuple[object, str, int, int], done: asyncio.Future[Page]) -> None:
        """Forget a finished shared read (its waiters have their result) and mark its failure as seen."""
        if self._inflight.get(key) is done:
            del self._inflight[key]
        if not done.cancelled():
            done.exception()

    async def _xrange(self, stream_id: str, after_seq: int, count: int) -> tuple[list[tuple[bytes, Any]], bytes]:
        """``XRANGE <events> (0-<after_seq> + COUNT <count>`` as ``(entry id, fields)`` pairs, then meta ``epoch``.

        The epoch (``b""`` when meta has none) is read after the entries, and only when
        there are some: an empty page belongs to no generation.
        """
        raw: Any = await self.redis.xrange(self.keys.events(stream_id), f"(0-{after_seq}", "+", count=count)
        if not raw:
            return [], b""
        epoch: bytes | None = await self.redis.hget(self.keys.meta(stream_id), "epoch")  # type: ignore[assignment]
        return list(raw), epoch or b""

    async def find_block_start(self, stream_id: str, before_seq: int, block_index: int) -> Entry | None:
        """Return the ``block.start`` of block ``block_index`` stored before ``before_seq``, or ``None``.

        See :func:`publisher.history.probes.find_block_start` (pages of at most ``page``).
        """
        return await find_block_start(self.redis, self.keys, stream_id, before_seq, block_index=block_index,
                                      page=self.page)

    async def tops(self, stream_ids: list[str]) -> list[Top | ResponseError]:
        """Return the top, meta state and epoch of each stream: :func:`publisher.history.probes.tops`."""
        return await tops(self.redis, self.keys, stream_ids)

    async def events_exist(self, stream_id: str) -> bool:
        """Return True when the stream's events key still exists."""
        return bool(await self.redis.exists(self.keys.events(stream_id)))

    async def read_json(self, stream_id: str, epoch: str, after_seq: int = 0) -> AsyncIterator[tuple[int, bytes]]:
        """Yield ``(seq, event JSON)`` of every stored entry of generation ``epoch`` with seq > ``after_seq``, paged.

        For the status route.

        Raises:
            HistoryChangedError: A page was read in another generation (meta ``epoch``
                is no longer ``epoch``): what was yielded is not one history.
        """
        cursor = after_seq
        while True:
            raw, found = await self._xrange(stream_id, cursor, self.page)
            if raw and found.decode() != epoch:
                raise HistoryChangedError(f"stream {stream_id} holds another generation now")
            for entry_id, fields in raw:
                if not ours(stream_id, entry_id):
                    return  # a foreign id sorts above every 0-<seq>: nothing of ours follows
                for seq, data in item_jsons(stream_id, entry_id, fields):
                    if seq > cursor:
                        yield seq, data
                cursor = seq_of(entry_id)
            if len(raw) < self.page:
                return
