"""A bounded per-process cache of the entries (ready SSE frames) that stored items render to.

Every history read still runs its ``XRANGE`` (Redis stays the truth); the cache saves the
rendering: parsing each stored item (:mod:`publisher.history.pages`), making its SSE
message, expanding a compacted run. Items are kept in segments of up to
:data:`SEGMENT_ITEMS` consecutive stored items of one stream: their entry ids, stored
fields and entries, read in one generation (meta ``epoch``). Reply items equal (ids and
fields) to a segment's get its entries (a slice after one comparison of the lists), so a
kept entry is byte for byte what rendering gives; only items no segment holds are rendered.
A read in another epoch drops the stream's segments (history reset, a stream written again
after its tombstone); an item unlike the one kept at its seq (compacted) cuts the kept items
from there on; :meth:`FrameCache.forget` drops an expired stream's. Segments read least
recently go first past ``FANOUT_FRAME_CACHE_BYTES``; 0 keeps nothing. Pure: no I/O.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import OrderedDict
from itertools import chain
from typing import Any, Final

from publisher.history.entries import Entry, Page, ours_seq
from publisher.history.pages import page_of

ENTRY_OVERHEAD: Final = 200
"""Estimated bytes of one cached :class:`Entry` besides its frame (the object, its fields)."""
ITEM_OVERHEAD: Final = 150
"""Estimated bytes of one cached stored item besides its values (its id, list slots)."""
SEGMENT_ITEMS: Final = 1024
"""Most stored items in one segment: what least-recently-used eviction drops at once."""
Item = tuple[bytes, Any]
"""One XRANGE/XREAD reply item: ``(entry id, fields)``, fields a flat list or a map."""


class _Segment:
    """Consecutive stored items of one stream: ids, fields, item seqs, and the entries they render to."""

    __slots__ = ("ends", "entries", "fields", "ids", "seqs", "size")

    def __init__(self) -> None:
        self.ids: list[bytes] = []
        self.fields: list[Any] = []
        self.seqs: list[int] = []
        self.ends: list[int] = []  # item k's entries: entries[ends[k - 1]:ends[k]] (from 0 for the first)
        self.entries: list[Entry] = []
        self.size = 0


class _Held:
    """One stream's segments, by the seq of their first item, and the epoch they were read in."""

    __slots__ = ("epoch", "firsts", "segments")

    def __init__(self, epoch: bytes) -> None:
        self.epoch = epoch
        self.firsts: list[int] = []
        self.segments: dict[int, _Segment] = {}

    def find(self, seq: int) -> tuple[_Segment | None, int]:
        """Return the segment whose items span ``seq`` and the index of its first item at or above ``seq``."""
        at = bisect_right(self.firsts, seq) - 1
        segment = self.segments[self.firsts[at]] if at >= 0 else None
        if segment is None or seq > segment.seqs[-1]:
            return None, 0
        return segment, bisect_left(segment.seqs, seq)

    def ending_at(self, seq: int) -> _Segment | None:
        """Return the segment whose last item is at ``seq``, or ``None``."""
        segment, _ = self.find(seq)
        return segment if segment is not None and segment.seqs[-1] == seq else None

    def next_first(self, seq: int) -> int | None:
        """Return the first seq of the segment after ``seq``, or ``None``."""
        at = bisect_right(self.firsts, seq)
        return self.firsts[at] if at < len(self.firsts) else None


def item_size(fields: dict[bytes, bytes] | list[bytes], entries: list[Entry]) -> int:
    """Return the estimated bytes one kept item holds: its stored fields, its frames and the overheads."""
    values = [*fields.keys(), *fields.values()] if isinstance(fields, dict) else fields
    return ITEM_OVERHEAD + sum(map(len, values)) + sum(ENTRY_OVERHEAD + len(entry.frame) for entry in entries)


def _chunk_size(chunk: list[Item], entries: list[Entry]) -> int:
    """Return :func:`item_size` summed over ``chunk``'s items (their entries: ``entries``), in C-level passes."""
    if not all(type(fields) is list for _, fields in chunk):
        return sum(item_size(fields, []) for _, fields in chunk) + item_size([], entries) - ITEM_OVERHEAD
    values = len(b"".join(chain.from_iterable(fields for _, fields in chunk)))
    frames = len(b"".join([entry.frame for entry in entries]))
    return ITEM_OVERHEAD * len(chunk) + values + ENTRY_OVERHEAD * len(entries) + frames


