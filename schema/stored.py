"""The stored form of a contract event: what one Redis stream entry holds, and the exact JSON it gives back.

Each event of stream ``<id>`` is one entry ``0-<seq>`` of ``P:{<id>}:events``
(:mod:`schema.keys`). The key already names the stream and the entry id already says the
seq, so the compact form (field ``c``, since contract 1.1's storage revision) holds
neither, and no field name is repeated per event: every entry has the one field ``c``, so
Redis stores the name once per listpack node (an entry whose fields equal the node's
master entry's is stored with values only; Redis "Streams" internals). The value is
MessagePack (msgspec), an array whose first element says its form:

=====  ==============================================  ==================================
tag    array                                           holds
=====  ==============================================  ==================================
``0``  ``[0, ts, index, block_kind, delta_kind, text]``  a ``block.delta`` whose block id
                                                       is ``b<index>`` (the contract's
                                                       rule); the kinds as small ints
                                                       (:data:`BLOCK_KINDS`,
                                                       :data:`DELTA_KINDS`)
``1``  ``[1, type, tail]``                             any other event: its JSON after
                                                       ``"seq":<seq>,`` (``tail``, bytes)
``2``  ``[2, json]``                                   the whole JSON, for an event whose
                                                       JSON does not start with the
                                                       envelope in contract order (none
                                                       today; kept so any event stores)
``3``  ``[3, first_seq, ts, index, block_kind,         a compacted run of ``block.delta``
       delta_kind, text, lengths, ts_steps]``           events of one block (``first_seq``
                                                       ..  the entry's own seq), written
                                                       after the stream ended
                                                       (:class:`RunForm`)
``4``  ``[4, first_seq, ts, index, block_kind,         the same run with ``[text, lengths,
       delta_kind, packed]``                           ts_steps]`` as zlib-compressed
                                                       MessagePack (:class:`PackedRunForm`),
                                                       written when that is smaller; at
                                                       most :data:`MAX_RUN_BYTES` unpacked
=====  ==============================================  ==================================

:func:`event_json` rebuilds the event's JSON byte for byte as ``encode_event`` gives it
(``{"type":..,"stream_id":..,"seq":..,"ts":..,...}``, the contract Structs' field order),
so an SSE frame is the same whichever form a stream is stored in. The older form (field
``e`` = the event JSON, :data:`schema.keys.EVENT_FIELD`) is still read: streams stored
before an upgrade live until their TTL, and a stream may hold both forms when a newer
worker continued it.

Sizes (``bench/storage_bench.py``): a live delta of ``n`` UTF-8 bytes stores
``15 + n`` bytes of value (9 of them the ms timestamp); the JSON form stored about 130
+ ``n`` plus the stream id. Pure: msgspec and the standard library only.
"""

from __future__ import annotations

import zlib
from typing import Final

import msgspec

from schema.contract import BlockDelta, Event, encode_event

STORED_FIELD: Final = b"c"
"""Field of an events-stream entry that holds the compact stored form (this module)."""

BLOCK_KINDS: Final = ("text", "reasoning", "tool_call", "refusal")
"""Block kinds by their stored code (the position)."""
DELTA_KINDS: Final = ("text", "json_text", "signature")
"""Delta kinds by their stored code (the position)."""
_BLOCK_CODES: Final = {kind: code for code, kind in enumerate(BLOCK_KINDS)}
_DELTA_CODES: Final = {kind: code for code, kind in enumerate(DELTA_KINDS)}


class DeltaForm(msgspec.Struct, array_like=True, frozen=True, gc=False, tag_field="form", tag=0):
    """Tag ``0``: one ``block.delta`` of block ``b<index>``."""

    ts: int
    """The event's ``ts``, ms since the Unix epoch."""
    index: int
    """``block.index``; the block id is ``b<index>``."""
    block_kind: int
    """Position of ``block.kind`` in :data:`BLOCK_KINDS`."""
    delta_kind: int
    """Position of ``delta.kind`` in :data:`DELTA_KINDS`."""
    text: str
    """``delta.text``."""


class TailForm(msgspec.Struct, array_like=True, frozen=True, gc=False, tag_field="form", tag=1):
    """Tag ``1``: any event, as its type and the JSON that follows ``"seq":<seq>,``."""

    type: str
    """The contract type (``stream.start``, ...)."""
    tail: bytes
    """The event's JSON from ``"ts":`` to its closing brace."""


