"""Stored events as the publisher serves them: one :class:`Entry` per ``0-<seq>`` item, its SSE message ready.

Each stored item (field ``e``: the event JSON, schema.keys) is parsed once, peeking only
at the few fields the publisher needs (type, ts, block index and kind, visibility); the
JSON itself stays opaque bytes inside the ready-made ``id:``/``event:``/``data:``
message, shared by every reader of the stream. The ``id:`` is ``<seq>.<epoch>`` when the
stream's generation has an epoch (contract 1.1), else ``<seq>``. An item without event JSON, or not JSON,
becomes an ``invalid`` entry that keeps its seq and sends nothing; an id of another shape
(a foreign writer's) is logged and skipped. Pure: no I/O. Follows the WHATWG HTML
"Server-sent events" section for the message fields.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any, Final, cast

import msgspec

from publisher.wire.sse import one_line
from schema.contract import EVENT_TYPES, TERMINAL_TYPES
from schema.keys import EVENT_FIELD, seq_of

log = logging.getLogger(__name__)

_SAFE_TYPE: Final = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


class _PeekBlock(msgspec.Struct, gc=False):
    index: int = -1
    kind: str = ""


class _Peek(msgspec.Struct, gc=False):
    """The few event fields the publisher needs; everything else stays opaque bytes."""

    type: str = ""
    ts: int = 0
    block: _PeekBlock | None = None
    visibility: str | None = None


_peek: Final = msgspec.json.Decoder(_Peek)

_TYPE_NAMES: Final = {name: name.encode() for name in EVENT_TYPES}
"""Contract type -> its ``event:`` field bytes (no pattern check needed for these)."""



class Entry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One stored event as the publisher serves it."""

    seq: int
    """The event's seq (from the entry id ``0-<seq>``)."""
    type: str
    """Contract type (``stream.start``, ...); unknown types pass through untouched."""
    ts_ms: int
    """The worker's emit time, ms since the Unix epoch (0 when absent)."""
    block_index: int | None
    """Index of the block a ``block.*`` event is about, else ``None``."""
    block_kind: str | None
    """Kind of that block, else ``None``."""
    visibility: str | None
    """``visibility`` of a reasoning ``block.start``, else ``None``."""
    frame: bytes
    """The complete SSE message (``id``, ``event``, ``data``, blank line)."""
    epoch: bytes = b""
    """The generation the entry was read or heard in (its ``id`` suffix); ``b""`` before contract 1.1."""

    @property
    def terminal(self) -> bool:
        """True for ``stream.done`` and ``stream.error``."""
        return self.type in TERMINAL_TYPES


class Page(list[Entry]):
    """Entries of one XRANGE reply, in seq order; may be shared by readers (never modify one).

    :meth:`frames` joins their SSE messages once, so readers that send the same page
    send (and hold) one bytes object. :attr:`epoch` is the stream's meta ``epoch`` read
    right after the entries (:meth:`publisher.history.store.Store.read_after`): a reader holding
    another generation must not be served them (``stream.gap``).

    Args:
        entries: The entries.
        epoch: Meta ``epoch`` read with them (``b""``: none, a stream older than contract 1.1).
    """

    __slots__ = ("_frames", "epoch")

    def __init__(self, entries: Iterable[Entry] = (), epoch: bytes = b"") -> None:
        super().__init__(entries)
        self.epoch = epoch

    def frames(self) -> bytes | None:
        """Return every entry's frame joined, computed once.

        ``None`` when a frame is empty or a terminal entry comes before the last: the
        caller then picks the entries to send itself.
        """
        try:
            return self._frames
        except AttributeError:
            pass
        whole = all(entry.frame for entry in self) and not any(entry.terminal for entry in self[:-1])
        self.seal(b"".join([entry.frame for entry in self]) if whole else None)
        return self._frames

    def seal(self, frames: bytes | None) -> None:
        """Set what :meth:`frames` returns (a parser that joined the frames on the way)."""
        self._frames: bytes | None = frames