def _after_count(entries: list[Entry], after: int) -> int:
    """Return how many of ``entries`` (seq order) are after seq ``after``."""
    if not entries or entries[0].seq > after:
        return len(entries)
    return sum(1 for entry in entries if entry.seq > after)


def _layout(chunk: list[Item], entries: list[Entry]) -> tuple[list[int], list[int]] | None:
    """Return each item's seq and entries end for rendered ``chunk``; ``None`` when which entries are whose is unclear.

    One entry per item in the usual chunk (consecutive ``0-<seq>`` ids, one entry each);
    a compacted run's item holds the entries after the previous item's seq up to its own.
    """
    first, last, count = ours_seq(chunk[0][0]), ours_seq(chunk[-1][0]), len(chunk)
    if first is None or last is None:
        return None
    if last - first + 1 == count == len(entries) and entries[0].seq == first and entries[-1].seq == last:
        return list(range(first, last + 1)), list(range(1, count + 1))
    seqs, ends, at = list[int](), list[int](), 0
    for entry_id, _ in chunk:
        seq, start = ours_seq(entry_id), at
        if seq is None:
            return None
        while at < len(entries) and entries[at].seq <= seq:
            at += 1
        if at == start or entries[at - 1].seq != seq or (seqs and entries[start].seq <= seqs[-1]):
            return None
        seqs.append(seq)
        ends.append(at)
    return (seqs, ends) if at == len(entries) else None


