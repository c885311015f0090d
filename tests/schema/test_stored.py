"""The compact stored form gives back every event's JSON byte for byte; corrupt values are refused, never guessed."""

from __future__ import annotations

import itertools
import zlib
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schema.contract import BlockDelta, BlockRef, Delta, Event, decode_event, encode_event
from schema.keys import EVENT_FIELD
from schema.stored import (
    BLOCK_KINDS,
    DELTA_KINDS,
    MAX_RUN_BYTES,
    STORED_FIELD,
    PackedRunForm,
    RunForm,
    decode_stored,
    encode_stored,
    event_json,
    pack_run,
)
from schema.stored_entries import entry_jsons, value_jsons

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = sorted([*ROOT.glob("transcripts/*/*.events.jsonl"), *ROOT.glob("tests/cases/transcripts/*/*.events.jsonl")])


def golden_events(path: Path) -> list[Event]:
    """The events of one golden transcript (``<case>.events.jsonl``)."""
    events = [decode_event(line) for line in path.read_bytes().splitlines() if line.strip()]
    return [event for event in events if event is not None]


def test_the_goldens_are_found() -> None:
    assert len(GOLDENS) > 100


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_every_golden_event_stored_compact_gives_back_its_json_exactly(path: Path) -> None:
    for event in golden_events(path):
        value = encode_stored(event)
        assert event_json(event.stream_id, event.seq, value) == encode_event(event)
        assert entry_jsons(event.stream_id, f"0-{event.seq}", {STORED_FIELD: value}) == [(event.seq,
                                                                                           encode_event(event))]


@given(text=st.text(min_size=1), ts=st.integers(min_value=0, max_value=2**63 - 1),
       index=st.integers(min_value=0, max_value=10_000), block_kind=st.sampled_from(BLOCK_KINDS),
       delta_kind=st.sampled_from(DELTA_KINDS), seq=st.integers(min_value=1, max_value=2**40))
def test_any_delta_round_trips_exactly(text: str, ts: int, index: int, block_kind: str, delta_kind: str,  # noqa: PLR0917 - hypothesis
                                       seq: int) -> None:
    event = BlockDelta(stream_id="st_Ab-9", seq=seq, ts=ts, block=BlockRef(id=f"b{index}", index=index,
                       kind=block_kind), delta=Delta(kind=delta_kind, text=text))  # type: ignore[arg-type]
    assert event_json("st_Ab-9", seq, encode_stored(event)) == encode_event(event)


def test_a_delta_is_stored_without_envelope_or_field_names() -> None:
    event = BlockDelta(stream_id="st_" + "x" * 40, seq=1234, ts=1_764_800_000_000,
                       block=BlockRef(id="b0", index=0, kind="text"), delta=Delta(kind="text", text="hello "))
    value = encode_stored(event)
    assert len(value) == 15 + len("hello ")
    assert b"st_" not in value
    assert b"kind" not in value


def test_a_block_id_off_the_contract_rule_is_still_exact() -> None:
    event = BlockDelta(stream_id="st_a", seq=3, ts=5, block=BlockRef(id="odd", index=0, kind="text"),
                       delta=Delta(kind="text", text="x"))
    assert event_json("st_a", 3, encode_stored(event)) == encode_event(event)


@pytest.mark.parametrize("value", [b"", b"\xc1", b"{}", msgspec.msgpack.encode([9, 1]), msgspec.msgpack.encode([0, 1]),
                                   msgspec.msgpack.encode([0, 1, 0, 7, 0, "x"]), msgspec.msgpack.encode([1, 5, b"x"])])
def test_a_corrupt_value_gives_no_json(value: bytes) -> None:
    assert event_json("st_a", 1, value) is None
    assert value_jsons("st_a", 1, value) == []


def test_the_json_form_is_read_as_stored() -> None:
    assert entry_jsons("st_a", b"0-7", {EVENT_FIELD: b'{"x":1}'}) == [(7, b'{"x":1}')]
    assert entry_jsons("st_a", b"0-7", {b"z": b"1"}) == []


def _run(first: int, texts: list[str], ts: list[int]) -> RunForm:
    return RunForm(first_seq=first, ts=ts[0], index=1, block_kind=0, delta_kind=0, text="".join(texts),
                   lengths=[len(t) for t in texts], ts_steps=[b - a for a, b in itertools.pairwise(ts)])


def test_a_compacted_run_gives_every_delta_back() -> None:
    texts, ts = ["Hé", "llo ", "😊", "!"], [100, 90, 4000, 4000]
    value = msgspec.msgpack.encode(_run(10, texts, ts))
    want = [(10 + i, encode_event(BlockDelta(stream_id="st_a", seq=10 + i, ts=ts[i], block=BlockRef(
        id="b1", index=1, kind="text"), delta=Delta(kind="text", text=text)))) for i, text in enumerate(texts)]
    assert value_jsons("st_a", 13, value) == want
    assert isinstance(decode_stored(value), RunForm)
    assert event_json("st_a", 13, value) is None  # many events: not one JSON


def test_a_run_whose_lengths_do_not_cover_its_text_or_its_seq_is_corrupt() -> None:
    bad = msgspec.structs.replace(_run(10, ["a", "b"], [1, 2]), lengths=[1, 2])
    assert value_jsons("st_a", 11, msgspec.msgpack.encode(bad)) == []
    assert value_jsons("st_a", 12, msgspec.msgpack.encode(_run(10, ["a", "b"], [1, 2]))) == []  # ends at 11


def test_a_packed_run_gives_the_same_deltas_and_is_smaller_when_the_text_repeats() -> None:
    texts = [" the", " stream", " of", " the", " answer"] * 40
    run = _run(10, texts, list(range(100, 100 + 20 * len(texts), 20)))
    packed = pack_run(run)
    assert isinstance(packed, PackedRunForm)
    assert len(msgspec.msgpack.encode(packed)) < len(msgspec.msgpack.encode(run)) / 2
    last = 10 + len(texts) - 1
    assert value_jsons("st_a", last, msgspec.msgpack.encode(packed)) == value_jsons("st_a", last,
                                                                                       msgspec.msgpack.encode(run))


def test_a_short_run_stays_unpacked() -> None:
    run = _run(1, ["a", "b"], [1, 2])
    assert pack_run(run) is run


@pytest.mark.parametrize("packed", [b"not zlib", zlib.compress(b"\xc1"), zlib.compress(b"\x00" * (MAX_RUN_BYTES + 1)),
                                    zlib.compress(b"\x00" * 100)[:-4]])
def test_a_packed_run_that_does_not_unpack_is_corrupt(packed: bytes) -> None:
    value = msgspec.msgpack.encode(PackedRunForm(1, 0, 0, 0, 0, packed))
    assert value_jsons("st_a", 1, value) == []
