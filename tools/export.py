"""Analytics export: every finished stream, summary and events, through a consumer group on ``P:done``.

Each finished stream has one summary entry in ``P:done`` (:func:`worker.appender.summary_fields`).
The exporter is one consumer (:data:`CONSUMER`) of its own group on that stream (default
``export``), so several exports with different groups never meet. For each batch of
summaries it reads every stream's events (``XRANGE P:{id}:events``), writes the rows, makes
them durable (:meth:`Sink.commit`: flush and fsync), and only then acknowledges the batch (``XACK``):
at-least-once. After a crash, the next run first re-reads this consumer's pending entries
(``XREADGROUP ... 0``), so nothing acknowledged was lost and nothing written twice goes
unnoticed: every row names its ``stream_id`` (and ``seq`` for an event), so a repeat is
detectable. Rows (one JSON object per NDJSON line):

* ``{"kind": "summary", "stream_id", "summary_id", "provider", "model", "status", ...,
  "events", "events_stored"}``: the summary's fields, counters as integers;
* ``{"kind": "event", "stream_id", "seq", "event": <the event JSON>}``: as stored in the JSON
  form, or rebuilt byte for byte from the compact form (:mod:`schema.stored`), one row per
  event of a compacted run;
* ``{"kind": "expired", "stream_id", "events", "events_stored", "detail"}`` when the
  stream's events were gone (``FANOUT_STREAM_TTL_S``) or incomplete at export time;
* ``{"kind": "regenerated", "stream_id", "epoch", "stored_epoch", "detail"}`` when the events
  stored now belong to another generation than the summary's (``epoch``, contract 1.1: Redis
  restored from an older snapshot ran the job again): that generation's events are gone, and
  the ones stored are not exported with this summary (their own summary, if they finish,
  carries their epoch).

Follows the Redis pages of XGROUP CREATE, XREADGROUP, XACK and XRANGE.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Final, Protocol

import msgspec
import redis.exceptions

from infra.redis_client import REDIS_ERRORS, RedisClient
from schema.keys import EVENT_FIELD, Keys
from schema.stored import STORED_FIELD
from schema.stored_entries import value_jsons

log = logging.getLogger("fanout.export")

CONSUMER: Final = "exporter"
"""Consumer name inside the export's group: one export process per group at a time."""
INT_FIELDS: Final = frozenset({"input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens", "events",
                               "ttfd_ms", "duration_ms", "ended_ms"})
"""Summary fields exported as integers (``null`` when empty)."""
FOLLOW_BLOCK_MS: Final = 2000
"""``--follow``: how long one ``XREADGROUP BLOCK`` waits for a summary, ms (below the client's read timeout)."""
EVENT_PAGE: Final = 1000
"""Entries per ``XRANGE`` page of a stream's events."""

Row = dict[str, Any]
"""One exported row; ``event`` rows hold the stored JSON as ``msgspec.Raw``."""


def _event_rows(stream_id: str, seq: int, fields: dict[bytes, bytes]) -> list[Row]:
    """Return the ``event`` rows of one stored entry: its JSON form as stored, or the JSONs its compact form gives."""
    if EVENT_FIELD in fields:
        return [{"kind": "event", "stream_id": stream_id, "seq": seq, "event": msgspec.Raw(fields[EVENT_FIELD])}]
    if STORED_FIELD in fields:
        return [{"kind": "event", "stream_id": stream_id, "seq": at, "event": msgspec.Raw(data)}
                for at, data in value_jsons(stream_id, seq, fields[STORED_FIELD])]
    return []


class Sink(Protocol):
    """Where rows go: written in order, durable once :meth:`commit` returns."""

    def write(self, rows: list[Row]) -> None:
        """Buffer or write ``rows``."""

    def commit(self) -> None:
        """Make every row written so far durable (called before the batch is acknowledged)."""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def summary_row(entry_id: str, fields: dict[bytes, bytes]) -> Row:
    """Return the ``summary`` row of one ``P:done`` entry (integers parsed, empty values ``None``)."""
    row: Row = {"kind": "summary", "summary_id": entry_id}
    for raw_name, raw_value in fields.items():
        name, value = _text(raw_name), _text(raw_value)
        if value == "":
            row[name] = None
        elif name in INT_FIELDS:
            row[name] = int(value) if value.lstrip("-").isdigit() else None
        else:
            row[name] = value
    return row


_REGENERATED: Final = ("the stream was written again as another generation (Redis restored from an older "
                       "snapshot?); the events of this summary's generation are gone")


class _StartEpoch(msgspec.Struct):
    type: str = ""
    epoch: str | None = None


def _start_epoch(events: list[Row]) -> str | None:
    """Return the ``epoch`` of the stored ``stream.start`` (seq 1), or ``None`` (absent, unreadable, or no seq 1)."""
    if not events or events[0]["seq"] != 1:
        return None
    try:
        start = msgspec.json.decode(bytes(events[0]["event"]), type=_StartEpoch)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return start.epoch if start.type == "stream.start" else None


def entry_ms(entry_id: str) -> int:
    """Return the millisecond part of a Redis stream entry id (``<ms>-<n>``)."""
    return int(entry_id.partition("-")[0])


