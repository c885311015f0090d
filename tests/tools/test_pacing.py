"""tools.pacing: a recorded body splits into provider events, losing and adding nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tools.pacing import provider_events
from tools.upstream import DEFAULT_ROOTS

BODIES = sorted(path for root in DEFAULT_ROOTS for path in root.glob("*/*.sse")
                if path.parent.name in {"openai_chat", "openai_responses", "anthropic", "gemini_sse",
                                        "gemini_json_array"})


@pytest.mark.parametrize("path", BODIES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_transcript_splits_into_pieces_that_join_back_exactly(path: Path) -> None:
    body = path.read_bytes()
    pieces = provider_events(body, json_array=path.parent.name == "gemini_json_array")
    assert b"".join(pieces) == body
    assert all(pieces)


def test_an_sse_body_splits_after_each_blank_line_whatever_the_line_ends() -> None:
    body = b"event: a\ndata: 1\n\nevent: b\r\ndata: 2\r\n\r\ndata: 3\r\rdata: tail"
    assert provider_events(body, json_array=False) == [b"event: a\ndata: 1\n\n", b"event: b\r\ndata: 2\r\n\r\n",
                                                      b"data: 3\r\r", b"data: tail"]


def test_a_json_array_splits_after_each_element_ignoring_brackets_in_strings() -> None:
    body = b'[{"t": "a } ] \\" {"}\n,{"n": [1, {"x": 2}]}\n]'
    pieces = provider_events(body, json_array=True)
    assert pieces == [b'[{"t": "a } ] \\" {"}', b'\n,{"n": [1, {"x": 2}]}', b"\n]"]
    assert json.loads(pieces[0][1:]) == {"t": 'a } ] " {'}
    assert json.loads(pieces[1].lstrip(b"\n,")) == {"n": [1, {"x": 2}]}


def test_a_real_anthropic_case_is_one_piece_per_event_not_per_chunk() -> None:
    body = (DEFAULT_ROOTS[0] / "anthropic" / "thinking_with_signature.sse").read_bytes()
    pieces = provider_events(body, json_array=False)
    assert len(pieces) == body.count(b"\n\n") == 12
    assert all(piece.startswith(b"event: ") for piece in pieces)


def test_an_empty_body_is_no_piece_and_a_body_without_boundary_is_one() -> None:
    assert provider_events(b"", json_array=False) == []
    assert provider_events(b"data: x", json_array=False) == [b"data: x"]
    assert provider_events(b"[", json_array=True) == [b"["]


@given(st.lists(st.sampled_from([b"\n", b"\r", b"\r\n", b"data: x", b"[", b"]", b"{", b"}", b'"', b"\\", b","]),
                max_size=40), st.booleans())
def test_pieces_always_join_back_to_the_body(parts: list[bytes], json_array: bool) -> None:
    body = b"".join(parts)
    pieces = provider_events(body, json_array=json_array)
    assert b"".join(pieces) == body
    assert all(pieces)
