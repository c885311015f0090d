"""The events one stored entry holds, as ``(seq, JSON)``, whichever form stores them: for tools, tests and compaction.

A stream entry is either the JSON form (field ``e``, :data:`schema.keys.EVENT_FIELD`) or the
compact form (field ``c``, :mod:`schema.stored`): one event, or a compacted run of many.
:func:`entry_jsons` gives back each event's JSON byte for byte as ``encode_event`` writes
it (and as the publisher's SSE ``data:`` line carries it). Pure: msgspec and the standard
library only.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from schema.keys import EVENT_FIELD, seq_of
from schema.stored import STORED_FIELD, PackedRunForm, RunForm, decode_stored, form_json, run_jsons


def value_jsons(stream_id: str, seq: int, value: bytes) -> list[tuple[int, bytes]]:
    """Return ``(seq, JSON)`` of each event the compact value at entry ``0-<seq>`` holds; ``[]`` when corrupt.

    One pair for tags 0 to 2, one per delta for a compacted run (tag 3) that ends at ``seq``.
    """
    try:
        form = decode_stored(value)
        if not isinstance(form, RunForm | PackedRunForm):
            return [(seq, form_json(stream_id, seq, form))]
        jsons = run_jsons(stream_id, form)
        return [(at, data) for at, _ts, data in jsons] if jsons[-1][0] == seq else []
    except (msgspec.DecodeError, IndexError, ValueError):
        return []


def entry_jsons(stream_id: str, entry_id: bytes | str, fields: Mapping[bytes, bytes]) -> list[tuple[int, bytes]]:
    """Return ``(seq, JSON)`` of each event one stored entry holds, in either form (for tools and tests).

    Args:
        stream_id: The stream the key names.
        entry_id: ``0-<seq>``.
        fields: The entry's fields as a map: ``c`` (compact) or ``e`` (the JSON form).

    Returns:
        The JSON form's value as stored, or what :func:`value_jsons` rebuilds; ``[]`` for an
        entry with neither field or a corrupt compact value.

    Raises:
        ValueError: ``entry_id`` is not ``0-<seq>``.
    """
    seq = seq_of(entry_id)
    if EVENT_FIELD in fields:
        return [(seq, fields[EVENT_FIELD])]
    value = fields.get(STORED_FIELD)
    return value_jsons(stream_id, seq, value) if value is not None else []
