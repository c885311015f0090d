"""The AWS event-stream decoder: layout, both CRCs, limits, every header type, any chunking."""

from __future__ import annotations

import base64
import struct
import uuid
import zlib
from datetime import UTC, datetime

import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given, settings
from hypothesis import strategies as st

from schema.errors import FrameTooLargeError, UpstreamProtocolError
from tests.eventstream_build import Header, encode_message, message_of
from worker.eventstream import EventStreamDecoder, EventStreamMessage

CHUNK = message_of({"chunk": {"type": "content_block_delta", "index": 0,
                              "delta": {"type": "text_delta", "text": "Hi"}}})
EXCEPTION = message_of({"exception": "modelStreamErrorException",
                        "payload": {"message": "Model Stream Error", "originalStatusCode": 500}})
ERROR = message_of({"error": {"code": "InternalFailure", "message": "try again"}})
ALL_TYPES: list[Header] = [
    ("t", 0, True), ("f", 1, False), ("i8", 2, -7), ("i16", 3, -30000), ("i32", 4, 2**31 - 1),
    ("i64", 5, -(2**63)), ("raw", 6, b"\x00\xff"), ("s", 7, "héllo ☕"), ("ts", 8, 1_764_000_000_123),
    ("id", 9, "12345678-1234-5678-1234-567812345678"),
]


def decode(*reads: bytes, limit: int = 1 << 20) -> list[EventStreamMessage]:
    decoder = EventStreamDecoder(max_message_bytes=limit)
    out = [m for read in reads for m in decoder.feed(read)]
    assert decoder.close().truncated is False
    return out


def _feed_all(decoder: EventStreamDecoder, reads: tuple[bytes, ...]) -> None:
    for read in reads:
        decoder.feed(read)
    decoder.close()


def error_of(*reads: bytes, limit: int = 1 << 20) -> UpstreamProtocolError:
    with pytest.raises(UpstreamProtocolError) as info:
        _feed_all(EventStreamDecoder(max_message_bytes=limit), reads)
    return info.value


def test_chunk_message_carries_its_type_headers_and_payload() -> None:
    (message,) = decode(CHUNK)
    assert (message.message_type, message.event_type, message.content_type) == ("event", "chunk", "application/json")
    assert message.payload.startswith(b'{"bytes":"eyJ0eXBlIjoiY29udGVudF9ibG9ja19kZWx0YSIs')


def test_exception_and_error_messages_name_their_type_and_code() -> None:
    exception, error = decode(EXCEPTION, ERROR)
    assert (exception.message_type, exception.exception_type) == ("exception", "modelStreamErrorException")
    assert (error.message_type, error.error_code, error.error_message) == ("error", "InternalFailure", "try again")
    assert error.payload == b""


def test_every_header_value_type_decodes() -> None:
    (message,) = decode(encode_message(ALL_TYPES, b"p"))
    assert message.headers == {
        "t": True, "f": False, "i8": -7, "i16": -30000, "i32": 2**31 - 1, "i64": -(2**63), "raw": b"\x00\xff",
        "s": "héllo ☕", "ts": datetime(2025, 11, 24, 16, 0, 0, 123000, tzinfo=UTC),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    }
    assert message.message_type == "event"  # absent :message-type


def test_agrees_with_botocore_event_stream_buffer() -> None:
    # botocore's EventStreamBuffer is the reference decoder (UPSTREAMS.md C.6).
    body = CHUNK + EXCEPTION + ERROR + encode_message(ALL_TYPES[:8], b"payload")
    reference = EventStreamBuffer()
    reference.add_data(body)
    theirs = [(dict(m.headers), m.payload) for m in reference]
    ours = [(m.headers, m.payload) for m in decode(body)]
    assert ours == theirs


def test_empty_headers_and_payload_is_the_smallest_message() -> None:
    (message,) = decode(encode_message([], b""))
    assert (message.headers, message.payload) == ({}, b"")


@settings(max_examples=200)
@given(data=st.data())
def test_any_chunking_gives_the_same_messages(data: st.DataObject) -> None:
    body = data.draw(st.lists(st.sampled_from([CHUNK, EXCEPTION, ERROR, encode_message(ALL_TYPES, b"x" * 40)]),
                              min_size=1, max_size=6), label="messages")
    whole = b"".join(body)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(whole)), max_size=12), label="cuts"))
    reads = [whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True)]
    assert decode(*reads) == decode(whole)


def test_a_split_at_every_byte_boundary_gives_the_same_messages() -> None:
    body = CHUNK + EXCEPTION
    whole = decode(body)
    for cut in range(len(body) + 1):
        assert decode(body[:cut], body[cut:]) == whole, cut


def test_body_ending_inside_a_message_is_truncated() -> None:
    decoder = EventStreamDecoder()
    assert decoder.feed(CHUNK + EXCEPTION[:5]) != []
    assert decoder.close().truncated is True


