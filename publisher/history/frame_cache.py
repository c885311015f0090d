"""A bounded per-process cache of the entries (ready SSE frames) that stored items render to.

Every history read still runs its ``XRANGE`` (Redis stays the truth); what the cache saves
is the rendering: parsing a stored item (either form, :mod:`publisher.history.pages`) and
making its ``id:``/``event:``/``data:`` message, and expanding a compacted run. An item is
kept under its stream and seq, with the generation (meta ``epoch``) it was read in and
its stored field name and value; it is served again only when all of them are the same,
so a cached entry is byte for byte what rendering the item again would give. A page read
in another epoch than the one the cache holds for that stream drops the stream's items
(a history reset or a stream written again after its tombstone); caching a compacted run
drops the items it replaced. The least recently used items go first once the estimated
size passes ``FANOUT_FRAME_CACHE_BYTES``; 0 caches nothing. Pure: no I/O.

May import :mod:`publisher.history.entries`, :mod:`publisher.history.pages` and :mod:`schema`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final

import msgspec

from publisher.history.entries import Entry, Page, ours_seq
from publisher.history.pages import page_of

ENTRY_OVERHEAD: Final = 200
"""Estimated bytes of one cached :class:`Entry` besides its frame (the object, its fields)."""
ITEM_OVERHEAD: Final = 150
"""Estimated bytes of one cached item besides its value and entries (key, record, LRU slot)."""

Item = tuple[bytes, Any]
"""One XRANGE/XREAD reply item: ``(entry id, fields)``."""


class _Cached(msgspec.Struct, gc=False):
    epoch: bytes
    name: bytes
    value: bytes
    entries: list[Entry]
    size: int


def item_size(value: bytes, entries: list[Entry]) -> int:
    """Return the estimated bytes one cached item holds: its stored value, its frames and overheads."""
    return ITEM_OVERHEAD + len(value) + sum(ENTRY_OVERHEAD + len(entry.frame) for entry in entries)


def _source(fields: dict[bytes, bytes] | list[bytes]) -> tuple[bytes, bytes] | None:
    """Return the one ``(field name, value)`` of a stored item, or ``None`` for any other shape (not cached)."""
    if isinstance(fields, dict):
        return next(iter(fields.items())) if len(fields) == 1 else None
    return (fields[0], fields[1]) if len(fields) == 2 else None


class FrameCache:
    """Rendered entries of stored items, per stream and seq, least recently used out.

    Args:
        limit_bytes: Most estimated bytes kept (:func:`item_size` summed,
            ``FANOUT_FRAME_CACHE_BYTES``); 0 keeps nothing (every read renders).

    Attributes:
        rendered: Events rendered from stored items by :meth:`page` (a compacted run
            counts each delta it holds), since start.
        served: Events served from the cache by :meth:`page`, since start.
        bytes: Estimated bytes kept now.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.rendered = 0
        self.served = 0
        self.bytes = 0
        self._items: OrderedDict[tuple[str, int], _Cached] = OrderedDict()
        self._streams: dict[str, tuple[bytes, set[int]]] = {}

    def __len__(self) -> int:
        """Return how many stored items are kept."""
        return len(self._items)

    def page(self, stream_id: str, raw: list[Item], epoch: bytes = b"", *, after: int = 0,
             limit: int | None = None) -> Page:
        """Return :func:`publisher.history.pages.page_of` of ``raw``, rendering only the items not cached.

        Args:
            stream_id: The stream the reply is of.
            raw: One XRANGE/XREAD reply (ascending ids), fields as flat lists or maps.
            epoch: The meta ``epoch`` read after the entries (``b""``: none).
            after: The reader's position (entries at or before it do not count toward ``limit``).
            limit: Stop taking items once the page holds this many entries after ``after``.

        Returns:
            The entries in seq order: the same entries :func:`page_of` gives for ``raw``
            (up to where ``limit`` stops it; a caller cuts the page to its count).
        """
        if self.limit_bytes <= 0 or not raw:
            page = page_of(stream_id, raw, epoch, after=after, limit=limit)
            self.rendered += len(page)
            return page
        self._hold_epoch(stream_id, epoch)
        page, pending, kept = Page(epoch=epoch), list[Item](), 0
        for item in raw:
            if limit is not None and kept + len(pending) >= limit:
                kept += self._render(stream_id, pending, page, after)
                pending = []
                if kept >= limit:
                    break
            cached = self._get(stream_id, epoch, item)
            if cached is None:
                pending.append(item)
                continue
            kept += self._render(stream_id, pending, page, after)
            pending = []
            page.extend(cached)
            self.served += len(cached)
            kept += sum(1 for entry in cached if entry.seq > after)
        self._render(stream_id, pending, page, after)
        return page

    def forget(self, stream_id: str) -> None:
        """Drop every item kept of ``stream_id``."""
        _, seqs = self._streams.pop(stream_id, (b"", set[int]()))
        for seq in seqs:
            self.bytes -= self._items.pop((stream_id, seq)).size

    def _hold_epoch(self, stream_id: str, epoch: bytes) -> None:
        """Drop the stream's items when they were read in another generation than ``epoch``."""
        held = self._streams.get(stream_id)
        if held is not None and held[0] != epoch:
            self.forget(stream_id)

    def _get(self, stream_id: str, epoch: bytes, item: Item) -> list[Entry] | None:
        seq, source = ours_seq(item[0]), _source(item[1])
        if seq is None or source is None:
            return None
        cached = self._items.get((stream_id, seq))
        if cached is None or cached.epoch != epoch or cached.name != source[0] or cached.value != source[1]:
            return None
        self._items.move_to_end((stream_id, seq))
        return cached.entries

    def _render(self, stream_id: str, items: list[Item], page: Page, after: int) -> int:
        """Render ``items``, add their entries to ``page`` and keep them; return how many are after ``after``."""
        if not items:
            return 0
        rendered = page_of(stream_id, items, page.epoch)
        self.rendered += len(rendered)
        page.extend(rendered)
        self._keep(stream_id, page.epoch, items, rendered)
        return sum(1 for entry in rendered if entry.seq > after)

    def _keep(self, stream_id: str, epoch: bytes, items: list[Item], entries: list[Entry]) -> None:
        """Keep each item's entries: those after the previous item's seq up to its own (one, or a run's)."""
        at, previous = 0, None
        for entry_id, fields in items:
            seq, source = ours_seq(entry_id), _source(fields)
            if seq is None or source is None:
                return  # a foreign id or an odd item: which entries are its own is not known
            start = at
            while at < len(entries) and entries[at].seq <= seq:
                at += 1
            mine = entries[start:at]
            if not mine or mine[-1].seq != seq or (previous is not None and mine[0].seq <= previous):
                return
            self._put(stream_id, seq, _Cached(epoch, source[0], source[1], mine, item_size(source[1], mine)))
            previous = seq

    def _put(self, stream_id: str, seq: int, cached: _Cached) -> None:
        _, seqs = self._streams.setdefault(stream_id, (cached.epoch, set()))
        for replaced in range(cached.entries[0].seq, seq + 1):  # a compacted run replaced the items of its seqs
            if replaced in seqs:
                seqs.discard(replaced)
                self.bytes -= self._items.pop((stream_id, replaced)).size
        self._items[(stream_id, seq)] = cached
        seqs.add(seq)
        self.bytes += cached.size
        while self.bytes > self.limit_bytes:
            (old_stream, old_seq), old = self._items.popitem(last=False)
            self.bytes -= old.size
            old_seqs = self._streams[old_stream][1]
            old_seqs.discard(old_seq)
            if not old_seqs:
                del self._streams[old_stream]
