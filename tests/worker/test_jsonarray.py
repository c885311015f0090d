"""JSON-array framing (worker.jsonarray, worker.jsonscan): elements, errors, chunking."""

from __future__ import annotations

import ast
import itertools
import json
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schema.errors import FrameTooLargeError, UpstreamProtocolError
from worker.frames import JSONFrame
from worker.jsonarray import ArrayEnd, JSONArrayDecoder
from worker.jsonscan import DepthScanner

TRANSCRIPTS = Path("/work/shared/cases/transcripts/gemini_json_array")
ARRAY_FILES = sorted(TRANSCRIPTS.glob("*.sse"))
MODULES = Path(__file__).resolve().parents[2] / "worker"
END_OK = ArrayEnd(frames=[], closed=True, truncated=False)


def decode(pieces: list[bytes], max_element_bytes: int = 8 * 1024 * 1024) -> tuple[list[str], ArrayEnd]:
    decoder = JSONArrayDecoder(max_element_bytes=max_element_bytes)
    frames = [frame for piece in pieces for frame in decoder.feed(piece)]
    end = decoder.close()
    return [f.text for f in frames + end.frames], end


def outcome(pieces: list[bytes], max_element_bytes: int = 8 * 1024 * 1024) -> tuple[list[str], object]:
    decoder = JSONArrayDecoder(max_element_bytes=max_element_bytes)
    texts: list[str] = []
    try:
        for piece in pieces:
            texts += [f.text for f in decoder.feed(piece)]
        end = decoder.close()
    except UpstreamProtocolError as exc:
        return texts, type(exc)
    return texts, end


def one_byte_reads(body: bytes) -> list[bytes]:
    return [body[i : i + 1] for i in range(len(body))]


def split_at(body: bytes, cuts: list[int]) -> list[bytes]:
    return [body[a:b] for a, b in itertools.pairwise([0, *sorted(cuts), len(body)])]


# --- elements -------------------------------------------------------------------------


def test_element_emitted_as_soon_as_its_closing_brace_arrives() -> None:
    decoder = JSONArrayDecoder()
    assert decoder.feed(b'[{"a": {"b": 1}') == []
    assert decoder.feed(b"}") == [JSONFrame(text='{"a": {"b": 1}}')]
    assert decoder.feed(b"\n,\r\n") == []
    assert decoder.feed(b'{"c": 2}\n]') == [JSONFrame(text='{"c": 2}')]
    assert decoder.close() == END_OK


def test_gemini_separators_and_whitespace_between_elements() -> None:
    assert decode([b' \r\n[ {"a":1}\n,\r\n{"b":2} , {"c":3}\n]\n\n']) == (
        ['{"a":1}', '{"b":2}', '{"c":3}'],
        END_OK,
    )


def test_braces_and_brackets_inside_strings_not_counted() -> None:
    element = '{"t": "} ] { [ , ]", "u": ["}"]}'
    assert decode([f"[{element}]".encode()]) == ([element], END_OK)


def test_escaped_quotes_and_backslashes_in_strings() -> None:
    element = r'{"a": "say \"}\" \\", "b": "\\\\", "c": "\\\" }"}'
    assert json.loads(element)
    assert decode([f"[{element}]".encode()]) == ([element], END_OK)


def test_escape_split_across_reads() -> None:
    body = rb'[{"a": "x\"}y"}, "\\"]'
    for cut in range(len(body) + 1):
        assert decode([body[:cut], body[cut:]]) == ([r'{"a": "x\"}y"}', r'"\\"'], END_OK)


def test_utf8_split_across_reads() -> None:
    body = '[{"t": "crème 🦊"}]'.encode()
    assert decode(one_byte_reads(body)) == (['{"t": "crème 🦊"}'], END_OK)


def test_invalid_utf8_in_element_becomes_replacement_character() -> None:
    assert decode([b'[{"t": "a\xff\xf0\x9f"}]']) == (['{"t": "a\ufffd\ufffd"}'], END_OK)


def test_leading_bom_and_whitespace_allowed() -> None:
    assert decode([b"\xef\xbb\xbf \n[1]"]) == (["1"], END_OK)
    assert decode([b"\xef", b"\xbb", b"\xbf", b"[1]"]) == (["1"], END_OK)


def test_any_json_value_is_an_element() -> None:
    body = b'[1, -2.5e3,true ,false,null, "s,]}", [1, [2]], {}, []]'
    assert decode([body]) == (["1", "-2.5e3", "true", "false", "null", '"s,]}"', "[1, [2]]", "{}", "[]"], END_OK)


# --- end of body ----------------------------------------------------------------------


def test_empty_array_is_closed_not_truncated() -> None:
    assert decode([b"[ ]"]) == ([], END_OK)


