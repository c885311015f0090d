"""The status route's assembled results: assembled once per stream, shared by concurrent requests, kept.

A result is the reducer's (schema.reducer) over the stored events a projection may see.
It is kept per (stream id, projection, meta ``epoch``, meta ``created_ms``), so a stream
whose history was reset (a new epoch) or a new stream under an old id never gets the
old one. A request whose stored top (``StreamInfo.last_seq``, read before any event) is
covered by the kept result is answered from it without reading an event; otherwise the
events stored since the kept result's last seq are read and applied (the whole stream
only the first time), under the assembly's lock, so concurrent requests wait for one
read and take its result; a finished stream's result is final and its reducer state let
go. The results kept are bounded by ``FANOUT_STATUS_CACHE_BYTES`` (least recently read
first out; an estimate of their memory), and reads of stored events by
``FANOUT_STATUS_ASSEMBLIES`` at once in the process. So a request's work is one meta
read plus the events stored since the last request of its stream, not the whole stream.

Follows the Redis page of XRANGE (through :meth:`publisher.history.store.Store.read_json`).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import TYPE_CHECKING, Final

import msgspec

from schema.contract import BlockDelta, BlockStart, BlockStop, Event, decode_event
from schema.reducer import Assembler

if TYPE_CHECKING:
    from publisher.history.store import Store, StreamInfo
    from publisher.history.visibility import Scope
    from publisher.telemetry import Telemetry

EVENT_BYTES: Final = 96
"""Estimated memory of one applied event in a running stream's reducer state (a delta's
string and its list slot), bytes; a finished stream keeps only its result's JSON."""
ENTRY_BYTES: Final = 512
"""Estimated fixed memory of one kept result (its objects, the key), bytes."""

Key = tuple[str, str, str, str]


