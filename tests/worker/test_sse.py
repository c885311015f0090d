"""SSE framing (worker.sse): WHATWG rules one by one, bug cases, chunking properties."""

from __future__ import annotations

import ast
import codecs
import itertools
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schema.errors import FrameTooLargeError, UpstreamProtocolError
from worker.frames import Frame, JSONFrame, SSEFrame
from worker.sse import SSEDecoder, SSEEnd

TRANSCRIPTS = Path("/work/shared/cases/transcripts")
SSE_FILES = sorted(
    p
    for provider in ("openai_chat", "openai_responses", "anthropic", "gemini_sse")
    for p in (TRANSCRIPTS / provider).glob("*.sse")
)
MODULES = Path(__file__).resolve().parents[2] / "worker"


def decode(pieces: list[bytes], max_frame_bytes: int = 8 * 1024 * 1024) -> tuple[list[Frame], SSEEnd]:
    """Feed pieces read by read, then close; frames from feed and close together."""
    decoder = SSEDecoder(max_frame_bytes=max_frame_bytes)
    frames = [frame for piece in pieces for frame in decoder.feed(piece)]
    end = decoder.close()
    return frames + end.frames, end


def outcome(pieces: list[bytes], max_frame_bytes: int = 8 * 1024 * 1024) -> tuple[list[Frame], object]:
    """Like ``decode`` but an error is part of the result: (frames so far, error type)."""
    decoder = SSEDecoder(max_frame_bytes=max_frame_bytes)
    frames: list[Frame] = []
    try:
        for piece in pieces:
            frames += decoder.feed(piece)
        end = decoder.close()
    except UpstreamProtocolError as exc:
        return frames, type(exc)
    return frames + end.frames, end.truncated


def whole(body: bytes) -> list[Frame]:
    frames, end = decode([body])
    assert end.truncated is False
    return frames


def one_byte_reads(body: bytes) -> list[bytes]:
    return [body[i : i + 1] for i in range(len(body))]


def split_at(body: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(body)]
    return [body[a:b] for a, b in itertools.pairwise(bounds)]


def msg(data: str, **fields: object) -> SSEFrame:
    return SSEFrame(data=data, **fields)  # type: ignore[arg-type]


# --- line terminators -------------------------------------------------------------------


def test_lf_cr_and_crlf_all_end_lines() -> None:
    assert whole(b"data: a\n\ndata: b\r\rdata: c\r\n\r\n") == [msg("a"), msg("b"), msg("c")]