def parse_entry(entry_id: bytes | str, fields: dict[bytes, bytes] | list[bytes], epoch: bytes = b"") -> Entry:
    """Parse one XRANGE item.

    Args:
        entry_id: ``0-<seq>``.
        fields: The entry's fields, as a map or as redis' flat ``[name, value, ...]``
            list; the event JSON is under ``e``.
        epoch: The generation's epoch, for the frame's ``id`` (``b""``: none).

    Returns:
        The entry. One that holds no event JSON (a writer's bug) is logged and gets
        type ``invalid`` and an empty frame: it keeps its seq, so positions stay exact,
        but nothing is sent for it.
    """
    return entry_of(seq_of(entry_id), event_field(fields), epoch)


def entry_of(seq: int, raw: bytes | None, epoch: bytes = b"") -> Entry:
    """Build the :class:`Entry` of one stored event (from XRANGE or a live notification).

    Args:
        seq: The entry's seq.
        raw: The event JSON as stored in field ``e``; ``None`` when the field is missing.
        epoch: The generation's epoch (``id: <seq>.<epoch>``); ``b""`` for ``id: <seq>``.

    Returns:
        The entry with its ready SSE frame; see :func:`parse_entry` for one without JSON.
    """
    if raw is None:
        return invalid_entry(seq, epoch)
    try:
        data = raw if b"\n" not in raw and b"\r" not in raw else one_line(raw)
        peek = _peek.decode(data)
    except (msgspec.DecodeError, RecursionError):  # not JSON (one_line re-encodes only JSON), not an
        return invalid_entry(seq, epoch)  # event object, or nested past the decoder's recursion limit
    kind = peek.type
    name = _TYPE_NAMES.get(kind)
    if name is None:
        kind = kind if _SAFE_TYPE.fullmatch(kind) else "unknown"
        name = kind.encode()
    block = peek.block
    return Entry(
        seq=seq,
        type=kind,
        ts_ms=peek.ts,
        block_index=block.index if block else None,
        block_kind=block.kind if block else None,
        visibility=peek.visibility,
        frame=b"id: %d%s\nevent: %s\ndata: %s\n\n" % (seq, _suffix(epoch), name, data),
        epoch=epoch,
    )


def _suffix(epoch: bytes) -> bytes:
    """Return what follows the seq in an ``id:`` line: ``.<epoch>``, or nothing without one."""
    return b"." + epoch if epoch else b""


def entries_of(stream_id: str, raw: list[tuple[bytes, Any]], epoch: bytes = b"") -> Page:
    """Parse one XRANGE reply (``[(entry id, fields)]``, ascending ids) into entries of generation ``epoch``.

    A page whose first and last ids are ``0-<seq>`` and whose length equals the span
    between them holds exactly the seqs ``first .. last`` (stream ids strictly
    increase, and a foreign id sorts above every ``0-<seq>``), so the ids in between
    are not parsed, and when every item is the usual ``[e, <one-line JSON>]`` the
    page is checked for line breaks in one scan (:func:`_fast_page`). Any other page
    takes the careful path (:func:`parse_entry` per item; foreign ids are logged and
    skipped). Both give the same entries.
    """
    if not raw:
        return Page(epoch=epoch)
    if len(raw) == 1:  # the usual live read: one new entry
        (entry_id, fields), = raw
        seq = ours_seq(entry_id)
        if seq is not None and len(fields) == 2 and fields[0] == EVENT_FIELD:
            return Page([entry_of(seq, fields[1], epoch)], epoch)
    first, last = ours_seq(raw[0][0]), ours_seq(raw[-1][0])
    if first is not None and last is not None and last - first + 1 == len(raw):
        datas: list[bytes | None] = [fields[1] if len(fields) == 2 and fields[0] == EVENT_FIELD else None
                                     for _, fields in raw]
        if None not in datas:
            page = _fast_page(first, cast("list[bytes]", datas), epoch)
            if page is not None:
                return page
    entries = Page(epoch=epoch)
    for entry_id, fields in raw:
        seq = ours_seq(entry_id)
        if seq is None:
            if not ours(stream_id, entry_id):
                continue
            seq = seq_of(entry_id)
        entries.append(entry_of(seq, event_field(fields), epoch))
    return entries


