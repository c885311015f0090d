r"""The live channel's notification payload: what one append publishes, parsed. Pure.

The append script (``worker.appender.APPEND_LUA``) publishes one message per batch on the
stream's live channel (``P:{<id>}:live``), in one of two shapes:

=========================================  ==================================================
payload                                    meaning
=========================================  ==================================================
``<last>``                                 seq-only: the batch ended at seq ``last``; read
                                           it from the stream (a batch over
                                           ``FANOUT_LIVE_MAX_BYTES``, or a worker older
                                           than this format)
``<last> <first> <epoch>``                 seq-only, of generation ``epoch`` (contract 1.1)
``<last> <first>\n<e1>\n...``              full: the batch's ``last - first + 1`` event
                                           JSONs, one per line, seq ``first`` .. ``last``,
                                           exactly as stored in field ``e`` of entries
                                           ``0-<seq>``
``<last> <first> <epoch>\n<e1>\n...``      full, of generation ``epoch``
``<last> <first> <epoch> c\n<n1>:<v1>...``  full, compact: each event's stored value
                                           (:mod:`schema.stored`, field ``c``) after its
                                           length in bytes and a colon; ``<epoch>`` may be
                                           empty (a stream started before contract 1.1)
=========================================  ==================================================

The first token is always the last stored seq, so a reader of the older seq-only format
that fails to parse a full payload still knows to read (a publisher older than epochs
reads every three-token payload: it treats it as seq-only). Stored event JSON is compact
(``msgspec``), so it never holds a raw line break; a payload whose line count does not
match its seqs is treated as seq-only. The epoch is the writer's (meta ``epoch``): a hub
that hears another epoch than the one its readers hold knows the stream was written
again as a new generation (:meth:`publisher.live.topic.Topic.notified`). Imports no asyncio,
aiohttp or redis.
"""

from __future__ import annotations

import msgspec


class Notification(msgspec.Struct, frozen=True, kw_only=True):
    """One parsed live-channel message."""

    last_seq: int
    """The batch's last stored seq (the stream's new top)."""
    first_seq: int
    """The batch's first seq; equals ``last_seq + 1`` - ``len(events)`` when events are carried."""
    events: list[bytes] | None
    """The stored events in seq order (JSONs, or compact values when :attr:`compact`), or ``None``
    for a seq-only notification."""
    epoch: bytes | None = None
    """The generation the batch belongs to; ``None`` when the writer sent none (before contract 1.1)."""
    compact: bool = False
    """:attr:`events` are compact stored values (:mod:`schema.stored`), not JSONs."""


def parse_notification(data: bytes) -> Notification | None:
    """Parse one live-channel payload.

    Args:
        data: The message's bytes, either shape of the module table.

    Returns:
        The notification; a full payload whose line count disagrees with its seqs is
        returned seq-only (the hub then reads the stream). ``None`` when not even the
        last seq parses (a foreign publisher): the caller should read the stream anyway.
    """
    head, newline, body = data.partition(b"\n")
    parts = head.split(b" ")
    try:
        last_seq = int(parts[0])
        first_seq = int(parts[1]) if len(parts) in (2, 3, 4) else last_seq
    except ValueError:
        return None
    epoch = parts[2] if len(parts) in (3, 4) and parts[2] else None
    if len(parts) == 4 and parts[3] == b"c" and newline:
        return _compact(last_seq, first_seq, epoch, body)
    if not newline or len(parts) not in (2, 3):
        return Notification(last_seq=last_seq, first_seq=last_seq, events=None, epoch=epoch)
    events = body.split(b"\n")
    if first_seq < 1 or len(events) != last_seq - first_seq + 1:
        return Notification(last_seq=last_seq, first_seq=last_seq, events=None, epoch=epoch)
    return Notification(last_seq=last_seq, first_seq=first_seq, events=events, epoch=epoch)


def _compact(last_seq: int, first_seq: int, epoch: bytes | None, body: bytes) -> Notification:
    """Split a compact body (``<n>:<value>`` repeated); seq-only when it does not hold exactly the batch."""
    values: list[bytes] = []
    at = 0
    while at < len(body):
        colon = body.find(b":", at, at + 12)
        size = body[at:colon]
        if colon < 0 or not size.isdigit() or colon + 1 + int(size) > len(body):
            values = []
            break
        values.append(body[colon + 1:colon + 1 + int(size)])
        at = colon + 1 + int(size)
    if first_seq < 1 or not values or len(values) != last_seq - first_seq + 1:
        return Notification(last_seq=last_seq, first_seq=last_seq, events=None, epoch=epoch)
    return Notification(last_seq=last_seq, first_seq=first_seq, events=values, epoch=epoch, compact=True)


def encode_notification(first_seq: int, events: list[bytes], max_bytes: int, epoch: bytes = b"", *,
                        compact: bool = False) -> bytes:
    """Return the payload the append script publishes for one batch (its Python twin).

    Args:
        first_seq: Seq of ``events[0]``.
        events: The batch's compact event JSONs, non-empty.
        max_bytes: ``FANOUT_LIVE_MAX_BYTES``; when the events and their separators take
            more, or it is 0, the payload is seq-only.
        epoch: The writer's epoch (``b""``: a writer before contract 1.1).
        compact: ``events`` are compact stored values (what the append script publishes
            today); ``False`` gives the JSON form of a worker before the compact log.

    Used by tests and benchmarks to publish exactly what a worker would.
    """
    last_seq = first_seq + len(events) - 1
    size = sum(len(event) + 1 for event in events)
    head = b"%d %d %s" % (last_seq, first_seq, epoch) if epoch else b"%d %d" % (last_seq, first_seq)
    if max_bytes <= 0 or size > max_bytes:
        return head if epoch else b"%d" % last_seq
    if compact:
        return b"%d %d %s c\n" % (last_seq, first_seq, epoch) + b"".join(b"%d:%s" % (len(e), e) for e in events)
    return head + b"\n" + b"\n".join(events)