class Exporter:
    """Reads finished streams for one group and hands their rows to a sink.

    Args:
        redis: asyncio client (``decode_responses`` off); any topology.
        keys: Key layout of the deployment.
        sink: Where rows go.
        group: Consumer group on ``P:done``.
        since_ms: Only streams whose summary was written at or after this time (ms since epoch).
        batch: Summaries per read.
        on_progress: Called with the number of summaries handled after each batch.
    """

    def __init__(self, redis: RedisClient, keys: Keys, sink: Sink, *, group: str = "export", since_ms: int = 0,
                 batch: int = 100, on_progress: Callable[[int], None] | None = None) -> None:
        self.redis, self.keys, self.sink = redis, keys, sink
        self.group, self.since_ms, self.batch = group, since_ms, batch
        self.on_progress = on_progress or (lambda _n: None)
        self.exported = 0
        """Summaries handled (exported or skipped by ``since``) in this run."""

    async def ensure_group(self) -> None:
        """Create the group on ``P:done`` (and the stream) if missing, starting at ``since``."""
        start = f"{max(0, self.since_ms - 1)}-0" if self.since_ms else "0"
        try:
            await self.redis.xgroup_create(self.keys.done, self.group, id=start, mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def lag(self) -> int | None:
        """Return how many summaries the group has not read yet (``None`` when Redis cannot say)."""
        with contextlib.suppress(*REDIS_ERRORS, KeyError, TypeError, ValueError):
            for info in await self.redis.xinfo_groups(self.keys.done):
                if _text(info["name"]) == self.group and info.get("lag") is not None:
                    return int(info["lag"]) + int(info.get("pending", 0))
        return None

    async def run(self, *, follow: bool = False, block_ms: int = FOLLOW_BLOCK_MS,
                  stop: asyncio.Event | None = None) -> int:
        """Export until caught up (or, with ``follow``, until ``stop`` is set); return summaries handled.

        Raises:
            redis.exceptions.RedisError: Redis failed; rows already committed stay acknowledged
                or pending, and a rerun goes on from there.
            OSError: The sink could not be written; the batch stays pending.
        """
        await self.ensure_group()
        await self._drain("0")  # this consumer's pending entries: a crashed run's last batch
        while True:
            handled = await self._drain(">", block_ms=block_ms if follow else None)
            if handled == 0 and (not follow or (stop is not None and stop.is_set())):
                return self.exported

    async def _drain(self, position: str, block_ms: int | None = None) -> int:
        """Read and export batches from ``position`` until a read returns nothing; return entries handled."""
        handled = 0
        while True:
            reply: Any = await self.redis.xreadgroup(self.group, CONSUMER, {self.keys.done: position},
                                                     count=self.batch, block=block_ms)
            entries = [(_text(i), f) for _stream, items in reply or [] for i, f in items]
            if not entries:
                return handled
            await self._export(entries)
            handled += len(entries)
            if block_ms is not None:
                return handled

    async def _export(self, entries: list[tuple[str, dict[bytes, bytes] | None]]) -> None:
        rows: list[Row] = []
        for entry_id, fields in entries:
            if not fields:
                log.warning("event=summary_trimmed entry_id=%s action=ack", entry_id)  # capped away while pending
                continue
            if entry_ms(entry_id) < self.since_ms:
                continue
            rows += await self._stream_rows(summary_row(entry_id, fields))
        self.sink.write(rows)
        self.sink.commit()
        await self.redis.xack(self.keys.done, self.group, *[entry_id for entry_id, _f in entries])
        self.exported += len(entries)
        self.on_progress(len(entries))

    async def _stream_rows(self, summary: Row) -> list[Row]:
        stream_id = str(summary.get("stream_id") or "")
        events = await self._events(stream_id) if stream_id else []
        stored_epoch = _start_epoch(events)
        if summary.get("epoch") and stored_epoch != summary["epoch"] and events:
            summary["events_stored"] = 0
            return [summary, {"kind": "regenerated", "stream_id": stream_id, "epoch": summary["epoch"],
                              "stored_epoch": stored_epoch, "detail": _REGENERATED}]
        summary["events_stored"] = len(events)
        rows: list[Row] = [summary, *events]
        expected = summary.get("events")
        if expected is None or len(events) < expected:
            detail = ("the stream's events expired before the export (FANOUT_STREAM_TTL_S)" if not events
                      else "some of the stream's events were no longer stored")
            rows.append({"kind": "expired", "stream_id": stream_id, "events": expected,
                         "events_stored": len(events), "detail": detail})
        return rows

    async def _events(self, stream_id: str) -> list[Row]:
        rows: list[Row] = []
        start = "-"
        while True:
            page: Any = await self.redis.xrange(self.keys.events(stream_id), start, "+", count=EVENT_PAGE)
            for entry_id, fields in page:
                head, _, seq = _text(entry_id).partition("-")
                if head == "0" and seq.isdigit():
                    rows.extend(_event_rows(stream_id, int(seq), fields))
            if len(page) < EVENT_PAGE:
                return rows
            start = "(" + _text(page[-1][0])