class JsonForm(msgspec.Struct, array_like=True, frozen=True, gc=False, tag_field="form", tag=2):
    """Tag ``2``: the whole event JSON."""

    json: bytes
    """The event's JSON, one line."""


class RunForm(msgspec.Struct, array_like=True, frozen=True, gc=False, tag_field="form", tag=3):
    """Tag ``3``: consecutive ``block.delta`` events of one block, compacted; the entry id is the last one's seq."""

    first_seq: int
    """Seq of the run's first delta; the entry's own id ``0-<seq>`` is the last one's."""
    ts: int
    """``ts`` of the first delta, ms since the Unix epoch."""
    index: int
    """``block.index``; the block id is ``b<index>``."""
    block_kind: int
    """Position of ``block.kind`` in :data:`BLOCK_KINDS`."""
    delta_kind: int
    """Position of ``delta.kind`` in :data:`DELTA_KINDS`."""
    text: str
    """The deltas' texts joined."""
    lengths: list[int]
    """Each delta's length in code points (Python ``str`` slicing), in order; sums to ``len(text)``."""
    ts_steps: list[int]
    """``ts`` of delta ``i + 1`` minus that of delta ``i`` (may be negative); one fewer than ``lengths``."""


class PackedRunForm(msgspec.Struct, array_like=True, frozen=True, gc=False, tag_field="form", tag=4):
    """Tag ``4``: a :class:`RunForm` whose text, lengths and ts steps are compressed (zlib, RFC 1950)."""

    first_seq: int
    """Seq of the run's first delta."""
    ts: int
    """``ts`` of the first delta, ms since the Unix epoch."""
    index: int
    """``block.index``; the block id is ``b<index>``."""
    block_kind: int
    """Position of ``block.kind`` in :data:`BLOCK_KINDS`."""
    delta_kind: int
    """Position of ``delta.kind`` in :data:`DELTA_KINDS`."""
    packed: bytes
    """zlib of the MessagePack array ``[text, lengths, ts_steps]`` (:class:`RunForm`'s fields)."""


MAX_RUN_BYTES: Final = 16 * 1024 * 1024
"""Most bytes a :class:`PackedRunForm` may unpack to; a larger one is corrupt (never a bomb)."""

StoredForm = DeltaForm | TailForm | JsonForm | RunForm | PackedRunForm
"""Any decoded stored value."""

_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(StoredForm)
_json: Final = msgspec.json.Encoder()


def encode_stored(event: Event) -> bytes:
    """Return the compact stored value of one event (the module table's tag 0, 1 or 2).

    Args:
        event: A contract event; its ``stream_id`` and ``seq`` are not stored (the key and
            the entry id say them).

    Returns:
        MessagePack bytes; :func:`event_json` with the same stream id and seq gives back
        exactly ``encode_event(event)``.
    """
    if isinstance(event, BlockDelta):
        block, delta = event.block, event.delta
        bk, dk = _BLOCK_CODES.get(block.kind), _DELTA_CODES.get(delta.kind)
        if bk is not None and dk is not None and block.id == f"b{block.index}":
            return _encoder.encode(DeltaForm(event.ts, block.index, bk, dk, delta.text))
    data = encode_event(event)
    kind = _type_of(event)
    head = _head(kind, event.stream_id, event.seq)
    if data.startswith(head):
        return _encoder.encode(TailForm(kind, data[len(head):]))
    return _encoder.encode(JsonForm(data))


def _type_of(event: Event) -> str:
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def _head(kind: str, stream_id: str, seq: int) -> bytes:
    return b'{"type":"%s","stream_id":"%s","seq":%d,' % (kind.encode(), stream_id.encode(), seq)


def decode_stored(value: bytes) -> StoredForm:
    """Decode one stored value.

    Raises:
        msgspec.DecodeError: Not MessagePack, or not one of the module table's forms
            (``msgspec.ValidationError`` is a subclass): a corrupt or foreign entry.
    """
    return _decoder.decode(value)


def delta_json(stream_id: str, seq: int, *, ts: int, index: int, block_kind: str, delta_kind: str, text: str) -> bytes:
    """Return the JSON of one ``block.delta`` of block ``b<index>``, as ``encode_event`` writes it.

    ``stream_id`` matches the contract's pattern (no character JSON would escape);
    ``block_kind`` and ``delta_kind`` are contract kinds.
    """
    return b'{"type":"block.delta","stream_id":"%s","seq":%d,"ts":%d,"block":{"id":"b%d","index":%d,"kind":"%s"},' \
           b'"delta":{"kind":"%s","text":%s}}' % (stream_id.encode(), seq, ts, index, index, block_kind.encode(),
                                                 delta_kind.encode(), _json.encode(text))


