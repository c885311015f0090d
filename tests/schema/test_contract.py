"""The contract Structs, their JSON form and the committed JSON Schema."""

from __future__ import annotations

import jsonschema
import msgspec
import pytest

from schema.contract import (
    BlockDelta,
    BlockRef,
    BlockStart,
    Delta,
    ErrorInfo,
    StreamDone,
    StreamError,
    StreamStart,
    ToolInfo,
    decode_event,
    encode_event,
)
from schema.jsonschema import SCHEMA_PATH, build_schema, render

TEXT = BlockRef(id="b0", index=0, kind="text")


def test_committed_json_schema_is_current() -> None:
    assert SCHEMA_PATH.read_bytes() == render(), "run: python -m schema.jsonschema"


def test_every_event_validates_against_the_json_schema() -> None:
    schema = build_schema()
    events = [
        StreamStart(stream_id="st_a", seq=1, ts=5, provider="anthropic", model="m", metadata={"k": 1}),
        BlockStart(stream_id="st_a", seq=2, ts=5, block=BlockRef(id="b0", index=0, kind="tool_call"),
                   tool=ToolInfo(call_id="c", name="f")),
        BlockDelta(stream_id="st_a", seq=3, ts=5, block=TEXT, delta=Delta(kind="text", text="x")),
        StreamDone(stream_id="st_a", seq=4, ts=5, status="completed", finish_reason="stop",
                   provider_finish_reason="end_turn", usage=None, response_id=None, model=None),
        StreamError(stream_id="st_a", seq=4, ts=5, status="failed", usage=None, finish_reason=None,
                    error=ErrorInfo(category="protocol", retryable=False, message="m")),
    ]
    for event in events:
        jsonschema.validate(msgspec.json.decode(encode_event(event)), schema)


def test_json_schema_rejects_unknown_block_kind() -> None:
    bad = {"type": "block.start", "stream_id": "s", "seq": 2, "ts": 0,
           "block": {"id": "b0", "index": 0, "kind": "audio"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, build_schema())


def test_round_trip_keeps_every_field() -> None:
    event = BlockStart(stream_id="st_a", seq=2, ts=9, block=BlockRef(id="b0", index=0, kind="reasoning"),
                       visibility="internal", redacted=True)
    assert decode_event(encode_event(event)) == event


def test_block_start_omits_fields_of_other_kinds() -> None:
    data = msgspec.json.decode(encode_event(BlockStart(stream_id="s", seq=2, ts=0, block=TEXT)))
    assert set(data) == {"type", "stream_id", "seq", "ts", "block"}


def test_terminal_fields_are_present_even_when_null() -> None:
    done = StreamDone(stream_id="s", seq=2, ts=0, status="completed", finish_reason=None,
                      provider_finish_reason=None, usage=None, response_id=None, model=None)
    data = msgspec.json.decode(encode_event(done))
    assert data["usage"] is None
    assert data["finish_reason"] is None


def test_unknown_event_type_decodes_to_none() -> None:
    assert decode_event(b'{"type":"stream.warning","stream_id":"s","seq":3,"ts":0}') is None


def test_known_type_with_missing_field_raises() -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_event(b'{"type":"block.stop","stream_id":"s","seq":3,"ts":0}')


def test_endpoint_is_absent_from_terminals_written_without_one() -> None:
    done = StreamDone(stream_id="s", seq=2, ts=0, status="completed", finish_reason=None,
                      provider_finish_reason=None, usage=None, response_id=None, model=None)
    error = StreamError(stream_id="s", seq=2, ts=0, status="failed", usage=None, finish_reason=None,
                        error=ErrorInfo(category="protocol", retryable=False, message="m"))
    assert b"endpoint" not in encode_event(done)
    assert b"endpoint" not in encode_event(error)


def test_endpoint_round_trips_on_both_terminals_and_validates() -> None:
    done = StreamDone(stream_id="s", seq=2, ts=0, status="completed", finish_reason=None,
                      provider_finish_reason=None, usage=None, response_id=None, model="dep-1", endpoint="azure-east")
    error = StreamError(stream_id="s", seq=2, ts=0, status="failed", usage=None, finish_reason=None,
                        error=ErrorInfo(category="rate_limited", retryable=True, message="m"), endpoint="openai")
    for event in (done, error):
        assert decode_event(encode_event(event)) == event
        jsonschema.validate(msgspec.json.decode(encode_event(event)), build_schema())
    assert msgspec.json.decode(encode_event(error))["endpoint"] == "openai"