def test_crlf_split_across_reads_is_one_terminator() -> None:
    frames, end = decode([b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"])
    assert frames == [msg("a\nb")]
    assert end.truncated is False


def test_cr_at_end_of_read_then_other_byte_is_a_terminator() -> None:
    frames, _ = decode([b"data: a\r", b"data: b\r", b"\r"])
    assert frames == [msg("a\nb")]


def test_lf_then_cr_is_two_terminators() -> None:
    assert whole(b"data: a\n\r") == [msg("a")]


def test_crlf_split_with_empty_reads_between() -> None:
    frames, _ = decode([b"data: a\r", b"", b"", b"\n", b"\r", b"", b"\n"])
    assert frames == [msg("a")]


def test_u2028_inside_data_does_not_split() -> None:
    text = "a\u2028b\u2029c\x85d\x0be\x0cf\x1cg\x1dh\x1ei"
    assert whole(f"data: {text}\n\n".encode()) == [msg(text)]


# --- decoding and BOM -------------------------------------------------------------------


def test_utf8_split_across_reads() -> None:
    body = "data: crème 🦊\n\n".encode()
    for cut in range(len(body) + 1):
        assert decode([body[:cut], body[cut:]])[0] == [msg("crème 🦊")]
    assert decode(one_byte_reads(body))[0] == [msg("crème 🦊")]


def test_invalid_utf8_after_the_first_line_becomes_replacement_character() -> None:
    body = b": ok\nevent: e\xff\ndata: a\xc3(\xf0\x9f\xa6\n\n"
    assert whole(body) == [msg("a\ufffd(\ufffd", event="e\ufffd")]


@pytest.mark.parametrize(("body", "words"), [
    (b"\x8f\x02\xa4junk\n\n", "not UTF-8"), (b"event: e\xff\ndata: a\n\n", "not UTF-8"),
    (b"<!DOCTYPE html>\n<html>\n", "not an SSE field"), (b"Internal Server Error\n", "not an SSE field"),
    (b'[{"candidates": []}]\n', "not an SSE field"), (b"\n\n7\n\n", "not an SSE field"),
    (b"\x1f\x8b\x08\x00", "not UTF-8"), (b"binary blob without newline \x00\x01", "not an SSE field"),
])
def test_a_body_whose_first_line_is_not_sse_is_refused(body: bytes, words: str) -> None:
    for pieces in ([body], one_byte_reads(body)):
        frames, error = outcome(pieces)
        assert (frames, error) == ([], UpstreamProtocolError)
    with pytest.raises(UpstreamProtocolError) as caught:
        decode([body])
    assert words in caught.value.message
    assert caught.value.message.startswith("upstream body is not an SSE stream")


@pytest.mark.parametrize("body", [b"da", b"event", b"data", b": keep-al", b"  {", b"x-vendor", b"\xef\xbb"])
def test_a_body_cut_inside_a_possible_first_line_is_a_cut_not_a_refusal(body: bytes) -> None:
    assert decode([body]) == ([], SSEEnd(frames=[], truncated=True))


def test_unknown_token_field_as_first_line_is_accepted_and_ignored() -> None:
    assert whole(b"x-request-id: 42\ndata: a\n\n") == [msg("a")]


def test_bom_stripped_once() -> None:
    bom = b"\xef\xbb\xbf"
    assert whole(bom + b"data: a\n\n") == [msg("a")]
    # A second BOM is part of the first field name, which is then not a field name:
    # the body does not start like an event stream and is refused.
    with pytest.raises(UpstreamProtocolError):
        whole(bom + bom + b"data: a\n\ndata: b\n\n")
    assert whole(bom + b": c\n" + bom + b"data: a\n\ndata: b\n\n") == [msg("b")]


def test_bom_split_across_reads_stripped() -> None:
    frames, end = decode([b"\xef", b"\xbb", b"\xbfdata: a\n\n"])
    assert frames == [msg("a")]
    assert end.truncated is False


def test_bom_later_in_body_is_kept() -> None:
    assert whole(b"data: \xef\xbb\xbfa\n\n") == [msg("\ufeffa")]


def test_partial_bom_at_eof_is_truncated() -> None:
    assert decode([b"\xef\xbb"]) == ([], SSEEnd(frames=[], truncated=True))


# --- fields ---------------------------------------------------------------------------


def test_data_lines_joined_with_lf() -> None:
    assert whole(b"data: a\ndata:\ndata: c\n\n") == [msg("a\n\nc")]


def test_single_leading_space_after_colon_stripped() -> None:
    assert whole(b"data:x\n\ndata: x\n\ndata:  x\n\n") == [msg("x"), msg("x"), msg(" x")]


def test_comment_lines_ignored() -> None:
    assert whole(b": hi\ndata: a\n:data: b\n\n") == [msg("a")]


def test_line_without_colon_is_field_with_empty_value() -> None:
    assert whole(b"data\ndata\n\n") == [msg("\n")]
    assert whole(b"event\ndata: a\n\n") == [msg("a", event="message")]


def test_empty_data_line_dispatches_empty_data() -> None:
    # WHATWG: the data buffer holds "\n" after one empty data line, so the event is dispatched.
    assert whole(b"data:\n\n") == [msg("")]


def test_event_field_names_the_frame() -> None:
    assert whole(b"event: delta\ndata: a\n\n") == [msg("a", event="delta")]


def test_event_type_resets_after_dispatch() -> None:
    assert whole(b"event: delta\ndata: a\n\ndata: b\n\n") == [
        msg("a", event="delta"),
        msg("b", event="message"),
    ]


def test_event_type_resets_after_dataless_block() -> None:
    assert whole(b"event: ping\n\ndata: b\n\n") == [msg("b", event="message")]


def test_id_persists_across_events() -> None:
    assert whole(b"id: 1\ndata: a\n\ndata: b\n\nid: 2\ndata: c\n\n") == [
        msg("a", id="1"),
        msg("b", id="1"),
        msg("c", id="2"),
    ]


def test_id_with_nul_ignored() -> None:
    assert whole(b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n") == [
        msg("a", id="1"),
        msg("b", id="1"),
    ]


def test_empty_id_resets_last_event_id() -> None:
    assert whole(b"id: 1\ndata: a\n\nid\ndata: b\n\n") == [msg("a", id="1"), msg("b", id=None)]


def test_retry_with_ascii_digits_is_reported_on_its_frame() -> None:
    assert whole(b"retry: 3000\ndata: a\n\ndata: b\n\n") == [msg("a", retry_ms=3000), msg("b")]


def test_retry_not_only_ascii_digits_ignored() -> None:
    body = "retry: 30s\ndata: a\n\nretry: -1\ndata: b\n\nretry: \uff13\ndata: c\n\nretry:\ndata: d\n\n"
    assert whole(body.encode()) == [msg("a"), msg("b"), msg("c"), msg("d")]


def test_unknown_fields_ignored() -> None:
    assert whole(b"foo: bar\nDATA: x\ndata : y\ndata: a\n\n") == [msg("a")]


def test_dataless_block_dispatches_nothing() -> None:
    for block in (b"id: 5\n\n", b"retry: 10\n\n", b"event: ping\n\n", b": keep-alive\n\n", b"\n\n"):
        frames, end = decode([block])
        assert frames == [], block
        assert end.truncated is False, block


# --- end of body ----------------------------------------------------------------------


def test_unterminated_event_at_eof_is_truncated_not_parsed() -> None:
    assert decode([b"data: a\n\ndata: b\n"]) == ([msg("a")], SSEEnd(frames=[], truncated=True))


@pytest.mark.parametrize(("body", "data"), [
    (b'data: {"a": 1}\n', '{"a": 1}'), (b'data: {"a": 1}\r\n', '{"a": 1}'), (b'data: {"a": 1}\r', '{"a": 1}'),
    (b'data: {"a":\ndata: 1}\n', '{"a":\n1}'), (b'event: x\nid: 3\ndata: {"a": 1}\n', '{"a": 1}'),
    (b"data: 5\n", "5"),
])
def test_terminated_last_event_without_blank_line_is_dispatched_when_its_data_decodes(body: bytes, data: str) -> None:
    # PROVIDERS.md 1 (amended): a gateway that drops the final blank line.
    frames, end = decode(one_byte_reads(body))
    assert end.truncated is False
    assert [f.data for f in frames if isinstance(f, SSEFrame)] == [data]


def test_terminated_done_without_blank_line_is_dispatched() -> None:
    assert decode([b"data: [DONE]\n"]) == ([msg("[DONE]")], SSEEnd(frames=[msg("[DONE]")], truncated=False))


@pytest.mark.parametrize("body", [b'data: {"a":\n', b"data: [DONE] x\n", b"data: nope\n", b"event: x\n",
                                  b'data: {"a": 1}'])
def test_last_event_whose_data_does_not_decode_or_line_is_unterminated_is_cut(body: bytes) -> None:
    assert decode([body]) == ([], SSEEnd(frames=[], truncated=True))


def test_unfinished_line_at_eof_is_truncated() -> None:
    assert decode([b'data: a\n\ndata: {"x']) == ([msg("a")], SSEEnd(frames=[], truncated=True))
    assert decode([b": keep"]) == ([], SSEEnd(frames=[], truncated=True))


def test_dataless_field_pending_at_eof_is_truncated() -> None:
    assert decode([b"id: 4\n"])[1].truncated is True


def test_trailing_lone_cr_counts_as_line_end() -> None:
    assert decode([b"data: a\n\r"]) == ([msg("a")], SSEEnd(frames=[], truncated=False))
    assert decode([b": c\r"]) == ([], SSEEnd(frames=[], truncated=False))


def test_clean_end_is_not_truncated() -> None:
    assert decode([b""]) == ([], SSEEnd(frames=[], truncated=False))
    assert decode([b"data: a\r\n\r\n: bye\r\n"])[1].truncated is False


# --- size limits ----------------------------------------------------------------------


def test_frame_at_limit_passes() -> None:
    line = b"data:" + b"x" * 15  # a line of exactly 20 bytes, 15 bytes of data
    assert decode([line + b"\n\n"], max_frame_bytes=20)[0] == [msg("x" * 15)]
    two = b"data:" + b"x" * 10 + b"\ndata:" + b"y" * 9 + b"\n\n"  # 10 + 1 + 9 = 20 bytes of data
    assert decode([two], max_frame_bytes=20)[0] == [msg("x" * 10 + "\n" + "y" * 9)]
    multibyte = ("data:" + "é" * 7 + "x").encode()  # 5 + 14 + 1 = 20 bytes
    assert decode([multibyte + b"\n\n"], max_frame_bytes=20)[0] == [msg("é" * 7 + "x")]


def test_frame_over_limit_raises() -> None:
    with pytest.raises(FrameTooLargeError, match="max_frame_bytes=20"):
        decode([b"data:" + b"x" * 16 + b"\n\n"], max_frame_bytes=20)
    with pytest.raises(FrameTooLargeError, match="event data exceeds max_frame_bytes=20"):
        decode([b"data:" + b"x" * 10 + b"\ndata:" + b"y" * 10 + b"\n\n"], max_frame_bytes=20)
    with pytest.raises(FrameTooLargeError, match="max_frame_bytes=20"):
        decode([("data:" + "é" * 8).encode() + b"\n\n"], max_frame_bytes=20)


def test_unterminated_line_is_bounded_while_it_grows() -> None:
    decoder = SSEDecoder(max_frame_bytes=100)
    for _ in range(10):
        decoder.feed(b"d" * 10)  # 100 bytes pending: still allowed
    with pytest.raises(FrameTooLargeError, match="unterminated"):
        decoder.feed(b"d")


def test_frames_before_an_error_in_the_same_read_are_returned_first() -> None:
    decoder = SSEDecoder(max_frame_bytes=20)
    assert decoder.feed(b"data: a\n\ndata:" + b"x" * 30 + b"\n") == [msg("a")]
    with pytest.raises(FrameTooLargeError):
        decoder.close()


# --- raw unframed JSON (PROVIDERS.md 5.3) ------------------------------------------------


def test_unframed_error_json_mid_stream() -> None:
    body = (TRANSCRIPTS / "gemini_sse" / "unframed_error_json_mid_stream.sse").read_bytes()
    for pieces in ([body], one_byte_reads(body)):
        frames, end = decode(pieces)
        assert [type(f) for f in frames] == [SSEFrame, SSEFrame, JSONFrame]
        assert end.truncated is False
        error = frames[2]
        assert isinstance(error, JSONFrame)
        parsed = json.loads(error.text)
        assert isinstance(parsed, dict)
        assert "error" in parsed
        assert parsed["error"]["code"] == 503


def test_raw_json_closing_at_eof_without_newline_is_emitted_by_close() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: a\n\n{\n  "error": {"code": 500}\n}') == [msg("a")]
    assert decoder.close() == SSEEnd(frames=[JSONFrame(text='{\n  "error": {"code": 500}\n}')], truncated=False)


def test_raw_json_on_one_line_is_emitted_at_its_line_end() -> None:
    assert whole(b'{"error": {"code": 429}}\ndata: b\n\n') == [
        JSONFrame(text='{"error": {"code": 429}}'),
        msg("b"),
    ]


def test_raw_json_unclosed_at_eof_is_truncated() -> None:
    assert decode([b'data: a\n\n{\n  "error": {\n']) == (
        [msg("a")],
        SSEEnd(frames=[], truncated=True),
    )


def test_raw_json_braces_and_quotes_in_strings_not_counted() -> None:
    text = '{"m": "} \\" {{ ] \\\\",\n "n": {"k": "}"}}'
    assert whole(text.encode() + b"\n\n") == [JSONFrame(text=text)]


def test_raw_json_keeps_blank_lines_and_comments_inside() -> None:
    assert whole(b'{\n\n: x\n"a": 1}\n') == [JSONFrame(text='{\n\n: x\n"a": 1}')]


def test_brace_line_inside_an_event_is_an_ignored_field() -> None:
    assert whole(b'data: a\n{"error": 1}\n\n') == [msg("a")]
    assert whole(b'id: 3\n{"error": 1}\n\n') == []


def test_bytes_after_raw_json_on_its_closing_line_raise() -> None:
    with pytest.raises(UpstreamProtocolError, match="after a raw JSON object"):
        decode([b'{"a": 1} data: x\n'])


def test_raw_json_over_limit_raises() -> None:
    # 5 + 1 + 14 = 20 bytes: '{"a":', the joining LF, '"xxxxxxxxxxx"}'
    assert decode([b'{"a":\n"' + b"x" * 11 + b'"}\n'], max_frame_bytes=20)[0] == [
        JSONFrame(text='{"a":\n"' + "x" * 11 + '"}')
    ]
    with pytest.raises(FrameTooLargeError, match="raw JSON object exceeds max_frame_bytes=20"):
        decode([b'{"a":\n"' + b"x" * 12 + b'"}\n'], max_frame_bytes=20)


# --- bug cases (framing parts) ----------------------------------------------------------


def test_b01_utf8_character_split_across_reads() -> None:
    reads = [
        b'data: {"choices":[{"index":0,"delta":{"content":"cr\xc3',
        b"\xa8me \xf0\x9f",
        b'\xa6\x8a"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    frames, end = decode(reads)
    assert frames == [
        msg('{"choices":[{"index":0,"delta":{"content":"crème 🦊"}}]}'),
        msg('{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}'),
        msg("[DONE]"),
    ]
    assert end.truncated is False
    assert all("\ufffd" not in f.data for f in frames if isinstance(f, SSEFrame))


def test_b01_body_cut_inside_a_character_is_truncated() -> None:
    reads = [
        b'data: {"choices":[{"index":0,"delta":{"content":"cr"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"\xc3',
    ]
    assert decode(reads) == (
        [msg('{"choices":[{"index":0,"delta":{"content":"cr"}}]}')],
        SSEEnd(frames=[], truncated=True),
    )


def test_b04_dataless_blocks_dispatch_nothing() -> None:
    body = (
        b'id: 7\ndata: {"choices":[{"index":0,"delta":{"content":"Good"}}]}\n\n'
        b": keep-alive\n\nretry: 3000\n\nevent: ping\n\n"
        b'id: 8\ndata: {"choices":[{"index":0,"delta":{"content":" morning"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    expected = [
        msg('{"choices":[{"index":0,"delta":{"content":"Good"}}]}', id="7"),
        msg('{"choices":[{"index":0,"delta":{"content":" morning"}}]}', id="8"),
        msg('{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}', id="8"),
        msg("[DONE]", id="8"),
    ]
    assert decode([body]) == (expected, SSEEnd(frames=[], truncated=False))
    assert decode(one_byte_reads(body))[0] == expected


def test_b05_frames_only_after_the_read_that_ends_them() -> None:
    first = (
        '{"candidates":[{"content":{"role":"model","parts":[{"text":"Guten Tag",'
        '"thoughtSignature":"c2lnLUE5"}]},"index":0}]}'
    )
    second = (
        '{"candidates":[{"content":{"role":"model","parts":[{"text":"!"}]},'
        '"finishReason":"STOP","index":0}],'
        '"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":3,"totalTokenCount":8}}'
    )
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"candidates":[{"content":{"role":"model","parts":[{"text":"Gu') == []
    assert decoder.feed(b'ten Tag","thoughtSignature":"c2lnLUE5"}]},"index":0}]}\r\n') == []
    assert decoder.feed(b"\r\ndata: " + second.encode() + b"\r\n\r\n") == [msg(first), msg(second)]
    assert decoder.close() == SSEEnd(frames=[], truncated=False)


# --- chunking properties ----------------------------------------------------------------

_VALUE = st.text(alphabet=st.sampled_from(list('ab :{}[]"\\0129\x00éж\u2028\u0085\ufeff🦊\x0b')), max_size=12)
_FIELD_LINE = st.tuples(
    st.sampled_from(["data", "data", "data", "event", "id", "retry", "x", ":", ""]),
    st.sampled_from(["", ":", ": ", ": "]),
    _VALUE,
).map("".join)
_RAW_JSON = st.sampled_from(['{"error": {"code": 1}}', '{\n "m": "}{\\""\n}', "{", '  {"a": [1]}  '])
_TERMINATOR = st.sampled_from(["\n", "\r", "\r\n"])


@st.composite
def sse_texts(draw: st.DrawFn, raw_json: bool = True) -> bytes:
    """Events (field lines, then a blank line), sometimes a raw JSON block or a stray line."""
    lines: list[str] = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["event"] * 6 + ["raw", "stray"]))
        if kind == "raw" and raw_json:
            lines.append(draw(_RAW_JSON))
        elif kind == "stray":
            lines.append(draw(_FIELD_LINE))
        else:
            lines += [*draw(st.lists(_FIELD_LINE, min_size=1, max_size=4)), ""]
    return "".join(line + draw(_TERMINATOR) for line in lines).encode()


@st.composite
def body_and_cuts(draw: st.DrawFn, bodies: st.SearchStrategy[bytes]) -> tuple[bytes, list[int]]:
    body = draw(bodies)
    prefix = draw(st.sampled_from([b"", b"\xef\xbb\xbf"]))
    tail = draw(st.sampled_from([b"", b"data: cut", b"\r", b"\xf0\x9f"]))
    body = prefix + body + tail
    cuts = draw(st.lists(st.integers(0, len(body)), max_size=12))
    return body, cuts


@settings(max_examples=200, deadline=None)
@given(case=body_and_cuts(sse_texts()), limit=st.sampled_from([24, 80, 8 * 1024 * 1024]))
def test_any_split_of_generated_sse_gives_same_frames(case: tuple[bytes, list[int]], limit: int) -> None:
    body, cuts = case
    expected = outcome([body], limit)
    assert outcome(split_at(body, cuts), limit) == expected
    assert outcome(one_byte_reads(body), limit) == expected


@pytest.mark.parametrize("path", SSE_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_transcript_in_one_byte_reads_gives_same_frames(path: Path) -> None:
    body = path.read_bytes()
    assert decode(one_byte_reads(body)) == decode([body])


@settings(max_examples=200, deadline=None)
@given(data=st.data(), path=st.sampled_from(SSE_FILES))
def test_any_split_of_transcripts_gives_same_frames(data: st.DataObject, path: Path) -> None:
    body = path.read_bytes()
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=30))
    assert decode(split_at(body, cuts)) == decode([body])


# --- against a literal reading of the spec ------------------------------------------------


_FIRST_LINE = re.compile(rb":|[ \t]*\{|[A-Za-z0-9_.-]+:|(?:data|event|id|retry)\Z")
_FIRST_PREFIX = re.compile(rb":|[ \t]*\{|[A-Za-z0-9_.-]*(?::|\Z)")


def _first_line_refused(body: bytes) -> bool:
    """The oracle of the first-line check: the first non-empty line (or the unterminated rest)."""
    raw = body.removeprefix(b"\xef\xbb\xbf")
    *complete, tail = re.split(rb"\r\n|\r|\n", raw)
    line = next((x for x in complete if x), None)
    if line is not None:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            return True
        return _FIRST_LINE.match(line) is None
    if not tail or b"\xef\xbb\xbf".startswith(tail):
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(tail, final=False)
    except UnicodeDecodeError:
        return True
    return _FIRST_PREFIX.match(tail) is None


def _whole_json(data: list[str]) -> bool:
    text = "\n".join(data)
    if text == "[DONE]":
        return True
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def reference(body: bytes) -> tuple[list[Frame], object]:
    """WHATWG steps on the whole decoded body, no raw JSON mode, with the two amendments: the oracle.

    Returns the frames and ``truncated``, or ``UpstreamProtocolError`` when the first line is refused.
    """
    if _first_line_refused(body):
        return [], UpstreamProtocolError
    text = body.decode("utf-8", "replace").removeprefix("\ufeff")
    *lines, tail = re.split("\r\n|\r|\n", text)
    frames: list[Frame] = []
    data: list[str] = []
    event, last_id, retry, pending = "", "", None, False
    for line in lines:
        if not line:
            if data:
                frames.append(
                    SSEFrame(
                        event=event or "message",
                        data="\n".join(data),
                        id=last_id or None,
                        retry_ms=retry,
                    )
                )
            data, event, retry, pending = [], "", None, False
            continue
        if line.startswith(":"):
            continue
        pending = True
        name, colon, value = line.partition(":")
        value = value.removeprefix(" ") if colon else value
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id" and "\x00" not in value:
            last_id = value
        elif name == "retry" and value and len(value) <= 18 and all(c in "0123456789" for c in value):
            retry = int(value)
    if not tail and pending and data and _whole_json(data):
        frames.append(SSEFrame(event=event or "message", data="\n".join(data), id=last_id or None, retry_ms=retry))
        return frames, False
    return frames, bool(tail) or pending


_TOKENS = st.sampled_from(
    [
        b"data",
        b"data: ",
        b"\n\n",
        b"event",
        b"id",
        b"retry",
        b":",
        b" ",
        b"\r",
        b"\n",
        b"\r\n",
        b"x",
        b"7",
        b"\x00",
        b"\xef\xbb\xbf",
        b"\xc3",
        b"\xa8",
        b"\xf0\x9f\xa6\x8a",
        b"\xf0\x9f",
        b"\xff",
        b"\xe2\x80\xa8",
        b"\xc2\x85",
        b"\x0b",
        b"caf\xc3\xa9",
    ]
)
NO_BRACE_BODIES = st.one_of(
    sse_texts(raw_json=False).map(lambda b: b.replace(b"{", b"(")),
    st.lists(_TOKENS, max_size=40).map(b"".join),
    st.binary(max_size=200).map(lambda b: b.replace(b"{", b"(")),
)


@settings(max_examples=200, deadline=None)
@given(case=body_and_cuts(NO_BRACE_BODIES))
def test_matches_reference_reading_of_the_spec(case: tuple[bytes, list[int]]) -> None:
    body, cuts = case
    expected = reference(body)
    got = outcome(split_at(body, cuts))
    assert (got if expected[1] is not UpstreamProtocolError else ([], got[1])) == expected


# --- purity -------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["sse.py", "sse_lines.py", "jsonscan.py"])
def test_module_imports_no_io(module: str) -> None:
    tree = ast.parse((MODULES / module).read_text(encoding="utf-8"))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {n.split(".")[0] for n in names} & {"asyncio", "aiohttp", "redis", "opentelemetry"}