def test_empty_body_or_open_bracket_only_is_truncated() -> None:
    assert decode([b""])[1] == ArrayEnd(frames=[], closed=False, truncated=True)
    assert decode([b" [\n"])[1] == ArrayEnd(frames=[], closed=False, truncated=True)
    assert decode([b"\xef\xbb"])[1] == ArrayEnd(frames=[], closed=False, truncated=True)


def test_partial_element_at_eof_is_truncated() -> None:
    assert decode([b'[{"a":1}\n,\r\n{"b": "x']) == (['{"a":1}'], ArrayEnd(frames=[], closed=False, truncated=True))
    assert decode([b"[12"]) == ([], ArrayEnd(frames=[], closed=False, truncated=True))


def test_missing_closing_bracket_after_whole_element_is_not_closed() -> None:
    assert decode([b'[{"a":1}\n,\r\n']) == (['{"a":1}'], ArrayEnd(frames=[], closed=False, truncated=False))
    assert decode([b'[{"a":1}']) == (['{"a":1}'], ArrayEnd(frames=[], closed=False, truncated=False))


# --- malformed input --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "wanted"),
    [
        (b'{"a": 1}', "expected '\\['"),
        (b"data: [1]", "expected '\\['"),
        (b"[1 2]", "expected ',' or '\\]'"),
        (b'[{"a":1} x]', "expected ',' or '\\]'"),
        (b"[1,]", "expected a JSON value after ','"),
        (b"[,1]", "expected a JSON value after '\\['"),
        (b"[1,,2]", "expected a JSON value"),
        (b"[1] x", "expected nothing but whitespace after '\\]'"),
        (b"[1][2]", "expected nothing but whitespace"),
        (b"[:]", "expected a JSON value"),
    ],
)
def test_malformed_array_raises(body: bytes, wanted: str) -> None:
    with pytest.raises(UpstreamProtocolError, match=wanted):
        decode([body])


def test_whitespace_after_closing_bracket_is_fine() -> None:
    assert decode([b"[1]\r\n \t\n", b"  "]) == (["1"], END_OK)


def test_elements_before_an_error_in_the_same_read_are_returned_first() -> None:
    decoder = JSONArrayDecoder()
    assert decoder.feed(b'[{"a":1}, ?') == [JSONFrame(text='{"a":1}')]
    with pytest.raises(UpstreamProtocolError, match="a JSON value"):
        decoder.close()
    with pytest.raises(UpstreamProtocolError):
        decoder.feed(b"]")


def test_element_at_limit_passes() -> None:
    element = '{"t": "' + "é" * 5 + '"}'  # 7 + 10 + 2 = 19 bytes
    assert decode([f" [ {element} ,\n{element}]".encode()], max_element_bytes=19) == ([element, element], END_OK)


def test_element_over_limit_raises() -> None:
    element = '{"t": "' + "é" * 5 + 'x"}'  # 20 bytes
    with pytest.raises(FrameTooLargeError, match="max_element_bytes=19"):
        decode([f"[{element}]".encode()], max_element_bytes=19)


def test_partial_element_is_bounded_while_it_grows() -> None:
    decoder = JSONArrayDecoder(max_element_bytes=100)
    decoder.feed(b'["')
    for _ in range(33):
        decoder.feed(b"abc")  # 1 + 99 = 100 bytes pending: still allowed
    with pytest.raises(FrameTooLargeError):
        decoder.feed(b"d")


# --- transcripts --------------------------------------------------------------------------


def test_error_element_mid_array_transcript() -> None:
    texts, end = decode([(TRANSCRIPTS / "error_element_mid_array.sse").read_bytes()])
    assert end == END_OK
    assert len(texts) == 3
    assert json.loads(texts[2]) == {
        "error": {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
        }
    }
    assert all("candidates" in json.loads(t) for t in texts[:2])


def test_truncated_mid_element_transcript() -> None:
    texts, end = decode([(TRANSCRIPTS / "truncated_mid_element.sse").read_bytes()])
    assert [json.loads(t)["candidates"][0]["content"]["parts"][0]["text"] for t in texts] == [
        "Paso 1: abre",
        " la terminal.",
    ]
    assert end == ArrayEnd(frames=[], closed=False, truncated=True)


def test_function_call_nested_args_transcript() -> None:
    texts, end = decode([(TRANSCRIPTS / "function_call_nested_args.sse").read_bytes()])
    assert end == END_OK
    call = json.loads(texts[0])["candidates"][0]["content"]["parts"][0]["functionCall"]
    assert call["args"]["address"] == {"city": "Kraków", "street": "ul. Floriańska 3"}