def form_json(stream_id: str, seq: int, form: DeltaForm | TailForm | JsonForm) -> bytes:
    """Return the JSON of the event ``seq`` of ``stream_id`` stored as ``form`` (not a :class:`RunForm`).

    Raises:
        IndexError: A kind code outside :data:`BLOCK_KINDS` / :data:`DELTA_KINDS` (corrupt).
    """
    if isinstance(form, DeltaForm):
        return delta_json(stream_id, seq, ts=form.ts, index=form.index, block_kind=BLOCK_KINDS[form.block_kind],
                          delta_kind=DELTA_KINDS[form.delta_kind], text=form.text)
    if isinstance(form, TailForm):
        return _head(form.type, stream_id, seq) + form.tail
    return form.json


_packed: Final = msgspec.msgpack.Decoder(tuple[str, list[int], list[int]])


def pack_run(run: RunForm) -> RunForm | PackedRunForm:
    """Return ``run`` as a :class:`PackedRunForm` when that stores fewer bytes, else ``run`` itself."""
    packed = zlib.compress(_encoder.encode((run.text, run.lengths, run.ts_steps)), 6)
    if len(packed) >= len(run.text.encode()) + len(run.lengths) + len(run.ts_steps):
        return run
    return PackedRunForm(run.first_seq, run.ts, run.index, run.block_kind, run.delta_kind, packed)


def unpack_run(run: RunForm | PackedRunForm) -> RunForm:
    """Return the :class:`RunForm` a packed run holds (``run`` itself when not packed).

    Raises:
        ValueError: Not zlib, past :data:`MAX_RUN_BYTES`, or not ``[text, lengths, ts_steps]`` (corrupt).
    """
    if isinstance(run, RunForm):
        return run
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(run.packed, MAX_RUN_BYTES)
        if inflater.unconsumed_tail or not inflater.eof:
            raise ValueError("a packed run that is truncated or larger than MAX_RUN_BYTES")
        text, lengths, steps = _packed.decode(raw)
    except (zlib.error, msgspec.DecodeError) as exc:
        raise ValueError("a packed run that does not unpack") from exc
    return RunForm(run.first_seq, run.ts, run.index, run.block_kind, run.delta_kind, text, lengths, steps)


def run_jsons(stream_id: str, packed_or_run: RunForm | PackedRunForm) -> list[tuple[int, int, bytes]]:
    """Return ``(seq, ts, JSON)`` of every delta a run holds (packed or not), in seq order.

    Raises:
        ValueError: ``lengths`` and ``ts_steps`` disagree with ``text``, or a packed run does
            not unpack (corrupt).
        IndexError: A kind code out of range (corrupt).
    """
    run = unpack_run(packed_or_run)
    lengths = run.lengths
    if sum(lengths) != len(run.text) or len(run.ts_steps) != len(lengths) - 1 or min(lengths, default=0) < 1:
        raise ValueError("a compacted run whose lengths do not cover its text")
    bk, dk = BLOCK_KINDS[run.block_kind], DELTA_KINDS[run.delta_kind]
    out: list[tuple[int, int, bytes]] = []
    at, ts = 0, run.ts
    for offset, length in enumerate(run.lengths):
        if offset:
            ts += run.ts_steps[offset - 1]
        seq = run.first_seq + offset
        out.append((seq, ts, delta_json(stream_id, seq, ts=ts, index=run.index, block_kind=bk, delta_kind=dk,
                                        text=run.text[at:at + length])))
        at += length
    return out


def event_json(stream_id: str, seq: int, value: bytes) -> bytes | None:
    """Return the JSON of event ``seq`` stored as ``value`` (tags 0 to 2), or ``None`` when it is corrupt.

    A run (:class:`RunForm`, :class:`PackedRunForm`) holds many events: it answers ``None`` here; use
    :func:`decode_stored` and :func:`run_jsons`.
    """
    try:
        form = _decoder.decode(value)
        return None if isinstance(form, RunForm | PackedRunForm) else form_json(stream_id, seq, form)
    except (msgspec.DecodeError, IndexError):
        return None

