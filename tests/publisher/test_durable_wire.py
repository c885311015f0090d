"""publisher.wire.durable: offsets, cursors, control events and headers of the Durable Streams reads."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from publisher.wire.durable import (
    CURSOR_EPOCH_S,
    CURSOR_INTERVAL_S,
    MAX_JITTER_S,
    OFFSET_DIGITS,
    Offset,
    OffsetError,
    ReadState,
    control_event,
    data_event,
    entity_tag,
    format_offset,
    json_array,
    parse_offset,
    read_headers,
    response_cursor,
)

EPOCHS = st.one_of(st.none(), st.from_regex(r"[0-9a-z]{1,32}", fullmatch=True))
SEQS = st.integers(min_value=0, max_value=2**53)


@given(SEQS, EPOCHS)
def test_an_offset_names_its_seq_and_epoch_and_parses_back(seq: int, epoch: str | None) -> None:
    offset = format_offset(seq, epoch)
    assert parse_offset(offset) == Offset(seq, epoch if seq else None)
    assert not set(offset) & set(",&=?/ ")
    assert offset not in ("-1", "now")


@given(SEQS, SEQS, EPOCHS)
def test_offsets_of_one_generation_sort_as_their_seqs(a: int, b: int, epoch: str | None) -> None:
    assert (format_offset(a, epoch) < format_offset(b, epoch)) == (a < b)


def test_the_sentinels_parse_to_the_beginning_and_the_tail() -> None:
    assert parse_offset("-1") == Offset(0, None)
    assert parse_offset("now") == "now"


@pytest.mark.parametrize("raw", ["", "0", "17", "0,1", "0 1", "-2", "NOW", "0" * (OFFSET_DIGITS + 1),
                                 "0" * OFFSET_DIGITS + ".", "0" * OFFSET_DIGITS + ".ABC",
                                 "0" * OFFSET_DIGITS + "." + "a" * 33, "../" + "0" * OFFSET_DIGITS])
def test_a_malformed_offset_is_refused(raw: str) -> None:
    with pytest.raises(OffsetError):
        parse_offset(raw)


def test_a_seq_too_long_for_an_offset_is_refused() -> None:
    assert parse_offset(format_offset(10**OFFSET_DIGITS - 1, None)) == Offset(10**OFFSET_DIGITS - 1, None)
    with pytest.raises(ValueError, match="does not fit"):
        format_offset(10**OFFSET_DIGITS, None)


def test_the_cursor_is_the_current_interval_without_a_client_cursor() -> None:
    now_s = CURSOR_EPOCH_S + 1000 * CURSOR_INTERVAL_S + 5
    assert response_cursor(None, now_s, 1) == "1000"
    assert response_cursor("999", now_s, 1) == "1000"  # behind: the current interval
    assert response_cursor("x1", now_s, 1) == "1000"  # not a cursor: ignored
    assert response_cursor("9" * 19, now_s, 1) == "1000"  # too long: ignored
    assert response_cursor("9" * 18, now_s, 1) == str(10**18)  # the longest kept: moved forward


@pytest.mark.parametrize(("jitter_s", "added"), [(1, 1), (20, 1), (21, 2), (MAX_JITTER_S, 180)])
def test_a_client_cursor_not_behind_moves_strictly_forward_by_the_jitter(jitter_s: int, added: int) -> None:
    now_s = CURSOR_EPOCH_S + 1000 * CURSOR_INTERVAL_S
    assert response_cursor("1000", now_s, jitter_s) == str(1000 + added)
    assert response_cursor("5000", now_s, jitter_s) == str(5000 + added)


def test_bodies_are_json_arrays_of_the_event_json() -> None:
    assert json_array([]) == b"[]"
    assert json.loads(json_array([b'{"seq":1}', b'{"seq":2}'])) == [{"seq": 1}, {"seq": 2}]
    assert data_event([b'{"seq":1}']) == b'event: data\ndata: [{"seq":1}]\n\n'


def test_a_control_event_of_an_open_stream_carries_the_cursor() -> None:
    frame = control_event("0000000000000003", cursor="42", up_to_date=True, closed=False)
    assert frame.startswith(b"event: control\ndata: ")
    assert frame.endswith(b"\n\n")
    assert json.loads(frame.split(b"data: ")[1]) == {"streamNextOffset": "0000000000000003", "streamCursor": "42",
                                                       "upToDate": True}
    behind = control_event("0000000000000003", cursor="42", up_to_date=False, closed=False)
    assert "upToDate" not in json.loads(behind.split(b"data: ")[1])


def test_a_control_event_of_a_closed_stream_drops_the_cursor() -> None:
    frame = control_event("0000000000000009", cursor="42", up_to_date=False, closed=True)
    assert json.loads(frame.split(b"data: ")[1]) == {"streamNextOffset": "0000000000000009", "upToDate": True,
                                                       "streamClosed": True}


def test_read_headers_say_up_to_date_closed_and_cursor_as_the_spec_asks() -> None:
    open_state = ReadState("0000000000000002", up_to_date=False, closed=False)
    headers = read_headers(open_state, cache_control="no-store", cursor="7", etag='"e"')
    assert headers["Stream-Next-Offset"] == "0000000000000002"
    assert "Stream-Up-To-Date" not in headers
    assert "Stream-Closed" not in headers
    assert headers["Stream-Cursor"] == "7"
    assert headers["ETag"] == '"e"'
    assert headers["X-Content-Type-Options"] == "nosniff"
    closed = read_headers(ReadState("0000000000000009", up_to_date=False, closed=True), cache_control="no-store",
                          cursor="7")
    assert closed["Stream-Closed"] == "true"
    assert closed["Stream-Up-To-Date"] == "true"
    assert "Stream-Cursor" not in closed


def test_the_entity_tag_changes_with_the_scope_and_with_closure() -> None:
    state = ReadState("0000000000000009", up_to_date=True, closed=False)
    tags = {entity_tag("public", "-1", state), entity_tag("internal", "-1", state),
            entity_tag("public", "-1", state._replace(closed=True))}
    assert len(tags) == 3