@pytest.mark.parametrize("path", ARRAY_FILES, ids=lambda p: p.stem)
def test_transcript_in_one_byte_reads_gives_same_elements(path: Path) -> None:
    body = path.read_bytes()
    texts, end = decode([body])
    assert decode(one_byte_reads(body)) == (texts, end)
    assert all(isinstance(json.loads(t), dict) for t in texts)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), path=st.sampled_from(ARRAY_FILES))
def test_any_split_of_transcripts_gives_same_elements(data: st.DataObject, path: Path) -> None:
    body = path.read_bytes()
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=30))
    assert decode(split_at(body, cuts)) == decode([body])


# --- generated arrays -----------------------------------------------------------------------

_TRICKY_TEXT = st.text(alphabet=st.sampled_from(list('{}[]",:\\ \n\t/aé🦊\u2028\x00')), max_size=10)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _TRICKY_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_TRICKY_TEXT, children, max_size=4),
    max_leaves=12,
)
_SEPARATOR = st.sampled_from([",", "\n,\r\n", " , ", ",\n\n", "\t,"])


class ArrayCase(NamedTuple):
    body: bytes
    texts: list[str]
    """The element texts the body must yield."""
    end: ArrayEnd
    """What ``close()`` must report."""
    cuts: list[int]


@st.composite
def arrays(draw: st.DrawFn) -> ArrayCase:
    """A streamed array body with its expected elements and end, plus read boundaries."""
    values = draw(st.lists(JSON_VALUES, max_size=6))
    indent = draw(st.sampled_from([None, 2]))
    ascii_only = draw(st.booleans())
    texts = [json.dumps(v, indent=indent, ensure_ascii=ascii_only) for v in values]
    body = "[" + draw(st.sampled_from(["", "\n", " "]))
    for i, text in enumerate(texts):
        body += (draw(_SEPARATOR) if i else "") + text
    closing = draw(st.sampled_from(["]", "\n]", "\n]\n", ""]))
    body += closing
    truncated = not closing and not texts
    if not closing and texts and texts[-1][-1] not in '}]"':
        texts.pop()  # a number or literal at EOF may go on: not complete
        truncated = True
    raw = draw(st.sampled_from([b"", b"\xef\xbb\xbf"])) + body.encode()
    cuts = draw(st.lists(st.integers(0, len(raw)), max_size=15))
    end = ArrayEnd(frames=[], closed=bool(closing), truncated=truncated)
    return ArrayCase(raw, texts, end, cuts)


@settings(max_examples=200, deadline=None)
@given(case=arrays())
def test_generated_arrays_give_their_elements_in_any_split(case: ArrayCase) -> None:
    assert decode(split_at(case.body, case.cuts)) == (case.texts, case.end)
    assert decode(one_byte_reads(case.body)) == (case.texts, case.end)


@settings(max_examples=200, deadline=None)
@given(case=arrays(), cut=st.integers(0, 10_000), limit=st.sampled_from([8, 30, 8 * 1024 * 1024]))
def test_cut_generated_arrays_agree_in_any_split(case: ArrayCase, cut: int, limit: int) -> None:
    body = case.body[: cut % (len(case.body) + 1)]
    cuts = [c for c in case.cuts if c <= len(body)]
    expected = outcome([body], limit)
    assert outcome(split_at(body, cuts), limit) == expected
    assert outcome(one_byte_reads(body), limit) == expected


# --- the shared scanner ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "end"),
    [
        ('{"a": "}"} tail', 10),
        ("  [1, [2]], 3", 10),
        ('"a\\"b" x', 6),
        ("123,", 3),
        ("true]", 4),
        ("nul", -1),
        ('{"a": "\\', -1),
        ("", -1),
    ],
)
def test_depth_scanner_finds_the_end_of_one_value(text: str, end: int) -> None:
    scanner = DepthScanner()
    assert scanner.scan(text.encode()) == end


def test_depth_scanner_resumes_byte_by_byte() -> None:
    data = rb'{"k": ["\\\"}]", {"x": "\\"}], "z": 1}'
    scanner = DepthScanner()
    ends = [scanner.scan(data[i : i + 1]) for i in range(len(data))]
    assert ends == [-1] * (len(data) - 1) + [1]


def test_depth_scanner_needs_reset_after_a_value() -> None:
    scanner = DepthScanner()
    assert scanner.scan(b"{}") == 2
    with pytest.raises(RuntimeError, match="reset"):
        scanner.scan(b"{}")
    scanner.reset()
    assert scanner.scan(b"[]") == 2


@pytest.mark.parametrize("module", ["jsonarray.py", "jsonscan.py"])
def test_module_imports_no_io(module: str) -> None:
    tree = ast.parse((MODULES / module).read_text(encoding="utf-8"))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {n.split(".")[0] for n in names} & {"asyncio", "aiohttp", "redis", "opentelemetry"}
