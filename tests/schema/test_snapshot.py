"""``stream.snapshot``: its JSON, its schema, and an assembler rebuilt from it (pure, every golden at every split)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import msgspec
import pytest

from schema.contract import Event, decode_event
from schema.jsonschema import build_schema
from schema.reducer import reduce
from schema.snapshot import StreamSnapshot, assembler_from, decode_snapshot, encode_snapshot, snapshot_json

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = sorted((ROOT / "transcripts").glob("*/*.events.jsonl"))


def golden(path: Path) -> list[Event]:
    events = [decode_event(line) for line in path.read_text(encoding="utf-8").split("\n") if line]  # not at U+2028
    return [event for event in events if event is not None]


def snapshot_at(events: list[Event], split: int) -> StreamSnapshot:
    head = events[:split]
    return StreamSnapshot(stream_id=events[0].stream_id, seq=split, ts=head[-1].ts if head else 0,
                          result=reduce(head, events[0].stream_id))


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_an_assembler_from_a_snapshot_continues_to_the_whole_result_at_every_split(path: Path) -> None:
    events = golden(path)
    whole = reduce(events)
    for split in range(len(events) + 1):
        snapshot = decode_snapshot(encode_snapshot(snapshot_at(events, split)))
        assembler = assembler_from(snapshot)
        assert assembler.result() == snapshot.result, split
        for event in events[split:]:
            assembler.apply(event)
        assert assembler.result() == whole, split


@pytest.mark.parametrize("path", GOLDENS[::10], ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_snapshot_json_around_an_encoded_result_is_the_structs_own_encoding(path: Path) -> None:
    events = golden(path)
    snapshot = snapshot_at(events, len(events) // 2)
    built = snapshot_json(snapshot.stream_id, snapshot.seq, snapshot.ts, msgspec.json.encode(snapshot.result))
    assert built == encode_snapshot(snapshot)


def test_a_snapshot_validates_against_the_json_schema_and_a_bad_one_does_not() -> None:
    events = golden(GOLDENS[0])
    data = json.loads(encode_snapshot(snapshot_at(events, len(events))))
    schema = build_schema()
    jsonschema.validate(data, schema)
    del data["result"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


def test_a_snapshot_is_not_a_stored_event() -> None:
    data = encode_snapshot(snapshot_at(golden(GOLDENS[0]), 1))
    assert decode_event(data) is None  # old readers ignore it as an unknown type
    assert data.startswith(b'{"type":"stream.snapshot","stream_id":')


def test_an_assembler_from_a_finished_snapshot_keeps_the_endpoint() -> None:
    events = golden(GOLDENS[0])
    end = events[-1]
    assert hasattr(end, "endpoint")
    events[-1] = msgspec.structs.replace(end, endpoint="azure-east")
    snapshot = snapshot_at(events, len(events))
    assert snapshot.result.endpoint == "azure-east"
    assert assembler_from(decode_snapshot(encode_snapshot(snapshot))).result() == snapshot.result
