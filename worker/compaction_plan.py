"""The compacted form of one finished stream, planned from its stored entries: pure, lossless, or refused.

:func:`plan` turns the entries of a stream that ended (``XRANGE`` of its events, either
stored form) into the entries that replace them: every run of consecutive ``block.delta``
events of one block (same index and kinds, block id ``b<index>``, at most ``run_deltas``)
becomes one :class:`schema.stored.RunForm` entry whose id is the run's last seq (its text,
each delta's length and ts step; zlib-compressed, :class:`schema.stored.PackedRunForm`,
when that is smaller); every other event keeps its own entry, in the compact
form; the terminal event stays as it is. Before it answers, the plan is expanded again and
compared with the original JSONs, so a plan that would not give back every event byte for
byte is never written. Anything it cannot prove (a hole in the seqs, an id of another
shape, a value that does not decode, a type this version does not know, a stream that does
not end with its terminal event, one already compacted) is refused with the reason, and
the stream is left as it is. Imports no asyncio or redis.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Final

import msgspec

from schema.contract import BlockDelta, Event, decode_event, encode_event, is_terminal
from schema.errors import InternalError
from schema.stored import BLOCK_KINDS, DELTA_KINDS, RunForm, encode_stored, pack_run
from schema.stored_entries import entry_jsons, value_jsons

_encoder: Final = msgspec.msgpack.Encoder()


class PlanRefusedError(InternalError):
    """The stream's entries cannot be compacted losslessly; the message says why (user-safe, no content)."""


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """What replaces a finished stream's entries."""

    entries: list[tuple[int, bytes]]
    """``(seq, compact value)`` in seq order: the new entries ``0-<seq>``."""
    events: int
    """How many events the original entries held (their count: one per entry)."""
    last_seq: int
    """Seq of the terminal event."""


def _events(stream_id: str, raw: Iterable[tuple[bytes | str, Mapping[bytes, bytes]]]) -> list[tuple[Event, bytes]]:
    out: list[tuple[Event, bytes]] = []
    for entry_id, fields in raw:
        try:
            jsons = entry_jsons(stream_id, entry_id, fields)
        except ValueError:
            raise PlanRefusedError("an entry id that is not 0-<seq>") from None
        if len(jsons) != 1:
            raise PlanRefusedError("an entry without exactly one event (corrupt, or compacted already)")
        (seq, data), = jsons
        if seq != len(out) + 1:
            raise PlanRefusedError(f"seq {seq} where {len(out) + 1} was expected (a hole)")
        try:
            event = decode_event(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise PlanRefusedError(f"seq {seq} does not decode as a contract event") from None
        if event is None or encode_event(event) != data or event.seq != seq or event.stream_id != stream_id:
            raise PlanRefusedError(f"seq {seq} is not an event this version writes back exactly")
        out.append((event, data))
    if not out or not is_terminal(out[-1][0]):
        raise PlanRefusedError("the stream does not end with its terminal event")
    return out


def _runnable(event: Event) -> tuple[int, int, int] | None:
    """``(index, block kind code, delta kind code)`` of a delta a run may hold, else ``None``."""
    if not isinstance(event, BlockDelta) or event.block.id != f"b{event.block.index}":
        return None
    if event.block.kind not in BLOCK_KINDS or event.delta.kind not in DELTA_KINDS:
        return None
    return event.block.index, BLOCK_KINDS.index(event.block.kind), DELTA_KINDS.index(event.delta.kind)


def _run_value(run: list[BlockDelta], key: tuple[int, int, int]) -> tuple[int, bytes]:
    if len(run) == 1:
        return run[0].seq, encode_stored(run[0])
    form = RunForm(first_seq=run[0].seq, ts=run[0].ts, index=key[0], block_kind=key[1], delta_kind=key[2],
                   text="".join(d.delta.text for d in run), lengths=[len(d.delta.text) for d in run],
                   ts_steps=[b.ts - a.ts for a, b in itertools.pairwise(run)])
    return run[-1].seq, _encoder.encode(pack_run(form))


def plan(stream_id: str, raw: Iterable[tuple[bytes | str, Mapping[bytes, bytes]]], *, run_deltas: int) -> Plan:
    """Plan the compaction of one finished stream.

    Args:
        stream_id: The stream (its key names it).
        raw: Every entry of its events key, in id order, fields as maps (``c`` or ``e``).
        run_deltas: Most deltas in one run (``FANOUT_COMPACT_RUN_DELTAS``): bounds what a
            reader expands for one entry.

    Returns:
        The plan; expanding its entries gives every original JSON, checked here.

    Raises:
        PlanRefusedError: The stream cannot be compacted losslessly (the message says why).
    """
    events = _events(stream_id, raw)
    entries: list[tuple[int, bytes]] = []
    run: list[BlockDelta] = []
    key: tuple[int, int, int] | None = None
    for event, _data in events:
        this = _runnable(event)
        if run and (this != key or len(run) >= run_deltas):
            entries.append(_run_value(run, key))  # type: ignore[arg-type]
            run = []
        if this is not None and isinstance(event, BlockDelta):
            run.append(event)
            key = this
        else:
            entries.append((event.seq, encode_stored(event)))
    expanded = [data for seq, value in entries for _seq, data in value_jsons(stream_id, seq, value)]
    if expanded != [data for _event, data in events]:
        raise PlanRefusedError("the compacted form would not give back every event exactly")
    return Plan(entries=entries, events=len(events), last_seq=events[-1][0].seq)