def _fast_page(first: int, datas: list[bytes], epoch: bytes) -> Page | None:
    """Entries of seqs ``first ..`` from their event JSONs, or ``None`` when one needs :func:`entry_of`'s care.

    The page's joined frames (:meth:`Page.frames`) are made on the way. ``None`` when a
    JSON holds a line break (it must be re-encoded on one line) or does not decode (or
    nests past the decoder's recursion limit); an unknown type is handed to
    :func:`entry_of` alone. Each JSON is decoded by itself: one decode of the page
    joined as a JSON array would let items that are not JSON alone ('{"x":"' then
    '"}') join into as many values with their boundaries shifted.
    """
    joined = b"".join(datas)
    if b"\n" in joined or b"\r" in joined:
        return None
    try:
        peeks = [_peek.decode(data) for data in datas]
    except (msgspec.DecodeError, RecursionError):  # not JSON or too deep: the careful path, per item
        return None
    entries = Page(epoch=epoch)
    frames: list[bytes] = []
    whole = True
    suffix = _suffix(epoch)
    for seq, peek, data in zip(range(first, first + len(datas)), peeks, datas, strict=True):
        name = _TYPE_NAMES.get(peek.type)
        if name is None:
            entry = entry_of(seq, data, epoch)
            whole = whole and bool(entry.frame)
        else:
            block = peek.block
            entry = Entry(seq=seq, type=peek.type, ts_ms=peek.ts, block_index=block.index if block else None,
                          block_kind=block.kind if block else None, visibility=peek.visibility,
                          frame=b"id: %d%s\nevent: %s\ndata: %s\n\n" % (seq, suffix, name, data), epoch=epoch)
        entries.append(entry)
        frames.append(entry.frame)
    whole = whole and TERMINAL_TYPES.isdisjoint([peek.type for peek in peeks[:-1]])  # a terminal only last
    entries.seal(b"".join(frames) if whole else None)
    return entries


def invalid_entry(seq: int, epoch: bytes) -> Entry:
    """Return the entry of a stored item without event JSON (a writer's bug): keeps its seq, sends nothing."""
    log.error("stream entry %s holds no event JSON; it is not sent", seq)
    return Entry(seq=seq, type="invalid", ts_ms=0, block_index=None, block_kind=None, visibility=None, frame=b"",
                 epoch=epoch)


def event_field(fields: dict[bytes, bytes] | list[bytes]) -> bytes | None:
    """Return field ``e`` of a parsed (map) or raw (flat list) XRANGE entry, or ``None``."""
    if isinstance(fields, dict):
        return fields.get(EVENT_FIELD)
    if len(fields) >= 2 and fields[0] == EVENT_FIELD:
        return fields[1]
    return dict(zip(fields[::2], fields[1::2], strict=False)).get(EVENT_FIELD)


def ours_seq(entry_id: bytes) -> int | None:
    """Return the seq of a ``0-<seq>`` id, or ``None`` for any other shape (a foreign writer's)."""
    if entry_id[:2] == b"0-" and entry_id[2:].isdigit():
        return int(entry_id[2:])
    return None


TOP_OF_OURS: Final = "0-18446744073709551615"
"""Highest entry id of the ``0-<seq>`` space: the top of our entries, whatever a foreign
writer may have appended above it."""


def ours(stream_id: str, entry_id: bytes) -> bool:
    """Return whether an entry id has our ``0-<seq>`` shape.

    A foreign writer's entry (``7-1``) is logged and skipped, so it can never break a
    reader or the hub's live loop.
    """
    try:
        seq_of(entry_id)
    except ValueError:
        log.error("stream %s holds a foreign entry id %r; it is skipped", stream_id, entry_id)
        return False
    return True