class FrameCache:
    """Rendered entries of stored items, in segments per stream, least recently read out.

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
        self._lru: OrderedDict[tuple[str, int], _Segment] = OrderedDict()
        self._streams: dict[str, _Held] = {}

    def __len__(self) -> int:  # how many stored items are kept
        return sum(len(segment.seqs) for segment in self._lru.values())

    def page(self, stream_id: str, raw: list[Item], epoch: bytes = b"", *, after: int = 0,
             limit: int | None = None) -> Page:
        """Return :func:`publisher.history.pages.page_of` of ``raw``, rendering only the items not kept.

        Args:
            stream_id: The stream the reply is of.
            raw: One XRANGE/XREAD reply (ascending ids), fields as flat lists or maps.
            epoch: The meta ``epoch`` read after the entries (``b""``: none).
            after: The reader's position (entries at or before it do not count toward ``limit``).
            limit: Stop taking items once the page holds this many entries after ``after``.

        Returns:
            The entries :func:`page_of` gives for ``raw`` up to where ``limit`` stops (maybe more: callers cut).
        """
        if self.limit_bytes <= 0 or not raw:
            page = page_of(stream_id, raw, epoch, after=after, limit=limit)
            self.rendered += len(page)
            return page
        held = self._hold(stream_id, epoch)
        page, kept, at, tail = Page(epoch=epoch), 0, 0, None
        while at < len(raw) and (limit is None or kept < limit):
            seq = ours_seq(raw[at][0])
            segment, index = held.find(seq) if seq is not None else (None, 0)
            if segment is not None:
                possible = min(len(raw) - at, len(segment.seqs) - index)
                taken, served = self._serve(stream_id, segment, index, raw, at) if segment.seqs[index] == seq \
                    else (0, [])
                page.extend(served)
                kept += _after_count(served, after)
                at += taken
                if taken < possible:  # the stored stream is not what was kept from there on (compacted)
                    self._cut(stream_id, held, segment, index + taken)
                tail = segment if taken and index + taken == len(segment.seqs) else None
                continue
            end = self._miss_end(held, raw, at, seq, None if limit is None else limit - kept)
            rendered = page_of(stream_id, raw[at:end], epoch)
            self.rendered += len(rendered)
            page.extend(rendered)
            kept += _after_count(rendered, after)
            tail = self._keep(stream_id, held, raw[at:end], rendered, tail) if seq is not None else None
            at = end
        return page

    def forget(self, stream_id: str) -> None:
        """Drop every segment kept of ``stream_id`` (an expired stream's: :meth:`Store.info` saw its tombstone)."""
        held = self._streams.pop(stream_id, None)
        for first, segment in held.segments.items() if held else ():
            del self._lru[(stream_id, first)]
            self.bytes -= segment.size

    def _hold(self, stream_id: str, epoch: bytes) -> _Held:  # dropped first when read in another generation
        held = self._streams.get(stream_id)
        if held is None or held.epoch != epoch:
            self.forget(stream_id)
            held = self._streams[stream_id] = _Held(epoch)
        return held

    def _serve(self, stream_id: str, segment: _Segment, index: int, raw: list[Item],
               at: int) -> tuple[int, list[Entry]]:
        """Return how many items of ``raw`` from ``at`` are ``segment``'s from ``index`` on, and their entries."""
        count = min(len(raw) - at, len(segment.seqs) - index)
        part = raw[at:at + count]
        if [i for i, _ in part] != segment.ids[index:index + count] \
                or [f for _, f in part] != segment.fields[index:index + count]:
            same = 0
            while same < count and part[same][0] == segment.ids[index + same] \
                    and part[same][1] == segment.fields[index + same]:
                same += 1
            count = same
        if not count:
            return 0, []
        self._lru.move_to_end((stream_id, segment.seqs[0]))
        entries = segment.entries[segment.ends[index - 1] if index else 0:segment.ends[index + count - 1]]
        self.served += len(entries)
        return count, entries

    @staticmethod
    def _miss_end(held: _Held, raw: list[Item], at: int, seq: int | None, room: int | None) -> int:
        """Return where the items to render from ``at`` end: before the next kept segment, within ``room``."""
        end = len(raw) if room is None else min(len(raw), at + max(1, room))
        if seq is None:
            return len(raw)  # a foreign id sorts above every one of ours: the rest is not ours
        stop = held.next_first(seq)
        if stop is None and ours_seq(raw[end - 1][0]) is not None:
            return end  # ids ascend and a foreign one sorts above ours: every one up to there is ours
        scan = at + 1
        while scan < end:
            next_seq = ours_seq(raw[scan][0])
            if next_seq is None or (stop is not None and next_seq >= stop):
                break
            scan += 1
        return scan

    def _keep(self, stream_id: str, held: _Held, chunk: list[Item], entries: list[Entry],
              tail: _Segment | None) -> _Segment | None:
        """Keep rendered ``chunk``, after ``tail`` (the segment ending at the item before it) when it has room."""
        layout = _layout(chunk, entries) if entries else None
        if layout is None:
            return None
        seqs, ends = layout
        self._streams[stream_id] = held  # again, when eviction let its last segment go
        tail = tail or held.ending_at(entries[0].seq - 1)  # a live read's item follows the one read before
        if tail is None or len(tail.seqs) + len(seqs) > SEGMENT_ITEMS:
            tail = _Segment()
            held.segments[seqs[0]] = tail
            insort(held.firsts, seqs[0])
            self._lru[(stream_id, seqs[0])] = tail
        base = len(tail.entries)
        tail.ids += [entry_id for entry_id, _ in chunk]
        tail.fields += [fields for _, fields in chunk]
        tail.seqs += seqs
        tail.ends += [base + end for end in ends]
        tail.entries += entries
        size = _chunk_size(chunk, entries)
        tail.size += size
        self.bytes += size
        self._lru.move_to_end((stream_id, tail.seqs[0]))
        self._evict()
        return tail if (stream_id, tail.seqs[0]) in self._lru else None

    def _cut(self, stream_id: str, held: _Held, segment: _Segment, keep: int) -> None:
        """Drop ``segment``'s items from index ``keep`` on and every later segment of the stream."""
        first = segment.seqs[0]
        for later in [later for later in held.firsts if later > first]:
            self._drop(stream_id, held, later)
        if keep == 0:
            self._drop(stream_id, held, first)
            return
        del segment.ids[keep:], segment.fields[keep:], segment.seqs[keep:], segment.ends[keep:]
        del segment.entries[segment.ends[-1]:]
        size = sum(item_size(fields, segment.entries[segment.ends[k - 1] if k else 0:segment.ends[k]])
                   for k, fields in enumerate(segment.fields))
        self.bytes += size - segment.size
        segment.size = size

    def _drop(self, stream_id: str, held: _Held, first: int) -> None:
        """Drop the stream's segment that starts at item seq ``first``."""
        segment = held.segments.pop(first)
        held.firsts.remove(first)
        del self._lru[(stream_id, first)]
        self.bytes -= segment.size

    def _evict(self) -> None:
        """Drop the least recently read segments until the kept bytes are within the limit."""
        while self.bytes > self.limit_bytes:
            stream_id, first = next(iter(self._lru))
            held = self._streams[stream_id]
            self._drop(stream_id, held, first)
            if not held.segments:
                del self._streams[stream_id]