class Snapshot(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One assembled result, as the status route answers it."""

    body: bytes
    """The result as JSON (the reducer's ``AssembledResult``, every field present)."""
    status: str
    """The result's ``status`` (``running`` until a terminal event)."""
    whole: bool
    """The events read ran 1, 2, ... without a hole."""
    read_seq: int
    """The last seq read (0: none)."""
    ts_ms: int = 0
    """``ts`` of the last event the result includes, ms since the Unix epoch (0: none)."""
    endpoint: str | None = None
    """The result's ``endpoint``: the upstreams-file endpoint that answered (contract 1.1), if any."""


class _Assembly:
    """One stream's result for one projection, advanced as its stored events grow."""

    __slots__ = ("applied", "assembler", "counted", "internal", "lock", "read_seq", "scope", "size", "snapshot",
                 "stream_id", "ts_ms", "whole")

    def __init__(self, stream_id: str, scope: Scope) -> None:
        self.stream_id, self.scope = stream_id, scope
        self.assembler: Assembler | None = Assembler(stream_id)
        self.internal: set[int] = set()
        self.lock = asyncio.Lock()
        self.read_seq, self.whole, self.applied, self.ts_ms = 0, True, 0, 0
        self.size, self.counted = ENTRY_BYTES, 0
        """Estimated memory, bytes; and how much of it the cache's total counts (0 once let go)."""
        self.snapshot: Snapshot | None = None

    def covers(self, top_seq: int) -> bool:
        """Return True when the kept result holds every event up to ``top_seq`` (or is final)."""
        snapshot = self.snapshot
        return snapshot is not None and (self.assembler is None or snapshot.read_seq >= top_seq)

    def apply(self, seq: int, data: bytes) -> None:
        """Fold one stored event (``seq``, its JSON) into the result, if the projection may see it."""
        assert self.assembler is not None
        self.whole = self.whole and seq == self.read_seq + 1
        self.read_seq = seq
        try:
            event = decode_event(data)
        except (msgspec.DecodeError, RecursionError):  # not an event, or nested past the decoder's limit
            return
        if event is not None and visible(event, self.scope, self.internal):
            self.assembler.apply(event)
            self.applied += 1
            self.ts_ms = event.ts

    def seal(self) -> None:
        """Take the result of every event applied so far; a finished one lets its reducer state go."""
        assert self.assembler is not None
        result = self.assembler.result()
        body = msgspec.json.encode(result)
        self.snapshot = Snapshot(body=body, status=result.status, whole=self.whole, read_seq=self.read_seq,
                                 ts_ms=self.ts_ms, endpoint=result.endpoint)
        if result.status != "running":
            self.assembler = None
        self.size = ENTRY_BYTES + len(body) + (self.applied * EVENT_BYTES if self.assembler is not None else 0)


def visible(event: Event, scope: Scope, internal: set[int]) -> bool:
    """Return whether ``scope`` sees ``event``; ``internal`` collects the indexes of internal reasoning blocks."""
    if scope == "internal":
        return True
    if isinstance(event, BlockStart) and event.block.kind == "reasoning" and event.visibility == "internal":
        internal.add(event.block.index)
    if isinstance(event, BlockStart | BlockDelta | BlockStop):
        return event.block.index not in internal
    return True


class StatusCache:
    """Assembled results of the status route, bounded in bytes.

    Args:
        store: Stored-entry reads.
        telemetry: Counts assemblies (``status_assemblies``) and the bytes kept.
        max_bytes: ``FANOUT_STATUS_CACHE_BYTES``.
        max_reads: ``FANOUT_STATUS_ASSEMBLIES``.
    """

    def __init__(self, store: Store, telemetry: Telemetry, max_bytes: int, max_reads: int) -> None:
        self._store, self._telemetry = store, telemetry
        self._max_bytes = max_bytes
        self._reads = asyncio.Semaphore(max_reads)
        self._kept: OrderedDict[Key, _Assembly] = OrderedDict()
        self.bytes = 0
        """Estimated memory of the results kept, bytes."""
        self.waiting = 0
        """Assemblies waiting for a turn to read (``FANOUT_STATUS_ASSEMBLIES`` are reading)."""

    async def snapshot(self, stream_id: str, scope: Scope, info: StreamInfo) -> Snapshot:
        """Return the result of ``stream_id`` for ``scope`` holding at least every event up to ``info.last_seq``.

        Args:
            stream_id: A stream that exists (``info.known``).
            scope: The projection.
            info: The stream's meta and stored top, read by this request before any event.

        Raises:
            RedisError: Reading the events failed (nothing is kept of a partial read but the
                events applied, which the next request goes on from).
            HistoryChangedError: The stream was written again as another generation than
                ``info``'s while it was read (the caller reads ``info`` again).
        """
        key: Key = (stream_id, scope, info.meta.get("epoch", ""), info.meta.get("created_ms", ""))
        assembly = self._kept.get(key)
        if assembly is None:
            assembly = self._kept[key] = _Assembly(stream_id, scope)
            self._resize(key, assembly)
        else:
            self._kept.move_to_end(key)
        if not assembly.covers(info.last_seq):
            async with assembly.lock:
                if not assembly.covers(info.last_seq):
                    await self._advance(assembly, info.epoch)
                    self._resize(key, assembly)
        assert assembly.snapshot is not None
        return assembly.snapshot

    async def _advance(self, assembly: _Assembly, epoch: str) -> None:
        """Read the events of generation ``epoch`` stored after the assembly's last seq, apply them, take the result.

        Raises:
            HistoryChangedError: The stream holds another generation now (nothing of it is applied).
        """
        self.waiting += 1
        try:
            await self._reads.acquire()
        finally:
            self.waiting -= 1
        try:
            full = assembly.read_seq == 0
            async for seq, data in self._store.read_json(assembly.stream_id, epoch, assembly.read_seq):
                assembly.apply(seq, data)
            assembly.seal()
        finally:
            self._reads.release()
        self._telemetry.status_assemblies["full" if full else "incremental"] += 1

    def _resize(self, key: Key, assembly: _Assembly) -> None:
        """Account the assembly's new size, then let the least recently read results go past the bound."""
        if self._kept.get(key) is assembly:
            self.bytes += assembly.size - assembly.counted
            assembly.counted = assembly.size
        while self.bytes > self._max_bytes and self._kept:
            _, oldest = self._kept.popitem(last=False)
            self.bytes -= oldest.counted
            oldest.counted = 0
        self._telemetry.status_cache_bytes = self.bytes
