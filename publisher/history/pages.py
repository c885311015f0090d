"""Stored entries of either form parsed into :class:`~publisher.history.entries.Entry` objects. Pure.

An events stream holds the compact form (field ``c``, :mod:`schema.stored`), the JSON form
of streams stored before it (field ``e``), or both (a stream a newer worker continued).
:func:`page_of` parses one XRANGE/XREAD reply of any of them: an all-JSON reply goes to
:func:`publisher.history.entries.entries_of` as before; any other is parsed item by item
(:func:`item_entries`). A compact value is rebuilt into the event's JSON exactly as the
JSON form stored it (:func:`schema.stored.event_json`), so every SSE frame is the same
bytes whichever form holds the event. A compacted run (tag 3, after the stream ended)
gives one entry per delta it holds. A value that decodes as neither form is logged and
kept as an ``invalid`` entry (its seq stays a position, nothing is sent), as a JSON entry
without JSON is. Follows the WHATWG HTML "Server-sent events" section for the frames.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import msgspec

from publisher.history.entries import Entry, Page, entries_of, entry_of, event_field, invalid_entry, ours, ours_seq
from schema.keys import EVENT_FIELD, seq_of
from schema.stored import (
    BLOCK_KINDS,
    DELTA_KINDS,
    STORED_FIELD,
    DeltaForm,
    PackedRunForm,
    RunForm,
    StoredForm,
    decode_stored,
    delta_json,
    form_json,
    run_jsons,
)

log = logging.getLogger(__name__)
_stored_decoder: Final = msgspec.msgpack.Decoder(StoredForm)


def page_of(stream_id: str, raw: list[tuple[bytes, Any]], epoch: bytes = b"", *, after: int = 0,
            limit: int | None = None) -> Page:
    """Parse one XRANGE reply (``[(entry id, fields)]``, ascending ids) of either stored form.

    Args:
        stream_id: The stream the key names (compact values do not hold it).
        raw: The reply, fields as redis' flat ``[name, value, ...]`` lists or maps.
        epoch: The generation's epoch, for the frames' ``id`` (``b""``: none).
        after: The reader's position: entries at or before it do not count toward ``limit``
            (a compacted run that holds it starts before it).
        limit: Stop parsing items once the page holds this many entries after ``after`` (a
            compacted run gives many: a reply of runs is not expanded past what was asked for).

    Returns:
        The entries in seq order; a compacted run gives one entry per delta, so the page
        may hold more entries than ``raw`` had items (and more than ``limit``: the last run
        is whole). Foreign ids are logged and skipped.
    """
    if all(_field_name(fields) == EVENT_FIELD for _, fields in raw):
        return entries_of(stream_id, raw, epoch)
    fast = _compact_page(stream_id, raw, epoch) if raw else None
    if fast is not None:
        return fast
    page, kept = Page(epoch=epoch), 0
    for entry_id, fields in raw:
        if limit is not None and kept >= limit:
            break
        entries = item_entries(stream_id, entry_id, fields, epoch)
        page.extend(entries)
        kept += sum(1 for entry in entries if entry.seq > after)
    return page


_BLOCK_KIND_BYTES: Final = tuple(kind.encode() for kind in BLOCK_KINDS)
_DELTA_KIND_BYTES: Final = tuple(kind.encode() for kind in DELTA_KINDS)
_json: Final = msgspec.json.Encoder()


def _compact_page(stream_id: str, raw: list[tuple[bytes, Any]], epoch: bytes) -> Page | None:
    """Parse a page of consecutive ``0-<seq>`` items all in field ``c``; ``None`` sends it the careful way.

    The usual page of a live or replayed stream: one loop, each delta's frame made in one
    format (the same bytes as :func:`schema.stored.delta_json` in :func:`_delta`); any
    other form goes through :func:`value_entries`. ``None`` when an id, a field or a kind
    code is not the usual one.
    """
    first, last = ours_seq(raw[0][0]), ours_seq(raw[-1][0])
    if first is None or last is None or last - first + 1 != len(raw):
        return None
    sid, suffix, decode = stream_id.encode(), b"." + epoch if epoch else b"", _stored_decoder.decode
    page = Page(epoch=epoch)
    for seq, (_entry_id, fields) in zip(range(first, last + 1), raw, strict=True):
        if len(fields) != 2 or fields[0] != STORED_FIELD:
            return None
        try:
            form = decode(fields[1])
            if type(form) is not DeltaForm:
                page.extend(value_entries(stream_id, seq, fields[1], epoch))
                continue
            kind = _BLOCK_KIND_BYTES[form.block_kind]
            frame = (b'id: %d%s\nevent: block.delta\ndata: {"type":"block.delta","stream_id":"%s","seq":%d,"ts":%d,'
                     b'"block":{"id":"b%d","index":%d,"kind":"%s"},"delta":{"kind":"%s","text":%s}}\n\n') % (
                seq, suffix, sid, seq, form.ts, form.index, form.index, kind, _DELTA_KIND_BYTES[form.delta_kind],
                _json.encode(form.text))
        except (msgspec.DecodeError, IndexError):
            return None
        page.append(Entry(seq=seq, type="block.delta", ts_ms=form.ts, block_index=form.index,
                          block_kind=BLOCK_KINDS[form.block_kind], visibility=None, frame=frame, epoch=epoch))
    return page


def _field_name(fields: dict[bytes, bytes] | list[bytes]) -> bytes | None:
    if isinstance(fields, dict):
        return next(iter(fields), None) if len(fields) == 1 else None
    return fields[0] if len(fields) == 2 else None


def stored_value(fields: dict[bytes, bytes] | list[bytes]) -> bytes | None:
    """Return field ``c`` (the compact form) of a parsed (map) or raw (flat list) entry, or ``None``."""
    if isinstance(fields, dict):
        return fields.get(STORED_FIELD)
    if len(fields) >= 2 and fields[0] == STORED_FIELD:
        return fields[1]
    return dict(zip(fields[::2], fields[1::2], strict=False)).get(STORED_FIELD)


def item_entries(stream_id: str, entry_id: bytes, fields: dict[bytes, bytes] | list[bytes],
                 epoch: bytes = b"") -> list[Entry]:
    """Return the entries one stored item holds: one, several for a compacted run, none for a foreign id."""
    seq = ours_seq(entry_id)
    if seq is None:
        if not ours(stream_id, entry_id):
            return []
        seq = seq_of(entry_id)
    value = stored_value(fields)
    if value is None:
        return [entry_of(seq, event_field(fields), epoch)]
    return value_entries(stream_id, seq, value, epoch)


def value_entries(stream_id: str, seq: int, value: bytes, epoch: bytes = b"") -> list[Entry]:
    """Return the entries of the compact value stored at entry ``0-<seq>`` (or heard live for ``seq``).

    A corrupt value (not one of :mod:`schema.stored`'s forms, a kind code out of range, a
    run whose seqs do not end at ``seq``) gives one ``invalid`` entry at ``seq``.
    """
    try:
        form = decode_stored(value)
        if isinstance(form, DeltaForm):
            data = delta_json(stream_id, seq, ts=form.ts, index=form.index, block_kind=BLOCK_KINDS[form.block_kind],
                              delta_kind=DELTA_KINDS[form.delta_kind], text=form.text)
            return [_delta(seq, form.ts, data, form, epoch)]
        if isinstance(form, RunForm | PackedRunForm):
            jsons = run_jsons(stream_id, form)
            if jsons[-1][0] != seq:
                raise ValueError("a compacted run that does not end at its entry's seq")
            return [_delta(at, ts, data, form, epoch) for at, ts, data in jsons]
        return [entry_of(seq, form_json(stream_id, seq, form), epoch)]
    except (msgspec.DecodeError, IndexError, ValueError) as exc:
        log.error("stream %s entry %s holds a stored value that does not decode (%s); it is not sent",
                  stream_id, seq, type(exc).__name__)
        return [invalid_entry(seq, epoch)]


def _delta(seq: int, ts: int, data: bytes, form: DeltaForm | RunForm | PackedRunForm, epoch: bytes) -> Entry:
    """Build the entry of one ``block.delta`` whose JSON was just made (no peek needed)."""
    suffix = b"." + epoch if epoch else b""
    return Entry(seq=seq, type="block.delta", ts_ms=ts, block_index=form.index,
                 block_kind=BLOCK_KINDS[form.block_kind], visibility=None,
                 frame=b"id: %d%s\nevent: block.delta\ndata: %s\n\n" % (seq, suffix, data), epoch=epoch)


def item_jsons(stream_id: str, entry_id: bytes, fields: dict[bytes, bytes] | list[bytes]) -> list[tuple[int, bytes]]:
    """Return ``(seq, event JSON)`` of each event one stored item holds (none for a foreign or corrupt item)."""
    return [(entry.seq, entry.frame.split(b"\ndata: ", 1)[1][:-2])
            for entry in item_entries(stream_id, entry_id, fields) if entry.frame]