def test_bad_prelude_crc_fails_protocol() -> None:
    bad = message_of({"event": "messageStart", "payload": {"role": "assistant"}, "corrupt": "prelude_crc"})
    err = error_of(CHUNK, bad)
    assert (err.category, err.message) == ("protocol", f"malformed event-stream message at byte {len(CHUNK)}: "
                                                       "prelude CRC mismatch")


def test_bad_message_crc_fails_protocol() -> None:
    bad = message_of({"event": "messageStart", "payload": {"role": "assistant"}, "corrupt": "message_crc"})
    assert error_of(bad).message == "malformed event-stream message at byte 0: message CRC mismatch"


def test_error_after_messages_in_one_read_is_raised_by_the_next_call() -> None:
    decoder = EventStreamDecoder()
    bad = bytearray(EXCEPTION)
    bad[-1] ^= 0xFF
    assert len(decoder.feed(CHUNK + bytes(bad))) == 1
    with pytest.raises(UpstreamProtocolError, match="message CRC mismatch"):
        decoder.feed(b"")
    with pytest.raises(UpstreamProtocolError, match="message CRC mismatch"):
        decoder.close()


def test_message_of_exactly_max_message_bytes_is_accepted() -> None:
    assert decode(CHUNK, limit=len(CHUNK)) != []


def test_message_one_byte_over_max_message_bytes_fails_from_its_prelude_alone() -> None:
    decoder = EventStreamDecoder(max_message_bytes=len(CHUNK) - 1)
    with pytest.raises(FrameTooLargeError, match=f"of {len(CHUNK)} bytes exceeds max_message_bytes={len(CHUNK) - 1}"):
        decoder.feed(CHUNK[:12])  # nothing past the prelude was needed, nor buffered


@pytest.mark.parametrize(
    ("headers", "reason"),
    [([("a", 7, "x"), ("a", 7, "y")], "duplicate header 'a'"),
     ([("", 7, "x")], "empty header name"),
     ([("k", 10, None)], "header 'k' has unknown value type 10")],
)
def test_impossible_headers_fail_protocol(headers: list[Header], reason: str) -> None:
    if headers[0][1] == 10:
        raw = bytearray(encode_message([("k", 1, None)], b""))
        raw[14] = 10  # the value type byte of header 'k'
        body = bytes(raw[:-4]) + _crc(bytes(raw[:-4]))
    else:
        body = encode_message(headers, b"")
    assert error_of(body).message == f"malformed event-stream message at byte 0: {reason}"


def test_cut_header_and_non_utf8_string_fail_protocol() -> None:
    raw = bytearray(encode_message([("s", 7, "abc")], b""))
    raw[16] = 9  # string length 3 -> 9: runs past the headers
    cut = bytes(raw[:-4]) + _crc(bytes(raw[:-4]))
    assert "header cut at byte" in error_of(cut).message
    raw = bytearray(encode_message([("s", 7, "abc")], b""))
    raw[17] = 0xFF
    bad = bytes(raw[:-4]) + _crc(bytes(raw[:-4]))
    assert error_of(bad).message.endswith("string header value is not UTF-8")


def test_lengths_that_cannot_hold_their_parts_fail_protocol() -> None:
    first = struct.pack(">II", 15, 0)
    short = first + struct.pack(">I", zlib.crc32(first)) + b"\x00\x00\x00"
    assert "total_length 15 cannot hold headers_length 0" in error_of(short).message
    first = struct.pack(">II", 20, 5)
    wide = first + struct.pack(">I", zlib.crc32(first)) + b"\x00" * 8
    assert "total_length 20 cannot hold headers_length 5" in error_of(wide).message


def _crc(data: bytes) -> bytes:
    return zlib.crc32(data).to_bytes(4, "big")


def test_repeated_header_blocks_give_equal_but_independent_headers() -> None:
    first, second = decode(CHUNK + CHUNK)
    assert first.headers == second.headers
    first.headers[":event-type"] = "changed"
    assert second.headers[":event-type"] == "chunk"
    assert decode(CHUNK)[0].headers[":event-type"] == "chunk"


def test_timestamp_out_of_range_fails_protocol() -> None:
    body = encode_message([("ts", 8, 2**63 - 1)], b"")
    assert error_of(body).message == "malformed event-stream message at byte 0: timestamp header out of range"


def test_the_chunk_message_of_upstreams_c2_has_its_documented_bytes() -> None:
    # UPSTREAMS.md C.2: total 226, headers 75, prelude CRC d6 38 d3 ce, message CRC 52 8e cb 0b.
    event = b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}'
    payload = b'{"bytes":"' + base64.b64encode(event) + b'","p":"abcd"}'
    headers: list[Header] = [(":event-type", 7, "chunk"), (":content-type", 7, "application/json"),
                             (":message-type", 7, "event")]
    raw = encode_message(headers, payload)
    assert (raw[:12].hex(" "), raw[-4:].hex(" ")) == ("00 00 00 e2 00 00 00 4b d6 38 d3 ce", "52 8e cb 0b")
    (message,) = decode(raw)
    assert (message.event_type, message.payload) == ("chunk", payload)
